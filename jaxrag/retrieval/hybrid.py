"""Reciprocal rank fusion of several retrievers, and a (query, k) cache in front of any retriever."""

from __future__ import annotations

import collections
import dataclasses
from typing import Sequence

from jaxrag.retrieval.base import Hit, Retriever

RRF_K = 60


def rrf(ranked_lists: Sequence[Sequence[Hit]], k: int, rrf_k: int = RRF_K, depth: int | None = None) -> list[Hit]:
    """Fuse hit lists: score(d) = sum over lists of 1 / (rrf_k + rank), rank from 1, each list cut at `depth`.
    Ties keep the order of first appearance."""
    fused: dict[str, float] = {}
    first: dict[str, Hit] = {}
    for hits in ranked_lists:
        for rank, h in enumerate(hits[:depth] if depth is not None else hits, start=1):
            fused[h.doc_id] = fused.get(h.doc_id, 0.0) + 1.0 / (rrf_k + rank)
            first.setdefault(h.doc_id, h)
    best = sorted(fused, key=lambda d: -fused[d])[:k]  # sorted() is stable: ties stay in first-seen order
    return [Hit(d, fused[d], first[d].title, first[d].text) for d in best]


@dataclasses.dataclass
class HybridRetriever:
    """Each retriever is asked for max(depth, k) hits and its list is cut there (RAG-Gym's released IR: k 32, each
    list max(2k, 100) = 100 deep, rrf_k 60); the lists are fused with RRF (1 / (rrf_k + rank)) and cut to k."""

    retrievers: Sequence[Retriever]
    depth: int = 20  # best R@10 on the multihop dev sets among 10/20/50/100 (benchmarks.retrieval)
    rrf_k: int = RRF_K

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        depth = max(self.depth, k)
        per_retriever = [r.search(queries, depth) for r in self.retrievers]
        return [rrf([lists[i] for lists in per_retriever], k, self.rrf_k, depth) for i in range(len(queries))]


@dataclasses.dataclass
class CachedRetriever:
    """LRU cache keyed on (query, k); only the misses of a batch reach the inner retriever (once each)."""

    inner: Retriever
    max_entries: int = 100_000
    hits: int = 0
    misses: int = 0
    _cache: collections.OrderedDict = dataclasses.field(default_factory=collections.OrderedDict)

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        missing = list(dict.fromkeys(q for q in queries if (q, k) not in self._cache))
        if missing:
            for q, found in zip(missing, self.inner.search(missing, k)):
                self._cache[(q, k)] = found
            while len(self._cache) > self.max_entries:
                self._cache.popitem(last=False)
        out = []
        for q in queries:
            found = self._cache[(q, k)]
            self._cache.move_to_end((q, k))
            out.append(list(found))
        self.misses += len(missing)
        self.hits += len(queries) - len(missing)
        return out
