import json

import pytest

from jaxrag.paths import SAMPLE
from jaxrag.retrieval.corpus import CorpusError, Passage, check_unique, iter_corpus, load_corpus, write_corpus

REAL = SAMPLE / "corpus_multihop_contexts.jsonl"


def _write(tmp_path, lines):
    p = tmp_path / "c.jsonl"
    p.write_text("\n".join(lines) + "\n")
    return p


def test_three_record_styles(tmp_path):
    p = _write(
        tmp_path,
        [
            json.dumps({"id": "a", "contents": '"Paris"\nParis is the capital of France.'}),
            json.dumps({"id": "b", "title": "Rome", "contents": "Rome is in Italy."}),
            json.dumps({"id": 3, "title": "Oslo", "text": " Oslo is in Norway. "}),
            "",
            json.dumps({"id": "d", "contents": "no title line here"}),
        ],
    )
    got = load_corpus(p)
    assert got == [
        Passage("a", "Paris", "Paris is the capital of France."),
        Passage("b", "Rome", "Rome is in Italy."),
        Passage("3", "Oslo", "Oslo is in Norway."),
        Passage("d", "no title line here", ""),
    ]
    assert got[1].full_text() == "Rome\nRome is in Italy."


def test_malformed_line_names_file_and_line(tmp_path):
    p = _write(tmp_path, [json.dumps({"id": "a", "contents": "x"}), '{"id": "b", "contents": '])
    with pytest.raises(CorpusError, match=rf"{p}:2: malformed JSON"):
        load_corpus(p)


def test_empty_and_non_utf8_corpus_name_the_file(tmp_path):
    p = _write(tmp_path, [""])
    with pytest.raises(CorpusError, match=rf"{p}: empty corpus"):
        load_corpus(p)
    p.write_bytes(b'{"id": "a", "contents": "caf\xe9"}\n')
    with pytest.raises(CorpusError, match=rf"{p}:1: not UTF-8 \(byte 0xe9 at column 29\)"):
        load_corpus(p)


def test_duplicate_id_names_both_lines(tmp_path):
    p = _write(
        tmp_path,
        [
            json.dumps({"id": "a", "contents": "x"}),
            json.dumps({"id": "b", "contents": "y"}),
            json.dumps({"id": "a", "contents": "z"}),
        ],
    )
    with pytest.raises(CorpusError, match=rf"{p}:3: duplicate id 'a' \(first seen on line 1\)"):
        load_corpus(p)


@pytest.mark.parametrize(
    "record, message",
    [
        ({"contents": "x"}, "missing key 'id'"),
        ({"id": "a", "title": "t"}, "neither 'contents' nor 'text'"),
        ({"id": "a", "contents": 5}, "'contents' of record 'a' is not a string"),
        ([1, 2], "expected a JSON object"),
    ],
)
def test_bad_records(tmp_path, record, message):
    p = _write(tmp_path, [json.dumps(record)])
    with pytest.raises(CorpusError, match=f"{p}:1: .*{message}"):
        load_corpus(p)


def test_missing_file_and_in_memory_duplicates(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        load_corpus(tmp_path / "nope.jsonl")
    with pytest.raises(CorpusError, match=r"passages\[1\]: duplicate id 'x'"):
        check_unique([Passage("x", "", "a"), Passage("x", "", "b")])


def test_streams_and_roundtrips_real_corpus(tmp_path):
    first = next(iter_corpus(REAL))
    assert first.doc_id == "mhctx_0" and first.title == "Meet Corliss Archer"
    passages = load_corpus(REAL)
    assert len(passages) == 3325   # the repository's slice (data/benchmarks/NOTICE.md)
    write_corpus(passages[:100], tmp_path / "n.jsonl")
    assert load_corpus(tmp_path / "n.jsonl") == passages[:100]
    assert load_corpus(REAL, max_passages=7) == passages[:7]
