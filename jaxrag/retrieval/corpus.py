"""Passage corpora: JSONL with "id" and either "contents" (FlashRAG: title line, then text) or "title" with
"contents"/"text". Read as a stream; bad lines and duplicate ids raise errors that name the file and line."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Iterable, Iterator

from jaxrag.jsonl import iter_jsonl


class CorpusError(ValueError):
    """A corpus file that cannot be read; the message names the file and line."""


@dataclasses.dataclass(frozen=True)
class Passage:
    doc_id: str
    title: str
    text: str

    def full_text(self) -> str:
        """Title and text as one string: what BM25 indexes and the encoder reads."""
        return f"{self.title}\n{self.text}" if self.title else self.text


def _split_flashrag(contents: str) -> tuple[str, str]:
    title, _, text = contents.partition("\n")
    title = title.strip()
    if len(title) >= 2 and title[0] == title[-1] == '"':
        title = title[1:-1]
    return title, text.strip()


def parse_record(record: object, where: str) -> Passage:
    """One decoded JSON record -> Passage; `where` is "file:line" for errors. Formats: {id, title, text},
    FlashRAG {id, contents: '"Title"\\ntext'}, and MedRAG's chunks {id, title, content, contents} (contents = title +
    content there, so the text is `content`). A record whose text field is blank is an error (a FlashRAG `contents`
    of one line is a title with no text: accepted)."""
    if not isinstance(record, dict):
        raise CorpusError(f"{where}: expected a JSON object, got {type(record).__name__}")
    if "id" not in record:
        raise CorpusError(f"{where}: missing key 'id'")
    doc_id = str(record["id"])
    if "title" in record and "content" in record:
        body_key = "content"
    else:
        body_key = "contents" if "contents" in record else "text" if "text" in record else None
    if body_key is None:
        raise CorpusError(f"{where}: record {doc_id!r} has neither 'contents' nor 'text'")
    body = record[body_key]
    if not isinstance(body, str):
        raise CorpusError(f"{where}: key {body_key!r} of record {doc_id!r} is not a string")
    if not body.strip():  # nothing to retrieve: a broken export, not a passage
        raise CorpusError(f"{where}: record {doc_id!r} has an empty text ({body_key!r}); fix or drop the line")
    if "title" in record:
        title = record["title"]
        if not isinstance(title, str):
            raise CorpusError(f"{where}: key 'title' of record {doc_id!r} is not a string")
        return Passage(doc_id, title.strip(), body.strip())
    if body_key == "contents":
        return Passage(doc_id, *_split_flashrag(body))
    return Passage(doc_id, "", body.strip())


def iter_corpus(path: str | Path, check_duplicates: bool = True) -> Iterator[Passage]:
    """Stream passages from a JSONL file; blank lines are skipped, duplicate ids raise CorpusError.
    check_duplicates=False (a file already checked, e.g. an index's copy) keeps no set of ids in memory."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"corpus file not found: {path}")
    seen: dict[str, str] = {}
    n = 0
    for where, record in iter_jsonl(path, CorpusError):
        passage = parse_record(record, where)
        if check_duplicates:
            if passage.doc_id in seen:
                raise CorpusError(
                    f"{where}: duplicate id {passage.doc_id!r} (first seen on line {seen[passage.doc_id]})"
                )
            seen[passage.doc_id] = where.rsplit(":", 1)[1]
        n += 1
        yield passage
    if not n:
        raise CorpusError(f"{path}: empty corpus (no passages)")


def load_corpus(path: str | Path, max_passages: int | None = None) -> list[Passage]:
    passages = []
    for p in iter_corpus(path):
        if max_passages is not None and len(passages) >= max_passages:
            break
        passages.append(p)
    return passages


def check_unique(passages: Iterable[Passage]) -> list[Passage]:
    """In-memory passages (e.g. a synthetic world) with the same duplicate-id check as files."""
    out, seen = [], set()
    for i, p in enumerate(passages):
        if p.doc_id in seen:
            raise CorpusError(f"passages[{i}]: duplicate id {p.doc_id!r}")
        seen.add(p.doc_id)
        out.append(p)
    return out


def write_corpus(passages: Iterable[Passage], path: str | Path) -> None:
    """Normalized copy ({"id", "title", "text"}) stored beside an index, so hits carry title and text."""
    with Path(path).open("w", encoding="utf-8") as f:
        for p in passages:
            f.write(json.dumps({"id": p.doc_id, "title": p.title, "text": p.text}, ensure_ascii=False) + "\n")
