"""BM25 with two backends, both Lucene-parameterized (k1=0.9, b=0.4, Porter stemming, Lucene English stopwords):

- "lucene": Anserini's SimpleIndexer/SimpleSearcher from the pyserini jar, through jnius (see lucene_jvm.py).
- "bm25s": bm25s with the numba backend and a Python analyzer that mimics Lucene's DefaultEnglishAnalyzer.
"""

from __future__ import annotations

import functools
import itertools
import json
import logging
import re
import tempfile
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from jaxrag.retrieval.base import RetrievalIndexError, ScorerRetriever, require_file
from jaxrag.retrieval.corpus import Passage, check_unique
from jaxrag.retrieval.lucene_jvm import autoclass

log = logging.getLogger(__name__)

K1, B = 0.9, 0.4
BACKENDS = ("bm25s", "lucene")
DEFAULT_BACKEND = "bm25s"
MAX_QUERY_WORDS = 512  # Lucene's BooleanQuery allows 1024 clauses; longer queries are truncated (and logged)

# org.apache.lucene.analysis.en.EnglishAnalyzer.ENGLISH_STOP_WORDS_SET
LUCENE_STOPWORDS = frozenset(
    "a an and are as at be but by for if in into is it no not of on or such that the their then there these "
    "they this to was will with".split()
)
# Words joined by . ' ’ (UAX#29 MidNumLet) and digit groups joined by a comma stay one token, as in Lucene.
_TOKEN = re.compile(r"\w+(?:(?:[.'’]|(?<=\d),(?=\d))\w+)*")


@functools.lru_cache(maxsize=1)
def _bm25s():
    """bm25s, with its numba retrieval kernels cached on disk (numba's own cache, beside bm25s or in
    NUMBA_CACHE_DIR): the kernels take ~7 s to compile, once per process otherwise (each pipeline run, each test
    process, each resumed run). The same machine code either way; a bm25s without these names is left as it is."""
    import bm25s

    try:
        from bm25s.numba import retrieve_utils
    except ImportError:   # bm25s without numba: its numpy backend (nothing to cache)
        return bm25s
    for name in ("_retrieve_internal_jitted_serial", "_retrieve_internal_jitted_parallel"):
        kernel = getattr(retrieve_utils, name, None)
        if kernel is not None and hasattr(kernel, "enable_caching"):
            kernel.enable_caching()
    return bm25s


@functools.lru_cache(maxsize=1)
def _stemmer():
    import Stemmer

    return Stemmer.Stemmer("porter")


def analyze(text: str) -> list[str]:
    """Lucene-like: tokenize, drop possessive 's, lowercase, drop stopwords, Porter-stem."""
    words = []
    for w in _TOKEN.findall(text.lower()):
        if w.endswith(("'s", "’s")):
            w = w[:-2]
        if w and w not in LUCENE_STOPWORDS:
            words.append(w)
    return _stemmer().stemWords(words)


def _truncate(queries: list[str]) -> list[str]:
    out = []
    for q in queries:
        words = q.split()
        if len(words) > MAX_QUERY_WORDS:
            log.warning("BM25 query of %d words truncated to %d", len(words), MAX_QUERY_WORDS)
            q = " ".join(words[:MAX_QUERY_WORDS])
        out.append(q)
    return out


