import pytest

from jaxrag.retrieval import CachedRetriever, Hit, HybridRetriever, rrf


def hits(*ids):
    return [Hit(d, 10.0 - i, f"T{d}", f"text {d}") for i, d in enumerate(ids)]


def test_rrf_formula_and_ties():
    fused = rrf([hits("a", "b", "c"), hits("c", "d")], k=10, rrf_k=60)
    expected = {"a": 1 / 61, "b": 1 / 62, "c": 1 / 63 + 1 / 61, "d": 1 / 62}
    assert [h.doc_id for h in fused] == ["c", "a", "b", "d"]  # b and d tie: b was seen first
    for h in fused:
        assert h.score == pytest.approx(expected[h.doc_id])
        assert h.title == f"T{h.doc_id}"


def test_rrf_depth_and_k():
    lists = [hits("a", "b", "c", "d"), hits("d", "c", "b", "a")]
    assert [h.doc_id for h in rrf(lists, k=2, depth=1)] == ["a", "d"]
    assert len(rrf(lists, k=3)) == 3 and rrf([[], []], k=5) == []


class Scripted:
    def __init__(self, table):
        self.table, self.calls = table, []

    def search(self, queries, k):
        self.calls.append((list(queries), k))
        return [list(self.table.get(q, []))[:k] for q in queries]


def test_hybrid_asks_each_retriever_for_depth():
    bm25 = Scripted({"q": hits("a", "b", "c")})
    dense = Scripted({"q": hits("c", "x")})
    out = HybridRetriever([bm25, dense], depth=3).search(["q", "other"], k=2)
    assert [h.doc_id for h in out[0]] == ["c", "a"] and out[1] == []
    assert bm25.calls == [(["q", "other"], 3)] and dense.calls == [(["q", "other"], 3)]


def test_hybrid_cuts_each_list_at_k_when_k_exceeds_depth():
    # k 4 > depth 2: each list is asked for and cut at 4, so "d" (rank 4 in both) joins the fused list.
    # Cut at depth 2 it would be missing and only 3 documents would come back.
    bm25 = Scripted({"q": hits("a", "b", "c", "d")})
    dense = Scripted({"q": hits("e", "c", "f", "d")})
    out = HybridRetriever([bm25, dense], depth=2, rrf_k=0).search(["q"], k=4)[0]
    assert bm25.calls == [(["q"], 4)]
    # scores 1/rank summed: c = 1/3 + 1/2, d = 1/4 + 1/4, a = 1, e = 1
    assert [h.doc_id for h in out] == ["a", "e", "c", "b"]
    out = HybridRetriever([bm25, dense], depth=2, rrf_k=0).search(["q"], k=5)[0]
    assert [h.doc_id for h in out] == ["a", "e", "c", "b", "d"]


def test_cache_keyed_on_query_and_k():
    inner = Scripted({"q1": hits("a", "b", "c"), "q2": hits("z")})
    cached = CachedRetriever(inner, max_entries=2)
    first = cached.search(["q1", "q2", "q1"], 2)
    assert inner.calls == [(["q1", "q2"], 2)]  # deduplicated misses only
    assert cached.search(["q1"], 2) == [first[0]] and len(inner.calls) == 1
    cached.search(["q1"], 3)  # different k: a new key
    assert inner.calls[-1] == (["q1"], 3)
    first[0].clear()  # callers get copies
    assert len(cached.search(["q1"], 3)[0]) == 3
    cached.search(["q2"], 2)  # evicts the least recently used entry (q1, 2)
    cached.search(["q1"], 2)
    assert inner.calls[-1] == (["q1"], 2) and cached.hits >= 2


def test_config_section_passes_fusion_settings(monkeypatch, tmp_path):
    from jaxrag import retrieval
    from jaxrag.pipelines.common import load_retriever

    seen = {}
    monkeypatch.setattr(retrieval, "load_retriever", lambda path, **kw: seen.update(kw, path=path))
    load_retriever({"index_dir": "indexes/med", "kind": "hybrid", "rrf_k": 100, "depth": 0}, tmp_path)
    assert seen["path"] == tmp_path / "indexes/med" and seen["rrf_k"] == 100 and seen["kind"] == "hybrid"
    assert "depth" not in seen  # 0 / unset: the library default
