"""The one data model of process supervision: scored candidate actions at a state, and what derives from them.

A `ProcessRecord` is one state s_t = (question, executed history) of one agent design, the exact prompt the policy
saw there, N candidate actions (raw text + parsed Action + tokens), a score per candidate from one source, and the
judge's rationale where there is one. Sources: "rank:<judge>" (RAG-Gym ranking, score = 1/(1+rank)), "rollout"
(Math-Shepherd mean outcome of M continuations), "mcts" (ReasonRAG SPRE Q values), "smartsearch" (S_t credit),
"oracle" (the synthetic world's gold chain).

Preference pairs (state, chosen, rejected, margin, source) and per-step labels derive from records; both are JSONL
so every trainer (SFT, DPO, critic Bradley–Terry) reads one format and tokenizes it into the existing fixed-shape
batches with the loss mask on the action tokens only (`jaxrag.train.batching`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

from jaxrag.env.mdp import Action, Episode, State, Step
from jaxrag.jsonl import iter_jsonl, write_jsonl
from jaxrag.train.batching import PreferencePair

# RAG-Gym code: chosen candidates have reward > 0.75, rejected < 0.5, at the same state.
CHOSEN_ABOVE, REJECTED_BELOW = 0.75, 0.5


@dataclass
class ScoredCandidate:
    raw: str  # the generated text (what the policy is trained to produce)
    action: Action  # the agent's parse of `raw`
    score: float | None = None  # the source's score; None = the judge failed on it (see `failure`)
    rank: int | None = None  # 0 = best, for ranking sources
    rationale: str = ""  # judge text, where there is one
    failure: str = ""  # why `score` is None (timeout, HTTP 500, unparseable reply ...)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    extra: dict = field(default_factory=dict)  # source-specific (rollout outcomes, node id, S_novel ...)


@dataclass
class ProcessRecord:
    qid: str
    question: str
    gold: list[str]
    agent: str  # the agent design whose format `prompt` and candidates are in
    history: list[Step]  # executed steps before this state
    prompt: str  # agent.render(state): exactly what the policy saw
    candidates: list[ScoredCandidate]
    source: str
    step: int = 0  # index of this state in its trajectory (= len(history))
    metadata: dict = field(default_factory=dict)  # question type/hops/split, tree node id, ...

    def state(self) -> State:
        return State(self.question, list(self.history), qid=self.qid)

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @staticmethod
    def from_json(d: dict) -> "ProcessRecord":
        d = dict(d)
        hist = Episode.from_json({"qid": "", "question": "", "gold": [], "steps": d.pop("history", [])}).steps
        cands = []
        for c in d.pop("candidates", []):
            c = dict(c)
            c["action"] = Action(**c["action"])
            cands.append(ScoredCandidate(**c))
        return ProcessRecord(history=hist, candidates=cands, **d)


@dataclass
class Pair:
    """A process-level preference pair at one state: `chosen` ≻ `rejected` (raw action texts)."""

    prompt: str
    chosen: str
    rejected: str
    margin: float
    source: str
    qid: str = ""
    step: int = 0

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def preference_pairs(
    record: ProcessRecord, chosen_above: float = CHOSEN_ABOVE, rejected_below: float = REJECTED_BELOW
) -> list[Pair]:
    """Every (score > chosen_above, score < rejected_below) combination at the record's state whose texts differ.
    Candidates without a score (judge failures) take part in no pair."""
    scored = [c for c in record.candidates if c.score is not None]
    out = []
    for hi in scored:
        if hi.score <= chosen_above:
            continue
        for lo in scored:
            if lo.score < rejected_below and lo.raw.strip() != hi.raw.strip():
                out.append(Pair(record.prompt, hi.raw, lo.raw, hi.score - lo.score, record.source, record.qid, record.step))
    return out


def step_labels(record: ProcessRecord) -> list[dict]:
    """Per-candidate labels {prompt, completion, score, source} (PRM regression / SFT filtering)."""
    return [
        {"prompt": record.prompt, "completion": c.raw, "score": c.score, "source": record.source, "qid": record.qid,
         "step": record.step}
        for c in record.candidates
        if c.score is not None
    ]


# ---------------------------------------------------------------------------------------------------- JSONL I/O
def write_records(path: str | Path, records: Iterable[ProcessRecord]) -> Path:
    return write_jsonl(path, (r.to_json() for r in records))


def read_records(path: str | Path) -> list[ProcessRecord]:
    out = []
    for where, rec in iter_jsonl(path):
        try:
            out.append(ProcessRecord.from_json(rec))
        except (TypeError, KeyError, ValueError) as e:
            raise ValueError(f"{where}: not a ProcessRecord: {e}") from e
    return out


def write_pairs(path: str | Path, pairs: Iterable[Pair]) -> Path:
    return write_jsonl(path, (p.to_json() for p in pairs))


def read_pairs(path: str | Path) -> list[Pair]:
    out = []
    for where, rec in iter_jsonl(path):
        try:
            out.append(Pair(**rec))
        except TypeError as e:
            raise ValueError(f"{where}: not a preference pair: {e}") from e
    return out


def pair_examples(pairs: Sequence[Pair], tokenizer, add_bos: bool = True):
    """Pairs -> jaxrag.train.batching.PreferencePair token ids (prompt masked, action tokens trained)."""
    out = []
    for p in pairs:
        prompt = tokenizer.encode(p.prompt, add_bos=add_bos)
        out.append(PreferencePair(prompt, tokenizer.encode(p.chosen), tokenizer.encode(p.rejected)))
    return out


def failure_kind(failure: str) -> str:
    """A judge failure's kind, for counting: 'candidate 0,1: HTTP 429 (Retry-After 2s); ...' -> 'HTTP 429',
    'timeout after 30s' -> 'timeout', 'unparseable reply: no score' -> 'unparseable reply'."""
    reason = failure.split("; ", 1)[0]
    if reason.startswith("candidate ") and ": " in reason:
        reason = reason.split(": ", 1)[1]
    head = reason.split(":", 1)[0].split(" (", 1)[0].strip()
    if head.startswith("HTTP"):
        return " ".join(head.split()[:2])
    return "timeout" if head.startswith("timeout") else head or "no reason given"


def judge_failures(records: Sequence[ProcessRecord]) -> dict:
    """{"states", "failed_states", "kinds": {kind: failed states}}: a state failed when a candidate has no score and
    a recorded failure (one judge call per state or per candidate; a state counts once, by its first failure)."""
    kinds: dict[str, int] = {}
    for rec in records:
        why = next((c.failure for c in rec.candidates if c.score is None and c.failure), None)
        if why is not None:
            kinds[failure_kind(why)] = kinds.get(failure_kind(why), 0) + 1
    return {"states": len(records), "failed_states": sum(kinds.values()),
            "kinds": dict(sorted(kinds.items(), key=lambda kv: (-kv[1], kv[0])))}


def failures_line(summary: dict) -> str:
    """'47 of 47 states failed (HTTP 500: 40, timeout: 7)' | '' when none failed."""
    if not summary["failed_states"]:
        return ""
    kinds = ", ".join(f"{k}: {n}" for k, n in summary["kinds"].items())
    return f"{summary['failed_states']} of {summary['states']} states failed ({kinds})"
