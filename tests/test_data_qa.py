import json

import pytest

from fakes import BENCH
from jaxrag.data.qa import QADataError, load_qa, parse_select


def test_real_files_and_paper_splits():
    hp = load_qa(BENCH / "hotpotqa_dev_500.jsonl")
    assert len(hp) == 100 and hp[0].contexts and hp[0].supporting_titles   # the repository's slice (data/benchmarks)
    first, last = load_qa(BENCH / "hotpotqa_dev_500.jsonl", "first:30"), load_qa(BENCH / "hotpotqa_dev_500.jsonl", "last:30")
    assert first == hp[:30] and last == hp[-30:]
    assert len(load_qa(BENCH / "bamboogle_test.jsonl")) == 100
    med = load_qa(BENCH / "medqa_usmle_4opt_test_1273.jsonl", "first:5")
    assert all(len(m.choices) == 4 for m in med) and med[1].answer_letter == "ABCD"[med[1].choices.index("Cross-linking of DNA")]


def test_select_specs():
    assert parse_select("range:2:5", 10) == [2, 3, 4]
    assert parse_select("last:3", 2) == [0, 1]
    s = parse_select("sample:4:7", 100)
    assert s == parse_select("sample:4:7", 100) and len(set(s)) == 4 and s == sorted(s)
    with pytest.raises(QADataError, match="bad select spec 'middle:3'"):
        parse_select("middle:3", 10)


def _write(tmp_path, lines):
    p = tmp_path / "d.jsonl"
    p.write_text("\n".join(lines) + "\n")
    return p


def test_errors_name_file_line_key(tmp_path):
    ok = json.dumps({"id": "1", "question": "q?", "golden_answers": ["a"]})
    with pytest.raises(QADataError, match=r"d\.jsonl:2: malformed JSON"):
        load_qa(_write(tmp_path, [ok, "{oops"]))
    with pytest.raises(QADataError, match=r"d\.jsonl:2: missing key 'golden_answers'"):
        load_qa(_write(tmp_path, [ok, json.dumps({"id": "2", "question": "q"})]))
    with pytest.raises(QADataError, match=r"d\.jsonl:1: key 'golden_answers' must not be empty"):
        load_qa(_write(tmp_path, [json.dumps({"id": "2", "question": "q", "golden_answers": []})]))
    with pytest.raises(QADataError, match=r"contexts\[0\]"):
        load_qa(_write(tmp_path, [json.dumps({"id": "2", "question": "q", "golden_answers": ["a"], "contexts": [{"t": 1}]})]))
    with pytest.raises(QADataError, match=r"d\.jsonl:2: duplicate id '1'"):
        load_qa(_write(tmp_path, [ok, ok]))
    with pytest.raises(QADataError, match="no such file"):
        load_qa(tmp_path / "missing.jsonl")
    with pytest.raises(QADataError, match=r"d\.jsonl: empty \(no QA records\)"):
        load_qa(_write(tmp_path, ["", ""]))
    with pytest.raises(QADataError, match=r"d\.jsonl: the selection 'first:0' \(limit None\) leaves no questions"):
        load_qa(_write(tmp_path, [ok]), "first:0")
    (tmp_path / "d.jsonl").write_bytes(ok.encode() + b'\n{"id": "\xff"}\n')
    with pytest.raises(QADataError, match=r"d\.jsonl:2: not UTF-8 \(byte 0xff"):
        load_qa(tmp_path / "d.jsonl")


def test_tfds_build_read_and_grain_batches(tmp_path):
    pytest.importorskip("tensorflow_datasets")
    pytest.importorskip("grain")
    from jaxrag.data.tfds_qa import build_qa_tfds, qa_loader, qa_source
    b = build_qa_tfds(BENCH / "bamboogle_test.jsonl", tmp_path, select="first:10")
    src = qa_source(b)
    assert len(src) == 10
    want = {e.id: e for e in load_qa(BENCH / "bamboogle_test.jsonl", "first:10")}
    batches = list(qa_loader(src, batch_size=4, seed=1))
    assert [len(x) for x in batches] == [4, 4, 2]
    got = [r for bt in batches for r in bt]
    assert sorted(r["id"] for r in got) == sorted(want)
    for r in got:
        assert r["question"] == want[r["id"]].question and r["golden_answers"] == list(want[r["id"]].golden_answers)
    assert build_qa_tfds(BENCH / "bamboogle_test.jsonl", tmp_path, select="first:10").info.splits["train"].num_examples == 10


def test_rag_gym_medqa_csv(tmp_path):
    """RAG-Gym's released MedQA training sample (index, question, options as a dict literal, answer letter) -> QA
    JSONL that load_qa reads back with its choices and gold letter; a bad row names its line."""
    from jaxrag.data.rag_gym_medqa import main

    src = tmp_path / "medqa_train_1000.csv"
    src.write_text('index,question,options,answer\n'
                   '00018,"Which, of these?","{\'A\': \'x\', \'B\': \'y, z\', \'C\': \'w\', \'D\': \'v\'}",B\n'
                   '00230,Q2,"{\'A\': \'a\', \'B\': \'b\', \'C\': \'c\', \'D\': \'d\'}",D\n')
    main([str(src), str(tmp_path / "out.jsonl")])
    ex = load_qa(tmp_path / "out.jsonl")
    assert [(e.id, e.question, e.choices, e.golden_answers, e.answer_letter) for e in ex] == [
        ("medqa_train_00018", "Which, of these?", ("x", "y, z", "w", "v"), ("y, z",), "B"),
        ("medqa_train_00230", "Q2", ("a", "b", "c", "d"), ("d",), "D")]
    src.write_text(src.read_text() + "00540,Q3,\"{'A': 'a'}\",E\n")
    with pytest.raises(QADataError, match=r"medqa_train_1000.csv:4: answer 'E' is not one of the options \['A'\]"):
        main([str(src), str(tmp_path / "bad.jsonl")])
    assert not (tmp_path / "bad.jsonl").exists()
