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


def test_full_disk_names_the_file_and_keeps_the_old_one(tmp_path):
    """A file-size limit makes the write fail as a full disk would (EFBIG): the error names the file, the old
    complete file stays, no temp file is left."""
    import subprocess
    import sys
    import textwrap

    p = write_jsonl(tmp_path / "episodes.jsonl", [{"old": True}])
    script = textwrap.dedent(f"""
        import resource, signal
        from jaxrag.jsonl import write_jsonl
        from jaxrag.pipelines.common import write_json
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
        for write in (lambda: write_jsonl({str(p)!r}, ({{"x": "y" * 100}} for _ in range(1000))),
                      lambda: write_json({str(tmp_path / "results.json")!r}, {{"x": "y" * 10000}})):
            try:
                write()
            except OSError as e:
                print("ERR", e)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    lines = [line for line in out.stdout.splitlines() if line.startswith("ERR")]
    assert len(lines) == 2, out.stdout + out.stderr
    assert f"{p}: File too large (the file was not written)" in lines[0]
    assert f"{tmp_path / 'results.json'}: File too large" in lines[1]
    assert read_jsonl(p) == [{"old": True}]
    assert sorted(x.name for x in tmp_path.iterdir()) == ["episodes.jsonl"]
