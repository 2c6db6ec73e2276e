import json
import subprocess
import sys

import pytest

from jaxrag.paths import SAMPLE
from jaxrag.retrieval import RetrievalIndexError, load_retriever
from jaxrag.retrieval.build import main as build_main

CORPUS = SAMPLE / "corpus_multihop_contexts.jsonl"


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("index")
    build_main(
        ["--corpus", str(CORPUS), "--out", str(out), "--max-passages", "60", "--max-len", "64", "--batch-size", "32"]
    )
    return out


def test_build_writes_every_index(index_dir):
    manifest = json.loads((index_dir / "manifest.json").read_text())
    assert manifest["n_passages"] == 60 and manifest["bm25"] == ["bm25s", "lucene"] and manifest["dense"]
    steps = [json.loads(l)["step"] for l in (index_dir / "build_metrics.jsonl").open()]
    assert steps == ["corpus", "bm25_bm25s", "bm25_lucene", "dense"]


@pytest.mark.parametrize(
    "kind, backend",
    [("bm25", "bm25s"), ("bm25", "lucene"), ("dense", "bm25s"), ("hybrid", "bm25s"), ("hybrid", "lucene")],
)
def test_every_kind_finds_the_passage(index_dir, kind, backend):
    retriever = load_retriever(index_dir, kind, backend)
    out = retriever.search(["Meet Corliss Archer radio program CBS", " "], k=3)
    assert out[0][0].title.startswith("Meet Corliss Archer") and out[1] == []
    assert len(out[0]) == 3 and out[0][0].text


def test_missing_and_corrupt_index_errors_name_path(index_dir, tmp_path):
    with pytest.raises(RetrievalIndexError, match=f"index directory not found: {tmp_path / 'nope'}"):
        load_retriever(tmp_path / "nope")
    with pytest.raises(RetrievalIndexError, match=str(tmp_path / "manifest.json")):
        load_retriever(tmp_path)
    (tmp_path / "manifest.json").write_text("{oops")
    with pytest.raises(RetrievalIndexError, match=f"corrupt index manifest {tmp_path / 'manifest.json'}"):
        load_retriever(tmp_path)
    (tmp_path / "manifest.json").write_text(json.dumps({"n_passages": 60, "bm25": ["bm25s"], "dense": False}))
    (tmp_path / "corpus.jsonl").write_text((index_dir / "corpus.jsonl").read_text())
    with pytest.raises(RetrievalIndexError, match=str(tmp_path / "bm25s" / "params.index.json")):
        load_retriever(tmp_path, "bm25", "bm25s")
    with pytest.raises(RetrievalIndexError, match="has no lucene BM25 index"):
        load_retriever(tmp_path, "bm25", "lucene")
    with pytest.raises(RetrievalIndexError, match="has no dense index"):
        load_retriever(tmp_path, "dense")
    with pytest.raises(ValueError, match="unknown retriever kind 'sparse'"):
        load_retriever(index_dir, "sparse")


def test_import_pulls_no_torch_jvm_or_jax():
    code = (
        "import sys, jaxrag.retrieval as r; from jaxrag.retrieval import bm25, hybrid, index, corpus, ann; "
        "print(sorted(m for m in ('torch', 'jnius', 'jax', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_hybrid_lucene_search_pulls_no_torch(index_dir):
    code = (
        f"import sys, jaxrag.retrieval as r; h = r.load_retriever({str(index_dir)!r}, 'hybrid', 'lucene')"
        ".search(['Corliss Archer'], 2); print(len(h[0]), 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "2 False"
