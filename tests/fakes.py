"""Reusable test fakes: the policy and tokenizer stand-ins of jaxrag.fakes, and a term-overlap retriever.

They implement the same protocols as the real things (jaxrag.policy.Policy, jaxrag.retrieval.Retriever,
jaxrag.tokenizer.Tokenizer) so the rollout engine and the eval job can be tested without a model or index.
"""
from __future__ import annotations

import collections
import contextlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from jaxrag.fakes import (ByteTokenizer, LatencyPolicy, QueuePolicy, RandomTextPolicy,  # noqa: F401 (re-exported)
                          ScriptedPolicy, completion, cut_at_stop, tiny_jax_policy)
from jaxrag.paths import BENCHMARKS

BENCH = BENCHMARKS
CORPUS = BENCH / "corpus_multihop_contexts.jsonl"

_WORD = re.compile(r"\w+")


def _terms(text: str) -> list[str]:
    return [w for w in _WORD.findall(text.lower()) if len(w) > 2]


@dataclass
class Passage:
    doc_id: str
    title: str
    text: str


def load_passages(path: Path = CORPUS, limit: int | None = None) -> list[Passage]:
    out = []
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f):
            if limit is not None and i >= limit:
                break
            r = json.loads(line)
            out.append(Passage(r["id"], r["title"], r["contents"]))
    return out


class OverlapRetriever:
    """Pure-python term-overlap search (idf-weighted) over passages; Retriever protocol."""

    def __init__(self, passages: Sequence[Passage]):
        self.passages = list(passages)
        self.index: dict[str, list[int]] = collections.defaultdict(list)
        for i, p in enumerate(self.passages):
            for t in set(_terms(p.title + " " + p.text)):
                self.index[t].append(i)
        self.calls: list[tuple[list[str], int]] = []

    def search(self, queries, k):
        from jaxrag.env.mdp import Doc
        self.calls.append((list(queries), k))
        out = []
        n = len(self.passages)
        for q in queries:
            scores: dict[int, float] = collections.Counter()
            for t in set(_terms(q or "")):
                post = self.index.get(t, [])
                for i in post:
                    scores[i] += 1.0 / (1 + len(post) / n * 50)
            best = sorted(scores.items(), key=lambda x: (-x[1], x[0]))[:k]
            out.append([Doc(self.passages[i].doc_id, s, self.passages[i].title, self.passages[i].text) for i, s in best])
        return out


def bm25_over_corpus():
    """The real BM25 (bm25s backend) over the multihop contexts corpus."""
    from jaxrag.retrieval import build_bm25, load_corpus
    return build_bm25(load_corpus(CORPUS), backend="bm25s")


@contextlib.contextmanager
def loopback(handler):
    """An HTTP server on 127.0.0.1 (a free port) serving `handler` in threads; yields its OpenAI-style base URL."""
    import http.server
    import threading

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    srv.daemon_threads = True
    srv.handle_error = lambda *a: None   # a client that gave up (timeout tests) is not an error
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}/v1"
    finally:
        srv.shutdown()
        srv.server_close()
