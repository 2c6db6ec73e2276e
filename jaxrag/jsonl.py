"""JSONL reading shared by every loader: one record per non-blank line, errors that name file:line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable, Iterator


def iter_jsonl(path: str | Path, error: type[Exception] = ValueError) -> Iterator[tuple[str, dict]]:
    """Yield (where = "path:line", record) per non-blank line; malformed JSON raises `error` naming the line."""
    path = Path(path)
    with path.open(encoding="utf-8") as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path}:{line_no}"
            try:
                yield where, json.loads(line)
            except json.JSONDecodeError as e:
                raise error(f"{where}: malformed JSON ({e.msg} at column {e.colno})") from None


def read_jsonl(path: str | Path, error: type[Exception] = ValueError) -> list[dict]:
    """Every record of a JSONL file, in order (errors as iter_jsonl)."""
    return [record for _, record in iter_jsonl(path, error)]


def write_jsonl(path: str | Path, rows: Iterable[dict], append: bool = False) -> Path:
    """One JSON object per line. A fresh file is written to a temp file and renamed into place, so a killed write
    never leaves a half file under the final name; append=True adds lines to the file as it is (a run's log)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    target = path if append else path.with_name(path.name + ".tmp")
    with target.open("a" if append else "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    if not append:
        target.replace(path)
    return path
