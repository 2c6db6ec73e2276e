"""JSONL reading shared by every loader: one record per non-blank line, errors that name file:line; the atomic
writer under every JSONL and JSON output."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Iterable, Iterator, TextIO


def iter_jsonl(path: str | Path, error: type[Exception] = ValueError) -> Iterator[tuple[str, dict]]:
    """Yield (where = "path:line", record) per non-blank line; malformed JSON or a byte that is not UTF-8 raises
    `error` naming the line (and the column of the bad byte); a missing file raises it naming the path."""
    path = Path(path)
    try:
        f = path.open("rb")
    except OSError as e:
        raise error(f"{path}: cannot read ({e.strerror or e})") from None
    with f:
        for line_no, raw in enumerate(f, start=1):
            where = f"{path}:{line_no}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise error(f"{where}: not UTF-8 (byte 0x{raw[e.start]:02x} at column {e.start + 1})") from None
            if not line.strip():
                continue
            try:
                yield where, json.loads(line)
            except json.JSONDecodeError as e:
                raise error(f"{where}: malformed JSON ({e.msg} at column {e.colno})") from None


def read_jsonl(path: str | Path, error: type[Exception] = ValueError) -> list[dict]:
    """Every record of a JSONL file, in order (errors as iter_jsonl)."""
    return [record for _, record in iter_jsonl(path, error)]


def write_atomic(path: str | Path, fill: Callable[[TextIO], None], append: bool = False) -> Path:
    """`fill(f)` writes the file's text. A fresh file is written to a temp file and renamed into place, so a killed
    write never leaves a half file under the final name; append=True adds to the file as it is (a run's log). An
    OSError (e.g. a full disk) names the file, removes the temp file and leaves the old complete file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    target = path if append else path.with_name(path.name + ".tmp")
    try:
        with target.open("a" if append else "w", encoding="utf-8") as f:
            fill(f)
    except OSError as e:  # Python's message does not say which file
        if not append:
            target.unlink(missing_ok=True)
        raise OSError(e.errno, f"{path}: {e.strerror or e} (the file was not written)") from None
    if not append:
        target.replace(path)
    return path


def write_jsonl(path: str | Path, rows: Iterable[dict], append: bool = False) -> Path:
    """One JSON object per line, written as `write_atomic` writes (atomic unless append=True)."""
    return write_atomic(path, lambda f: f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), append)
