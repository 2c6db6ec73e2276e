"""FlashRAG-style QA JSONL (the format of the benchmark files: data/benchmarks/NOTICE.md) and paper splits.

Record: {"id", "question", "golden_answers": [str], optional "contexts": [{"title","text"}],
"supporting_titles": [str], "choices": [str] (option i is letter "ABCD"[i]), "dataset", "split", "metadata"}.
Splits are strings: "all", "first:N", "last:N", "range:A:B" (python slice), "sample:N:SEED" (random, fixed).
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from jaxrag.jsonl import iter_jsonl
from jaxrag.metrics import LETTERS

REQUIRED = ("id", "question", "golden_answers")


class QADataError(ValueError):
    """Bad QA data; the message names the file, line and key."""


@dataclass(frozen=True)
class QAExample:
    id: str
    question: str
    golden_answers: tuple[str, ...]
    contexts: tuple[dict, ...] = ()
    supporting_titles: tuple[str, ...] = ()
    choices: tuple[str, ...] = ()
    dataset: str = ""
    split: str = ""
    metadata: dict = field(default_factory=dict, compare=False)

    @property
    def answer_letter(self) -> str | None:
        """Multiple choice: the gold option letter (metadata.answer_idx, else the option equal to the gold)."""
        if not self.choices:
            return None
        idx = self.metadata.get("answer_idx")
        if isinstance(idx, str) and idx.strip().upper() in LETTERS[:len(self.choices)]:
            return idx.strip().upper()
        for g in self.golden_answers:
            if g in self.choices:
                return LETTERS[self.choices.index(g)]
        return None


def _check_str_list(v, key: str, where: str, allow_empty: bool = True) -> tuple[str, ...]:
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise QADataError(f"{where}: key {key!r} must be a list of strings, got {type(v).__name__}")
    if not allow_empty and not v:
        raise QADataError(f"{where}: key {key!r} must not be empty")
    return tuple(v)


def example_from_record(rec: dict, where: str, dataset: str = "") -> QAExample:
    if not isinstance(rec, dict):
        raise QADataError(f"{where}: expected a JSON object, got {type(rec).__name__}")
    for key in REQUIRED:
        if key not in rec:
            raise QADataError(f"{where}: missing key {key!r}")
    if not isinstance(rec["question"], str) or not rec["question"].strip():
        raise QADataError(f"{where}: key 'question' must be a non-empty string")
    golds = _check_str_list(rec["golden_answers"], "golden_answers", where, allow_empty=False)
    contexts = rec.get("contexts") or []
    if not isinstance(contexts, list):
        raise QADataError(f"{where}: key 'contexts' must be a list")
    for j, c in enumerate(contexts):
        if not isinstance(c, dict) or "title" not in c or "text" not in c:
            raise QADataError(f"{where}: key 'contexts[{j}]' must be an object with 'title' and 'text'")
    choices = _check_str_list(rec.get("choices") or [], "choices", where)
    meta = rec.get("metadata") or {}
    if not isinstance(meta, dict):
        raise QADataError(f"{where}: key 'metadata' must be an object")
    return QAExample(id=str(rec["id"]), question=rec["question"], golden_answers=golds,
                     contexts=tuple({"title": str(c["title"]), "text": str(c["text"])} for c in contexts),
                     supporting_titles=_check_str_list(rec.get("supporting_titles") or [], "supporting_titles", where),
                     choices=choices, dataset=str(rec.get("dataset") or dataset), split=str(rec.get("split", "")),
                     metadata=meta)


def parse_select(spec: str | None, n: int) -> list[int]:
    """Indices chosen by a split spec out of n records."""
    spec = (spec or "all").strip()
    parts = spec.split(":")
    try:
        if parts[0] == "all" and len(parts) == 1:
            return list(range(n))
        if parts[0] == "first" and len(parts) == 2:
            return list(range(min(int(parts[1]), n)))
        if parts[0] == "last" and len(parts) == 2:
            return list(range(max(n - int(parts[1]), 0), n))
        if parts[0] == "range" and len(parts) == 3:
            a = int(parts[1]) if parts[1] else None
            b = int(parts[2]) if parts[2] else None
            return list(range(n))[a:b]
        if parts[0] == "sample" and len(parts) == 3:
            k = min(int(parts[1]), n)
            return sorted(random.Random(int(parts[2])).sample(range(n), k))
    except ValueError:
        pass
    raise QADataError(f"bad select spec {spec!r}: use all | first:N | last:N | range:A:B | sample:N:SEED")


def select(examples: Sequence[QAExample], spec: str | None) -> list[QAExample]:
    return [examples[i] for i in parse_select(spec, len(examples))]


def load_qa(path: str | Path, select_spec: str | None = None, *, dataset: str = "",
            limit: int | None = None) -> list[QAExample]:
    """Read a QA JSONL file (every line validated; errors name file:line and key), then apply the split."""
    path = Path(path)
    if not path.exists():
        raise QADataError(f"{path}: no such file")
    out, seen = [], {}
    for where, rec in iter_jsonl(path, QADataError):
        ex = example_from_record(rec, where, dataset or path.stem)
        if ex.id in seen:
            raise QADataError(f"{where}: duplicate id {ex.id!r} (first at line {seen[ex.id]})")
        seen[ex.id] = where.rsplit(":", 1)[1]
        out.append(ex)
    if not out:
        raise QADataError(f"{path}: empty (no QA records)")
    out = select(out, select_spec)
    if not out or limit == 0:
        raise QADataError(f"{path}: the selection {select_spec!r} (limit {limit}) leaves no questions")
    return out[:limit] if limit is not None else out
