"""The bm25s index (bm25.Bm25sScorer's files: Lucene-style BM25, k1 0.9, b 0.4) built from a passage stream,
for corpora too large for `bm25s.BM25.index`, which holds every passage's tokens as Python lists.

Pass 1 analyzes `chunk` passages at a time (in `workers` processes when > 1: each returns its chunk's term
counts as arrays), keeps the vocabulary, each passage's length and each term's document frequency, and spills
each chunk's (term, tf) pairs to disk. Pass 2
reads the chunks back, scores them with bm25s's "lucene" formulas (the same float64 operations, so the same
float32 scores), and places them in the CSC arrays. What stays in memory: the vocabulary, the lengths (4 bytes a
passage) and the finished score matrix (8 bytes a nonzero: about 50 a passage of 100 words), which bm25s loads
whole at search time anyway.
"""

from __future__ import annotations

import itertools
import math
import multiprocessing
import shutil
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np

from jaxrag.retrieval.bm25 import B, K1, analyze
from jaxrag.retrieval.corpus import Passage


def analyze_chunk(texts: list[str]) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Analyze passages -> (the chunk's own vocabulary in first-seen order, then per distinct (passage, term),
    passage-major: its local term id and tf; terms per passage; tokens per passage). Runs in a worker process:
    what it returns pickles as arrays, not as token strings."""
    docs = [analyze(t) for t in texts]
    lengths = np.array([len(d) for d in docs], np.int64)
    local: dict[str, int] = {}
    ids = np.fromiter((local.setdefault(t, len(local)) for d in docs for t in d), np.int64, int(lengths.sum()))
    doc = np.repeat(np.arange(len(docs), dtype=np.int64), lengths)
    keys, tf = np.unique((doc << 32) | ids, return_counts=True)
    n_terms = np.bincount(keys >> 32, minlength=len(docs))
    return list(local), (keys & 0xFFFFFFFF).astype(np.int32), tf.astype(np.int32), n_terms, lengths.astype(np.int32)


def _analyzed(passages: Iterable[Passage], chunk: int, workers: int) -> Iterator[tuple]:
    """analyze_chunk's output, `chunk` passages at a time, in corpus order."""
    it = iter(passages)
    texts = iter(lambda: [p.full_text() for p in itertools.islice(it, chunk)], [])
    if workers <= 1:
        yield from map(analyze_chunk, texts)
        return

    # spawn, not fork: the parent may already run JAX's threads
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        yield from pool.imap(analyze_chunk, texts)


def _scores(terms, tf, n_terms, lengths, avgdl: float, idf: np.ndarray) -> np.ndarray:
    """bm25s "lucene": idf * tf / (tf + k1 (1 - b + b len / avgdl)), in bm25s's operation order (float64)."""
    dl = np.repeat(lengths.astype(np.float64), n_terms)
    tf = tf.astype(np.float64)
    return (idf[terms].astype(np.float64) * (tf / (K1 * ((1 - B) + B * dl / avgdl) + tf))).astype(np.float32)


def build_bm25s_streamed(
    passages: Iterable[Passage], out_dir: str | Path, chunk: int = 100_000, workers: int = 1, bar=None
) -> dict:
    """Write a bm25s index of `passages` to `out_dir` (through `out_dir`.tmp, renamed when complete).
    Returns {"n_passages", "n_terms", "nnz"}. `bar`: a tqdm bar advanced per passage analyzed."""
    import bm25s

    out_dir = Path(out_dir)
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "parts").mkdir(parents=True)
    vocab: dict[str, int] = {}
    lengths, df = [], np.zeros(0, np.int64)
    n_chunks = 0
    for local_vocab, local_terms, tf, n_terms, chunk_lengths in _analyzed(passages, chunk, workers):
        to_global = np.array([vocab.setdefault(t, len(vocab)) for t in local_vocab], np.int32)
        terms = to_global[local_terms]  # first-seen order chunk after chunk = first-seen order in the corpus
        np.savez(tmp / "parts" / f"{n_chunks:05d}.npz", terms=terms, tf=tf, n_terms=n_terms)
        df = np.pad(df, (0, len(vocab) - len(df))) + np.bincount(terms, minlength=len(vocab))
        lengths.append(chunk_lengths)
        n_chunks += 1
        if bar is not None:
            bar.update(len(chunk_lengths))
    lengths = np.concatenate(lengths)
    n = len(lengths)
    avgdl = lengths.astype(np.int64).mean()
    idf = np.array([math.log(1 + (n - d + 0.5) / (d + 0.5)) for d in df.tolist()], np.float32)
    indptr = np.zeros(len(vocab) + 1, np.int64)
    np.cumsum(df, out=indptr[1:])
    data, indices = np.empty(indptr[-1], np.float32), np.empty(indptr[-1], np.int32)
    heads, first_doc = indptr[:-1].copy(), 0
    for i in range(n_chunks):
        part = np.load(tmp / "parts" / f"{i:05d}.npz")
        terms, n_terms = part["terms"], part["n_terms"]
        doc_lengths = lengths[first_doc : first_doc + len(n_terms)]
        scores = _scores(terms, part["tf"], n_terms, doc_lengths, avgdl, idf)
        docs = np.repeat(np.arange(first_doc, first_doc + len(n_terms), dtype=np.int32), n_terms)
        order = np.argsort(terms, kind="stable")  # by term, passages ascending within a term (CSC order)
        t = terms[order]
        uniq, start, count = np.unique(t, return_index=True, return_counts=True)
        pos = heads[t] + (np.arange(len(t)) - np.repeat(start, count))
        data[pos], indices[pos] = scores[order], docs[order]
        heads[uniq] += count
        first_doc += len(n_terms)
    shutil.rmtree(tmp / "parts")
    if "" not in vocab:  # as bm25s.BM25.index(create_empty_token=True)
        vocab[""] = len(vocab)
    model = bm25s.BM25(k1=K1, b=B, method="lucene", backend="numba")
    model.scores = {"data": data, "indices": indices, "indptr": indptr, "num_docs": n}
    model.vocab_dict = vocab
    model.nonoccurrence_array = None  # set by BM25.index; only BM25L/BM25+ use it
    model.save(str(tmp), show_progress=False)
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.replace(out_dir)
    return {"n_passages": n, "n_terms": len(vocab), "nnz": int(indptr[-1])}
