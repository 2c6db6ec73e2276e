import logging

import numpy as np
import pytest

from jaxrag.retrieval.ann import AnnConfig, ExactIndex, build_ann, load_ann, top_k
from jaxrag.retrieval.corpus import Passage
from jaxrag.retrieval.dense import TextEncoder, build_dense, load_dense


def clustered(n, d=64, clusters=50, seed=0):
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(clusters, d))
    x = centers[rng.integers(0, clusters, n)] + 0.3 * rng.normal(size=(n, d))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def test_top_k_and_exact_match_brute_force():
    emb, q = clustered(3000), clustered(40, seed=1)
    idx, scores = ExactIndex(emb, chunk=7).search(q, 10)
    brute = np.argsort(-(q @ emb.T), axis=1)[:, :10]
    np.testing.assert_array_equal(idx, brute)
    np.testing.assert_allclose(scores, np.take_along_axis(q @ emb.T, brute, 1), rtol=1e-6)
    i, s = top_k(np.array([[0.1, 0.5, 0.3]]), 5)
    assert i.tolist() == [[1, 2, 0]] and s.tolist() == [[0.5, 0.3, 0.1]]


def test_scann_recall_and_reload(tmp_path):
    emb, q = clustered(20_000), clustered(200, seed=1)
    index = build_ann(emb, AnnConfig(kind="scann"))
    idx, _ = index.search(q, 10)
    truth, _ = ExactIndex(emb).search(q, 10)
    recall = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(idx, truth)])
    assert recall >= 0.9
    index.save(tmp_path)
    again = load_ann(tmp_path, emb, index.describe())
    np.testing.assert_array_equal(again.search(q, 10)[0], idx)
    assert build_ann(emb[:100]).describe() == {"kind": "exact"}  # auto: small corpora are searched exactly


@pytest.fixture(scope="module")
def encoder():
    return TextEncoder.load(max_len=64, batch_size=16)


PASSAGES = [
    Passage("p0", "Shirley Temple", "Shirley Temple was an American actress and later a diplomat."),
    Passage("p1", "Mount Everest", "Mount Everest is the highest mountain above sea level."),
    Passage("p2", "Python", "Python is a programming language created by Guido van Rossum."),
    Passage("p3", "Espresso", "Espresso is coffee brewed by forcing hot water through ground beans."),
    Passage("p4", "Jupiter", "Jupiter is the largest planet in the Solar System."),
]


def test_dense_retrieves_paraphrases_and_reloads(encoder, tmp_path, caplog):
    retriever = build_dense(PASSAGES, encoder, tmp_path)
    qs = ["which planet is biggest", "", "child actress who became an ambassador", "tallest peak on earth"]
    hits = retriever.search(qs, 2)
    assert [h[0].doc_id if h else None for h in hits] == ["p4", None, "p0", "p1"]
    assert hits[0][0].score > hits[0][1].score and hits[0][0].title == "Jupiter"
    again = load_dense(tmp_path, PASSAGES)
    assert [[h.doc_id for h in x] for x in again.search(qs, 3)] == [
        [h.doc_id for h in x] for x in retriever.search(qs, 3)
    ]
    with caplog.at_level(logging.WARNING):
        [long_hits] = retriever.search(["coffee " * 300], 1)
    assert long_hits[0].doc_id == "p3"
    assert "1 of 1 queries truncated to 64 tokens" in caplog.text


def test_corrupt_dense_index_named(encoder, tmp_path):
    from jaxrag.retrieval.base import RetrievalIndexError

    with pytest.raises(RetrievalIndexError, match=str(tmp_path / "meta.json")):
        load_dense(tmp_path, PASSAGES, encoder)
    build_dense(PASSAGES, encoder, tmp_path)
    with pytest.raises(RetrievalIndexError, match="embeddings .* vs 4 passages"):
        load_dense(tmp_path, PASSAGES[:4], encoder)
    (tmp_path / "embeddings.npy").write_bytes(b"garbage")
    with pytest.raises(RetrievalIndexError, match=f"corrupt dense index at {tmp_path}"):
        load_dense(tmp_path, PASSAGES, encoder)
