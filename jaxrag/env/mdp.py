"""The MDP of METHODS.md §1 as plain host-side records: State, Action, Step, Episode (+ JSONL I/O).

State s_t = (Q, H_t) with H_t the executed steps; an Action is one macro-action (query | answer | invalid);
an Episode is everything that happened: prompts, generations, parsed actions, retrieved docs, log-probs,
timings, the final answer and its reward. Episodes are the one record evaluation, supervision and training
data derive from, so they round-trip through JSONL exactly.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

from jaxrag import metrics
from jaxrag.jsonl import iter_jsonl, write_jsonl

QUERY, ANSWER, INVALID = "query", "answer", "invalid"
ACTION_KINDS = (QUERY, ANSWER, INVALID)


@dataclass(frozen=True)
class Doc:
    """One retrieved passage (same fields as jaxrag.retrieval.Hit; any Hit-like object converts)."""
    doc_id: str
    score: float = 0.0
    title: str = ""
    text: str = ""

    @staticmethod
    def of(hit: Any) -> "Doc":
        if isinstance(hit, Doc):
            return hit
        if isinstance(hit, dict):
            return Doc(str(hit.get("doc_id", hit.get("id", ""))), float(hit.get("score", 0.0)),
                       str(hit.get("title", "")), str(hit.get("text", hit.get("contents", ""))))
        return Doc(str(hit.doc_id), float(hit.score), str(hit.title), str(hit.text))


@dataclass(frozen=True)
class Action:
    """A parsed macro-action. `raw` (the generated text) is kept but not part of equality."""
    kind: str
    text: str = ""
    raw: str = field(default="", compare=False)
    extra: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.kind not in ACTION_KINDS:
            raise ValueError(f"Action.kind must be one of {ACTION_KINDS}, got {self.kind!r}")

    @staticmethod
    def invalid(raw: str, reason: str) -> "Action":
        return Action(INVALID, "", raw, {"error": reason})


@dataclass
class Step:
    """One executed step: the action, what produced it, and what the environment returned."""
    action: Action
    prompt: str = ""
    docs: list[Doc] = field(default_factory=list)          # D_t (empty unless action is a query)
    summary: str | None = None                             # Search-o1 summary / ReasonRAG evidence of D_t
    summary_prompt: str = ""
    summary_raw: str = ""
    token_ids: list[int] = field(default_factory=list)     # generated tokens of the action
    prompt_ids: list[int] = field(default_factory=list)    # the prompt ids the sampler saw (RL token rows)
    logprobs: list[float] = field(default_factory=list)    # their log-probs under the sampling policy
    finish_reason: str = ""
    reward: float = 0.0
    timing: dict = field(default_factory=dict)             # seconds per phase, amortized over the batch
    candidates: list[dict] = field(default_factory=list)   # the other sampled candidates (best-of-N)


@dataclass
class State:
    """s_t = (question, history). choices: MC options ('ABCD'[i]); references: ARENA's given paragraphs."""
    question: str
    history: list[Step] = field(default_factory=list)
    choices: tuple[str, ...] = ()
    references: tuple[Doc, ...] = ()
    qid: str = ""
    must_answer: bool = False       # set by the engine on the last allowed step

    @property
    def queries(self) -> list[str]:
        return [s.action.text for s in self.history if s.action.kind == QUERY]

    @property
    def searches(self) -> list[Step]:
        return [s for s in self.history if s.action.kind == QUERY]


@dataclass
class Episode:
    qid: str
    question: str
    gold: list[str]
    agent: str = ""
    choices: list[str] = field(default_factory=list)
    references: list[Doc] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    answer: str | None = None
    reward: float = 0.0
    ret: float = 0.0                 # Σ γ^{t-1} R_t
    done: str = ""                   # "answer" | "max_steps" | "invalid"
    metadata: dict = field(default_factory=dict)

    @property
    def num_searches(self) -> int:
        return sum(s.action.kind == QUERY for s in self.steps)

    @property
    def num_invalid(self) -> int:
        return sum(s.action.kind == INVALID for s in self.steps)

    def state(self, upto: int | None = None) -> State:
        """The state before step `upto` (default: the current state)."""
        hist = self.steps if upto is None else self.steps[:upto]
        return State(self.question, list(hist), tuple(self.choices), tuple(self.references), self.qid)

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @staticmethod
    def from_json(d: dict) -> "Episode":
        d = dict(d)
        steps = []
        for s in d.pop("steps", []):
            s = dict(s)
            s["action"] = Action(**s["action"])
            s["docs"] = [Doc(**x) for x in s.get("docs", [])]
            steps.append(Step(**s))
        refs = [Doc(**x) for x in d.pop("references", [])]
        return Episode(steps=steps, references=refs, **d)


def write_episodes(path: str | Path, episodes: Iterable[Episode], append: bool = False) -> Path:
    return write_jsonl(path, (ep.to_json() for ep in episodes), append=append)


def read_episodes(path: str | Path) -> list[Episode]:
    out = []
    for where, record in iter_jsonl(path):
        try:
            out.append(Episode.from_json(record))
        except (TypeError, KeyError, ValueError) as e:
            raise ValueError(f"{where}: not an Episode record: {e}") from e
    return out


def discounted_return(rewards: Sequence[float], gamma: float) -> float:
    """Σ_t γ^{t-1} R_t."""
    return float(sum(r * gamma**t for t, r in enumerate(rewards)))


def answer_reward(answer: str | None, gold: Sequence[str], metric: str = "f1",
                  choices: Sequence[str] = ()) -> float:
    """F(a, g(Q)) of METHODS.md §1: 'em' | 'f1' | 'cem' | 'acc' (multiple choice; letter or option text)."""
    if answer is None:
        return 0.0
    if metric == "acc" or (choices and metric == "auto"):
        return metrics.choice_accuracy(answer, gold, choices)
    fn = {"em": metrics.exact_match, "f1": metrics.f1_score, "cem": metrics.cover_exact_match,
          "auto": metrics.f1_score}.get(metric)
    if fn is None:
        raise ValueError(f"unknown reward metric {metric!r} (em | f1 | cem | acc | auto)")
    return float(fn(answer, gold))
