"""Retrieval: corpus reader, BM25 (lucene | bm25s), dense (JAX encoder + ScaNN/exact), RRF hybrid, cache.

Importing this package pulls neither PyTorch nor the JVM nor JAX; backends load on first use.
"""

from jaxrag.retrieval.base import Hit, RetrievalIndexError, Retriever
from jaxrag.retrieval.bm25 import build_bm25
from jaxrag.retrieval.corpus import CorpusError, Passage, iter_corpus, load_corpus
from jaxrag.retrieval.hybrid import CachedRetriever, HybridRetriever, rrf
from jaxrag.retrieval.index import load_retriever

__all__ = [
    "Hit",
    "Retriever",
    "Passage",
    "CorpusError",
    "RetrievalIndexError",
    "build_bm25",
    "load_retriever",
    "iter_corpus",
    "load_corpus",
    "rrf",
    "HybridRetriever",
    "CachedRetriever",
]