class Bm25sScorer:
    def __init__(self, model, threads: int = 0):
        self.model = model
        self.threads = threads
        self.vocab = model.vocab_dict

    @classmethod
    def build(cls, passages: Sequence[Passage], show_progress: bool = False) -> "Bm25sScorer":
        model = _bm25s().BM25(k1=K1, b=B, method="lucene", backend="numba")
        tokens = [analyze(p.full_text()) for p in passages]
        # the vocabulary in sorted order: bm25s numbers it in set order, which follows the process's string hashing
        # (PYTHONHASHSEED), so two builds of one corpus wrote other index files (same scores)
        vocab = {t: i for i, t in enumerate(sorted({t for doc in tokens for t in doc}))}
        model.index(([[vocab[t] for t in doc] for doc in tokens], vocab), show_progress=show_progress)
        return cls(model)

    def save(self, out_dir: Path) -> None:
        self.model.save(str(out_dir), show_progress=False)

    @classmethod
    def load(cls, index_dir: Path) -> "Bm25sScorer":
        require_file(index_dir / "params.index.json", "bm25s index")
        try:
            model = _bm25s().BM25.load(str(index_dir), backend="numba", mmap=False, show_progress=False)
        except Exception as e:
            raise RetrievalIndexError(f"corrupt bm25s index at {index_dir}: {e}") from e
        return cls(model)

    def search_ids(self, queries: list[str], k: int) -> list[list[tuple[int, float]]]:
        ids = [[self.vocab[t] for t in analyze(q) if t in self.vocab] for q in _truncate(queries)]
        live = [i for i, q in enumerate(ids) if q]
        out: list[list[tuple[int, float]]] = [[] for _ in queries]
        if not live:
            return out
        docs, scores = self.model.retrieve([ids[i] for i in live], k=k, show_progress=False, n_threads=self.threads)
        for i, d_row, s_row in zip(live, np.asarray(docs), np.asarray(scores)):
            out[i] = [(int(d), float(s)) for d, s in zip(d_row, s_row) if s > 0]
        return out


def _java_list(items):
    jlist = autoclass("java.util.ArrayList")()
    for x in items:
        jlist.add(x)
    return jlist


class LuceneScorer:
    def __init__(self, index_dir: Path, id_to_index: dict[str, int], threads: int = 2):
        require_file(index_dir, "Lucene index")
        try:
            self.searcher = autoclass("io.anserini.search.SimpleSearcher")(str(index_dir))
        except Exception as e:
            raise RetrievalIndexError(f"corrupt Lucene index at {index_dir}: {e}") from e
        self.searcher.set_bm25(K1, B)
        self.id_to_index = id_to_index
        self.threads = threads

    @staticmethod
    def build(passages: Iterable[Passage], out_dir: Path, threads: int = 2, batch: int = 10_000) -> None:
        """Index passages (any iterable: a stream is read `batch` passages at a time)."""
        indexer = autoclass("io.anserini.index.SimpleIndexer")(str(out_dir), False, threads)
        passages = iter(passages)
        while chunk := list(itertools.islice(passages, batch)):
            indexer.addRawDocuments([json.dumps({"id": p.doc_id, "contents": p.full_text()}) for p in chunk])
        indexer.close()

    def search_ids(self, queries: list[str], k: int) -> list[list[tuple[int, float]]]:
        qids = [str(i) for i in range(len(queries))]
        results = self.searcher.batch_search(_java_list(_truncate(queries)), _java_list(qids), int(k), self.threads)
        out = []
        for qid in qids:
            out.append([(self.id_to_index[h.docid], float(h.score)) for h in results.get(qid)])
        return out


def build_bm25(
    passages: Sequence[Passage], backend: str = DEFAULT_BACKEND, out_dir: str | Path | None = None
) -> ScorerRetriever:
    """BM25 retriever over in-memory passages (seconds for small corpora). Lucene needs a directory: a
    temporary one when `out_dir` is None; bm25s is saved to `out_dir` when given."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown BM25 backend {backend!r}; choose one of {BACKENDS}")
    passages = check_unique(passages)
    if not passages:
        raise ValueError("build_bm25: no passages")
    if backend == "bm25s":
        scorer = Bm25sScorer.build(passages)
        if out_dir is not None:
            Path(out_dir).mkdir(parents=True, exist_ok=True)
            scorer.save(Path(out_dir))
        return ScorerRetriever(scorer, passages)
    out_dir = Path(out_dir) if out_dir is not None else Path(tempfile.mkdtemp(prefix="jaxrag_lucene_"))
    LuceneScorer.build(passages, out_dir)
    return ScorerRetriever(LuceneScorer(out_dir, {p.doc_id: i for i, p in enumerate(passages)}), passages)


def load_bm25(index_dir: Path, passages: Sequence[Passage], backend: str) -> ScorerRetriever:
    if backend == "bm25s":
        return ScorerRetriever(Bm25sScorer.load(index_dir), passages)
    if backend == "lucene":
        return ScorerRetriever(LuceneScorer(index_dir, {p.doc_id: i for i, p in enumerate(passages)}), passages)
    raise ValueError(f"unknown BM25 backend {backend!r}; choose one of {BACKENDS}")
