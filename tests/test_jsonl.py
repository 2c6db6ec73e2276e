"""The one JSONL reader/writer: round trip, errors naming file:line, and writes that never leave half a file."""

import pytest

from jaxrag.jsonl import read_jsonl, write_jsonl


def test_round_trip_and_append(tmp_path):
    p = write_jsonl(tmp_path / "a" / "x.jsonl", [{"i": 1, "s": "é"}, {"i": 2}])
    assert read_jsonl(p) == [{"i": 1, "s": "é"}, {"i": 2}]
    write_jsonl(p, [{"i": 3}], append=True)
    assert [r["i"] for r in read_jsonl(p)] == [1, 2, 3]


def test_a_failed_write_keeps_the_old_file(tmp_path):
    p = write_jsonl(tmp_path / "x.jsonl", [{"old": True}])

    def rows():
        yield {"new": 1}
        raise RuntimeError("killed mid-write")

    with pytest.raises(RuntimeError):
        write_jsonl(p, rows())
    assert read_jsonl(p) == [{"old": True}]  # the half-written temp file never replaced it


def test_malformed_line_names_file_and_line(tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_text('{"a": 1}\n\n{"a": \n')
    with pytest.raises(ValueError, match=r"bad.jsonl:3: malformed JSON"):
        read_jsonl(p)


def test_non_utf8_byte_names_file_line_and_column(tmp_path):
    p = tmp_path / "corpus.jsonl"
    p.write_bytes(b'{"a": "ok"}\n{"a": "caf\xe9"}\n')
    with pytest.raises(ValueError, match=r"corpus.jsonl:2: not UTF-8 \(byte 0xe9 at column 11\)"):
        read_jsonl(p)


def test_missing_file_names_the_path(tmp_path):
    with pytest.raises(ValueError, match=r"nope.jsonl: cannot read"):
        read_jsonl(tmp_path / "nope.jsonl")
