"""Build every index for a corpus:

  python -m jaxrag.retrieval.build --corpus corpus.jsonl --out DIR [--bm25 bm25s,lucene] [--no-dense]
      [--encoder HF_DIR] [--max-len 256] [--batch-size 128] [--ann auto|exact|scann] [--max-passages N]
      [--query-encoder HF_DIR --query-max-len 64] [--pooling cls|mean] [--no-normalize] [--pair-input]

Two encoders (MedCPT): --encoder embeds the documents, --query-encoder the queries (both recorded in dense/meta.json);
--pair-input feeds documents as the tokenizer text pair (title, text); --pooling and --no-normalize apply to both.

Writes the layout described in index.py; progress on stderr, timings in DIR/build_metrics.jsonl.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

from jaxrag.retrieval.ann import AnnConfig
from jaxrag.retrieval.bm25 import BACKENDS, Bm25sScorer, LuceneScorer
from jaxrag.retrieval.corpus import load_corpus, write_corpus
from jaxrag.retrieval.dense import build_dense, load_encoders
from jaxrag.retrieval.index import MANIFEST

log = logging.getLogger("jaxrag.retrieval.build")


def build_all(
    corpus: str | Path,
    out: str | Path,
    bm25: tuple[str, ...] = BACKENDS,
    dense: bool = True,
    encoder_path: str | None = None,
    max_len: int = 256,
    batch_size: int = 128,
    ann: AnnConfig = AnnConfig(),
    max_passages: int | None = None,
    query_encoder_path: str | None = None,
    query_max_len: int = 64,
    pooling: str | None = None,
    normalize: bool = True,
    pair_input: bool = False,
) -> dict:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    metrics = out / "build_metrics.jsonl"
    metrics.write_text("")

    def record(step: str, t0: float, **extra) -> None:
        row = {"step": step, "seconds": round(time.perf_counter() - t0, 3), **extra}
        log.info("%s", row)
        with metrics.open("a") as f:
            f.write(json.dumps(row) + "\n")

    t0 = time.perf_counter()
    passages = load_corpus(corpus, max_passages)
    write_corpus(passages, out / "corpus.jsonl")
    record("corpus", t0, n_passages=len(passages))
    for backend in bm25:
        if backend not in BACKENDS:
            raise ValueError(f"unknown BM25 backend {backend!r}; choose from {BACKENDS}")
        t0 = time.perf_counter()
        (out / backend).mkdir(exist_ok=True)
        if backend == "bm25s":
            Bm25sScorer.build(passages, show_progress=True).save(out / backend)
        else:
            LuceneScorer.build(passages, out / backend)
        record(f"bm25_{backend}", t0)
    if dense:
        t0 = time.perf_counter()
        encoder, query_encoder = load_encoders(encoder_path, max_len, batch_size, query_encoder_path, query_max_len,
                                               pooling, normalize, pair_input)
        build_dense(passages, encoder, out / "dense", ann, query_encoder=query_encoder)
        record("dense", t0, passages_per_s=round(len(passages) / (time.perf_counter() - t0), 1))
    manifest = {"corpus": str(Path(corpus).resolve()), "n_passages": len(passages), "bm25": list(bm25), "dense": dense}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2))  # written last: its presence marks a full build
    return manifest


def add_encoder_args(p: argparse.ArgumentParser) -> None:
    """The two-encoder options build and prepare share."""
    p.add_argument("--query-encoder", default=None, help="local HF dir of a separate query encoder (MedCPT)")
    p.add_argument("--query-max-len", type=int, default=64, help="query encoder's max tokens (MedCPT: 64)")
    p.add_argument("--pooling", default=None, choices=["cls", "mean"], help="default: from the encoder dir")
    p.add_argument("--no-normalize", action="store_true", help="raw pooled vectors (MedCPT), not unit length")
    p.add_argument("--pair-input", action="store_true", help="documents as the text pair (title, text) (MedCPT)")


def encoder_kwargs(a: argparse.Namespace) -> dict:
    return {"query_encoder_path": a.query_encoder, "query_max_len": a.query_max_len, "pooling": a.pooling,
            "normalize": not a.no_normalize, "pair_input": a.pair_input}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--bm25", default=",".join(BACKENDS), help="comma-separated backends (empty for none)")
    p.add_argument("--no-dense", action="store_true")
    p.add_argument("--encoder", default=None, help="local HF encoder dir (default: all-MiniLM-L6-v2 wheel)")
    p.add_argument("--max-len", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--ann", default="auto", choices=["auto", "exact", "scann"])
    p.add_argument("--max-passages", type=int, default=None)
    add_encoder_args(p)
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    manifest = build_all(
        a.corpus,
        a.out,
        tuple(b for b in a.bm25.split(",") if b),
        not a.no_dense,
        a.encoder,
        a.max_len,
        a.batch_size,
        AnnConfig(kind=a.ann),
        a.max_passages,
        **encoder_kwargs(a),
    )
    print(json.dumps(manifest))


if __name__ == "__main__":
    main()
