"""What every retriever returns (Hit) and promises (Retriever.search), plus the shared id -> Hit plumbing."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Protocol, Sequence, runtime_checkable

from jaxrag.retrieval.corpus import Passage


class RetrievalIndexError(RuntimeError):
    """A missing or corrupt index; the message names the path."""


@dataclasses.dataclass(frozen=True)
class Hit:
    doc_id: str
    score: float
    title: str
    text: str


@runtime_checkable
class Retriever(Protocol):
    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        """Batched; outer list follows `queries`; an empty/whitespace query gets []."""
        ...


class Scorer(Protocol):
    """Backend that ranks passage indices for non-empty queries."""

    def search_ids(self, queries: list[str], k: int) -> list[list[tuple[int, float]]]: ...


@dataclasses.dataclass
class ScorerRetriever:
    """A Scorer over a passage list, turned into a Retriever."""

    scorer: Scorer
    passages: Sequence[Passage]

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        if isinstance(queries, str):
            raise TypeError("search() takes a list of queries, got a single str")
        out: list[list[Hit]] = [[] for _ in queries]
        live = [i for i, q in enumerate(queries) if q and q.strip()]
        if not live or k <= 0:
            return out
        ranked = self.scorer.search_ids([queries[i].strip() for i in live], min(k, len(self.passages)))
        for i, pairs in zip(live, ranked):
            out[i] = [self._hit(j, s) for j, s in pairs]
        return out

    def _hit(self, index: int, score: float) -> Hit:
        p = self.passages[index]
        return Hit(p.doc_id, float(score), p.title, p.text)


def require_file(path: Path, what: str) -> Path:
    if not path.exists():
        raise RetrievalIndexError(f"{what} not found: {path} (build it with `python -m jaxrag.retrieval.build`)")
    return path
