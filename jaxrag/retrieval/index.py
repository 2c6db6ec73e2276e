"""On-disk index directory (written by build.py) and load_retriever.

<index_dir>/manifest.json   {"corpus", "n_passages", "bm25": [backends], "dense": bool}
<index_dir>/corpus.jsonl    normalized passages (id, title, text): what hits carry
<index_dir>/bm25s/ | lucene/ | dense/
"""

from __future__ import annotations

import json
from pathlib import Path

from jaxrag.retrieval.base import RetrievalIndexError, Retriever, require_file
from jaxrag.retrieval.bm25 import BACKENDS, load_bm25
from jaxrag.retrieval.corpus import CorpusError, Passage, load_corpus
from jaxrag.retrieval.hybrid import CachedRetriever, HybridRetriever

MANIFEST = "manifest.json"
KINDS = ("bm25", "dense", "hybrid")


def read_manifest(index_dir: Path) -> dict:
    if not index_dir.is_dir():
        raise RetrievalIndexError(f"index directory not found: {index_dir}")
    path = require_file(index_dir / MANIFEST, "index manifest")
    try:
        manifest = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise RetrievalIndexError(f"corrupt index manifest {path}: {e.msg} (line {e.lineno})") from None
    for key in ("n_passages", "bm25", "dense"):
        if key not in manifest:
            raise RetrievalIndexError(f"corrupt index manifest {path}: missing key {key!r}")
    return manifest


def load_passages(index_dir: Path, manifest: dict) -> list[Passage]:
    path = require_file(index_dir / "corpus.jsonl", "index corpus")
    try:
        passages = load_corpus(path)
    except CorpusError as e:
        raise RetrievalIndexError(f"corrupt index corpus: {e}") from None
    if len(passages) != manifest["n_passages"]:
        raise RetrievalIndexError(
            f"corrupt index corpus {path}: {len(passages)} passages, manifest says {manifest['n_passages']}"
        )
    return passages


def load_retriever(
    index_dir: str | Path,
    kind: str = "bm25",
    backend: str = "bm25s",
    *,
    encoder=None,
    encoder_path: str | Path | None = None,
    query_encoder_path: str | Path | None = None,
    depth: int = 20,
    rrf_k: int = 60,
    cache_size: int = 100_000,
) -> Retriever:
    """A cached Retriever over a built index. kind: "bm25" | "dense" | "hybrid" (RRF of BM25 `backend` and dense,
    each list cut at `depth`). `encoder`: a dense.TextEncoder to encode queries with (default: the one recorded at
    build); `encoder_path` / `query_encoder_path`: the recorded document / query encoder's directory moved there
    (dense.load_dense)."""
    if kind not in KINDS:
        raise ValueError(f"unknown retriever kind {kind!r}; choose one of {KINDS}")
    if kind != "dense" and backend not in BACKENDS:
        raise ValueError(f"unknown BM25 backend {backend!r}; choose one of {BACKENDS}")
    index_dir = Path(index_dir)
    manifest = read_manifest(index_dir)
    passages = load_passages(index_dir, manifest)
    parts = []
    if kind in ("bm25", "hybrid"):
        if backend not in manifest["bm25"]:
            raise RetrievalIndexError(f"{index_dir} has no {backend} BM25 index (built: {manifest['bm25']})")
        parts.append(load_bm25(index_dir / backend, passages, backend))
    if kind in ("dense", "hybrid"):
        if not manifest["dense"]:
            raise RetrievalIndexError(f"{index_dir} has no dense index (built with --no-dense)")
        from jaxrag.retrieval.dense import load_dense  # JAX: loaded by dense retrieval only

        parts.append(load_dense(index_dir / "dense", passages, encoder, encoder_path=encoder_path,
                                query_encoder_path=query_encoder_path))
    inner = parts[0] if len(parts) == 1 else HybridRetriever(parts, depth=depth, rrf_k=rrf_k)
    return CachedRetriever(inner, max_entries=cache_size)
