import json
import logging
import math
import os

import numpy as np
import pytest

from jaxrag.paths import SAMPLE
from jaxrag.retrieval import Hit, build_bm25
from jaxrag.retrieval.bm25 import K1, B, analyze
from jaxrag.retrieval.corpus import Passage, load_corpus

BENCH = SAMPLE
TOY = [
    Passage("d0", "Cats", "The cat sat on the mat with another cat."),
    Passage("d1", "Dogs", "Dogs are running fast in the park."),
    Passage("d2", "Pets", "A cat and a dog live together."),
    Passage("d3", "Physics", "Quantum physics describes tiny particles and waves."),
    Passage("d4", "Parks", "The city park has trees, dogs and a running track."),
]


def reference_bm25(passages, query):
    """Lucene BM25 (no k1+1 numerator): idf = ln(1 + (N - df + .5)/(df + .5)); tf / (tf + k1 (1 - b + b dl/avgdl))."""
    docs = [analyze(p.full_text()) for p in passages]
    avgdl = np.mean([len(d) for d in docs])
    scores = np.zeros(len(docs))
    for term in set(analyze(query)):
        df = sum(term in d for d in docs)
        if df == 0:
            continue
        idf = math.log(1 + (len(docs) - df + 0.5) / (df + 0.5))
        for j, d in enumerate(docs):
            tf = d.count(term)
            scores[j] += idf * tf / (tf + K1 * (1 - B + B * len(d) / avgdl))
    return scores


@pytest.fixture(scope="module")
def slice_2k():
    return load_corpus(BENCH / "corpus_multihop_contexts.jsonl", max_passages=2000)


@pytest.fixture(scope="module")
def lucene_2k(slice_2k, tmp_path_factory):
    return build_bm25(slice_2k, "lucene", tmp_path_factory.mktemp("lucene"))


@pytest.fixture(scope="module")
def bm25s_2k(slice_2k):
    return build_bm25(slice_2k, "bm25s")


def test_analyzer_matches_lucene_english_rules():
    assert analyze("The Army's soldiers were RUNNING to the U.S. capital, 1,000 strong") == [
        "armi",
        "soldier",
        "were",
        "run",
        "u.",
        "capit",
        "1,000",
        "strong",
    ]
    assert analyze("the of and a") == []


@pytest.mark.parametrize("backend", ["bm25s", "lucene"])
@pytest.mark.parametrize("query", ["cat", "running dogs park", "quantum cat waves"])
def test_scores_match_bm25_formula(backend, query, tmp_path):
    retriever = build_bm25(TOY, backend, tmp_path / backend)
    [hits] = retriever.search([query], k=5)
    ref = reference_bm25(TOY, query)
    expected = {TOY[j].doc_id: ref[j] for j in np.argsort(-ref, kind="stable") if ref[j] > 0}
    assert {h.doc_id for h in hits} == set(expected)
    for h in hits:
        assert h.score == pytest.approx(expected[h.doc_id], rel=1e-3)
        assert isinstance(h, Hit) and h.title and h.text
    assert [h.score for h in hits] == sorted([h.score for h in hits], reverse=True)


@pytest.mark.parametrize("backend", ["bm25s", "lucene"])
def test_empty_unknown_and_overlong_queries(backend, request, caplog):
    retriever = request.getfixturevalue(f"{backend}_2k")
    long_query = " ".join(["Shirley Temple"] * 1500)
    with caplog.at_level(logging.WARNING):
        out = retriever.search(["", "   ", "zzzqqqxxy", long_query, "the of"], k=10)
    assert out[0] == [] and out[1] == [] and out[2] == [] and out[4] == []
    assert out[3][0].title == "Shirley Temple"
    assert "truncated" in caplog.text


def test_lucene_and_bm25s_agree_on_real_questions(lucene_2k, bm25s_2k):
    questions = [json.loads(l)["question"] for l in (BENCH / "hotpotqa_dev_500.jsonl").open()][:150]
    a, b = lucene_2k.search(questions, 10), bm25s_2k.search(questions, 10)
    overlap = np.mean([len({h.doc_id for h in x} & {h.doc_id for h in y}) / 10 for x, y in zip(a, b)])
    assert overlap >= 0.95
    top1 = np.mean([x[0].doc_id == y[0].doc_id for x, y in zip(a, b)])
    assert top1 >= 0.9


def test_batch_equals_single_and_k_is_clipped(bm25s_2k):
    qs = ["Meet Corliss Archer radio", "Shirley Temple diplomat"]
    batch = bm25s_2k.search(qs, 4)
    assert batch == [bm25s_2k.search([q], 4)[0] for q in qs]
    assert len(build_bm25(TOY, "bm25s").search(["cat dog park physics"], 50)[0]) == 5


def test_unknown_backend_and_empty_corpus():
    with pytest.raises(ValueError, match="unknown BM25 backend 'faiss'"):
        build_bm25(TOY, "faiss")
    with pytest.raises(ValueError, match="no passages"):
        build_bm25([], "bm25s")


def test_bm25s_numba_kernels_are_cached_on_disk(bm25s_2k):
    """bm25s's numba retrieval kernels compile for ~7 s per process unless numba caches them: building or loading a
    bm25s index turns numba's on-disk cache on for both (one search, the same results)."""
    from bm25s.numba import retrieve_utils

    for name in ("_retrieve_internal_jitted_serial", "_retrieve_internal_jitted_parallel"):
        assert type(getattr(retrieve_utils, name)._cache).__name__ == "FunctionCache", name


def test_two_bm25s_builds_write_the_same_files_whatever_the_string_hashing(tmp_path):
    """bm25s numbers its vocabulary in a Python set's order, which follows PYTHONHASHSEED: two processes indexing one
    corpus wrote the same words under other ids. The build sorts the vocabulary, so the files are the same bytes."""
    import hashlib
    import subprocess
    import sys

    script = ("import sys; from pathlib import Path; from jaxrag.retrieval import build_bm25; "
              "from jaxrag.retrieval.corpus import load_corpus; from jaxrag.paths import SAMPLE; "
              "build_bm25(load_corpus(SAMPLE / 'corpus_multihop_contexts.jsonl')[:300], backend='bm25s', "
              "out_dir=Path(sys.argv[1]))")
    digests = []
    for seed in ("1", "2"):
        out = tmp_path / seed
        out.mkdir()
        env = {**os.environ, "PYTHONHASHSEED": seed}
        subprocess.run([sys.executable, "-c", script, str(out)], check=True, env=env, timeout=300)
        digests.append({f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(out.iterdir())})
    assert digests[0] == digests[1] and "vocab.index.json" in digests[0]
