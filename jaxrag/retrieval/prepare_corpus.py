"""The first pass of `prepare`: stream a corpus JSONL (FlashRAG's wiki-18 `{"id", "contents": "\\"Title\\"\\ntext"}`
or jaxrag's `{"id", "title", "text"}`), check every line and write the normalized copy that an index carries.

Holds no passage text in memory: duplicate ids are found from one 8-byte hash per id (168 MB at 21M passages),
and only when two hashes are equal does a second pass look at the ids themselves to name the line.
"""

from __future__ import annotations

import array
import json
from pathlib import Path
from typing import Iterator

import numpy as np

from jaxrag.jsonl import iter_jsonl
from jaxrag.retrieval.corpus import CorpusError, Passage, parse_record


def _checked(src: Path, max_passages: int | None) -> Iterator[tuple[str, Passage]]:
    """(where, passage) for the first max_passages passages; a passage without text is an error."""
    n = 0
    for where, record in iter_jsonl(src, CorpusError):
        if max_passages is not None and n >= max_passages:
            return
        p = parse_record(record, where)
        if not p.text:
            raise CorpusError(
                f"{where}: passage {p.doc_id!r} has no text (FlashRAG 'contents' is '\"Title\"\\ntext', "
                "or give 'title' and 'text')"
            )
        n += 1
        yield where, p


def _name_duplicate(src: Path, max_passages: int | None, hashes: set[int]) -> None:
    """Second pass when ids' hashes collide: raise naming the duplicate's line, or return (a hash collision)."""
    first_line: dict[str, str] = {}
    for where, p in _checked(src, max_passages):
        if hash(p.doc_id) in hashes:
            if p.doc_id in first_line:
                raise CorpusError(f"{where}: duplicate id {p.doc_id!r} (first seen on line {first_line[p.doc_id]})")
            first_line[p.doc_id] = where.rsplit(":", 1)[1]


def normalize_corpus(src: str | Path, dst: str | Path, max_passages: int | None = None, bar=None) -> int:
    """Check `src` (JSON per line, an id, non-empty text, unique ids) and write `dst` ({"id", "title", "text"} per
    line) through a temp file renamed into place only when every line passed. Returns the passage count.
    `bar`: a tqdm bar advanced per passage. Errors (CorpusError) name the file and line."""
    src, dst = Path(src), Path(dst)
    if not src.is_file():
        raise FileNotFoundError(f"corpus file not found: {src}")
    tmp = dst.with_name(dst.name + ".tmp")
    hashes = array.array("q")
    try:
        with tmp.open("w", encoding="utf-8") as f:
            for _, p in _checked(src, max_passages):
                hashes.append(hash(p.doc_id))
                f.write(json.dumps({"id": p.doc_id, "title": p.title, "text": p.text}, ensure_ascii=False) + "\n")
                if bar is not None:
                    bar.update(1)
        if not hashes:
            raise CorpusError(f"{src}: empty corpus (no passages)")
        h = np.sort(np.frombuffer(hashes, np.int64))
        same = h[1:][h[1:] == h[:-1]]
        if same.size:
            _name_duplicate(src, max_passages, set(same.tolist()))
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    tmp.replace(dst)
    return len(hashes)
