"""JSONL reading shared by every loader: one record per non-blank line, errors that name file:line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator


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
