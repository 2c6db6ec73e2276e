"""Maximum inner product search over unit vectors: exact (numpy matmul + top-k) for small corpora, ScaNN
(tree + asymmetric hashing + exact reorder) for large ones. Both save beside embeddings.npy and reload."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np

from jaxrag.retrieval.base import RetrievalIndexError, require_file


@dataclasses.dataclass(frozen=True)
class AnnConfig:
    kind: str = "auto"  # "auto" | "exact" | "scann"
    exact_below: int = 20_000  # auto: exact search when the corpus has fewer passages
    num_leaves: int | None = None  # default ~3 sqrt(N)
    leaves_to_search: int | None = None  # default num_leaves / 10
    training_sample_size: int | None = None  # default min(N, 100k)
    dims_per_block: int = 2
    anisotropic_threshold: float = 0.2
    reorder: int = 100


def top_k(scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """scores[B,N] -> (indices[B,k], scores[B,k]) best first."""
    k = min(k, scores.shape[1])
    part = np.argpartition(-scores, k - 1, axis=1)[:, :k]
    part_scores = np.take_along_axis(scores, part, axis=1)
    order = np.argsort(-part_scores, axis=1, kind="stable")
    return np.take_along_axis(part, order, axis=1), np.take_along_axis(part_scores, order, axis=1)


@dataclasses.dataclass
class ExactIndex:
    emb: np.ndarray  # [N,D] float32
    chunk: int = 256

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        parts = [top_k(queries[s : s + self.chunk] @ self.emb.T, k) for s in range(0, len(queries), self.chunk)]
        return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])

    def save(self, out_dir: Path) -> None:
        pass  # embeddings.npy is the index

    def describe(self) -> dict:
        return {"kind": "exact"}


@dataclasses.dataclass
class ScannIndex:
    searcher: object
    params: dict

    @classmethod
    def build(cls, emb: np.ndarray, cfg: AnnConfig) -> "ScannIndex":
        import scann

        n = emb.shape[0]
        leaves = cfg.num_leaves or max(2, min(n // 10, int(3 * math.sqrt(n))))
        search = cfg.leaves_to_search or max(1, leaves // 10)
        sample = cfg.training_sample_size or min(n, 100_000)
        searcher = (
            scann.scann_ops_pybind.builder(emb, 10, "dot_product")
            .tree(num_leaves=leaves, num_leaves_to_search=search, training_sample_size=sample)
            .score_ah(cfg.dims_per_block, anisotropic_quantization_threshold=cfg.anisotropic_threshold)
            .reorder(cfg.reorder)
            .build()
        )
        params = {
            "kind": "scann",
            "num_leaves": leaves,
            "leaves_to_search": search,
            "training_sample_size": sample,
            "dims_per_block": cfg.dims_per_block,
            "anisotropic_threshold": cfg.anisotropic_threshold,
            "reorder": cfg.reorder,
        }
        return cls(searcher, params)

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        idx, scores = self.searcher.search_batched(np.ascontiguousarray(queries, np.float32), final_num_neighbors=k)
        return np.asarray(idx), np.asarray(scores)

    def save(self, out_dir: Path) -> None:
        d = Path(out_dir) / "scann"
        d.mkdir(parents=True, exist_ok=True)
        self.searcher.serialize(str(d))

    def describe(self) -> dict:
        return dict(self.params)


def build_ann(emb: np.ndarray, cfg: AnnConfig = AnnConfig()):
    if cfg.kind not in ("auto", "exact", "scann"):
        raise ValueError(f"AnnConfig.kind must be 'auto', 'exact' or 'scann', got {cfg.kind!r}")
    use_scann = cfg.kind == "scann" or (cfg.kind == "auto" and emb.shape[0] >= cfg.exact_below)
    return ScannIndex.build(emb, cfg) if use_scann else ExactIndex(np.ascontiguousarray(emb, np.float32))


def load_ann(index_dir: Path, emb: np.ndarray, described: dict):
    if described.get("kind") == "exact":
        return ExactIndex(np.ascontiguousarray(emb, np.float32))
    if described.get("kind") == "scann":
        import scann

        d = require_file(Path(index_dir) / "scann", "ScaNN index")
        try:
            return ScannIndex(scann.scann_ops_pybind.load_searcher(str(d)), described)
        except Exception as e:
            raise RetrievalIndexError(f"corrupt ScaNN index at {d}: {e}") from e
    raise RetrievalIndexError(f"{index_dir}/meta.json: unknown ann kind {described.get('kind')!r}")
