"""RAG-Gym process-reward collection by ranking (METHODS.md §5; 001 §3; released rag_gym/algorithms/prm/rollout.py).

For many questions at once, the rollout engine (jaxrag.env.rollout.rollout) advances every live episode one step
per engine step: ONE batched policy call samples N candidates per live state (T = 1.0), the `select` hook below
sends every state's candidates to the judge in ONE batched judge call (kind "rank"), records a ProcessRecord per
state (source "rank:<judge>", score = 1/(1+rank), rank 0 = best) and executes the best-ranked candidate (the
engine retrieves for all selected queries in one batched search). `judge_kind="step_score"` asks for per-candidate
scores instead (e.g. the oracle's tie-aware 0/1: 1/(1+rank) would rank equally good candidates apart and pair them
against each other); the best-scored candidate (ties: candidate order) is executed. Episodes run to an answer or
max steps. Then only trajectories whose final answer passes the outcome threshold are kept (code: F1 > 0.75, strict;
EM for MedQA); the records of dropped trajectories are counted in stats, not returned.
A state whose judge call failed keeps its candidates with score None and the failure text (they take part in no
preference pair); the engine then executes the first valid candidate.
Pairs: `ranking_pairs(records)` = records.preference_pairs on each (reward > 0.75 vs < 0.5, same state), each
(chosen, rejected) text pair once per state as the released dpo.py (`RankingConfig.pair_dedup`).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Sequence

from jaxrag.env.mdp import INVALID, State, answer_reward
from jaxrag.env.rollout import Candidate, RolloutConfig, rollout, select_first_valid
from jaxrag.supervision.judge_protocol import JudgeRequest
from jaxrag.supervision.judges import candidate_notes, ranks_from_scores
from jaxrag.supervision.records import (CHOSEN_ABOVE, REJECTED_BELOW, Pair, ProcessRecord, ScoredCandidate,
                                        preference_pairs)


@dataclasses.dataclass(frozen=True)
class RankingConfig:
    n_candidates: int = 10  # N actions per state (RAG-Gym: 10)
    temperature: float = 1.0  # candidate sampling temperature (RAG-Gym: 1.0)
    max_steps: int = 10  # actions per trajectory (RAG-Gym: 10)
    k: int = RolloutConfig.k  # documents per search (the engine's default)
    batch_size: int = 64  # live trajectories per engine step
    max_new_tokens: int = 256
    summary_max_new_tokens: int = 256
    outcome_metric: str = "f1"  # f1 | em | cem | acc (RAG-Gym code: f1; em for MedQA)
    outcome_threshold: float = 0.75  # keep a trajectory iff outcome > threshold (code: F1 > 0.75)
    max_invalid: int = 1
    seed: int = 0
    judge_kind: str = "rank"  # "rank": RAG-Gym's ranking, score 1/(1+rank) | "step_score" / "usefulness": the
    #                           judge's own per-candidate scores (the oracle's tie-aware 0/1), ranks from them
    source: str = ""  # ProcessRecord.source; "" = "<judge_kind>:<judge name>" (e.g. "rank:gpt-4o")
    pair_dedup: bool = True  # ranking_pairs: each (chosen, rejected) text pair once per state (RAG-Gym's dpo.py)
    continuous: bool = False  # the engine's continuous batching (RolloutConfig.continuous: a policy's slot pool;
    #                           with the policy's pool_sessions, a state's N candidates continue its episode's cache)
    progress: bool = False  # the engine's episodes bar (RolloutConfig.progress)

    def __post_init__(self):
        for key in ("n_candidates", "max_steps", "k", "batch_size", "max_new_tokens", "max_invalid"):
            if getattr(self, key) < 1:
                raise ValueError(f"RankingConfig.{key}={getattr(self, key)} must be >= 1")
        if self.temperature < 0:
            raise ValueError(f"RankingConfig.temperature={self.temperature} must be >= 0")
        if self.outcome_metric not in ("f1", "em", "cem", "acc"):
            raise ValueError(f"RankingConfig.outcome_metric={self.outcome_metric!r}: choose f1 | em | cem | acc")
        if self.judge_kind not in ("rank", "step_score", "usefulness"):
            raise ValueError(f"RankingConfig.judge_kind={self.judge_kind!r}: choose rank | step_score | usefulness")


def _field(item, name, default=None):
    return item.get(name, default) if isinstance(item, dict) else getattr(item, name, default)


class _RankSelect:
    """The engine's `select` hook: judge every state's candidates in one call, record, pick rank 0."""

    def __init__(self, judge, agent, items: dict[str, object], kind: str, source: str):
        self.judge, self.agent, self.items, self.kind, self.source = judge, agent, items, kind, source
        self.records: list[ProcessRecord] = []
        self.calls, self.failures, self.seconds = 0, 0, 0.0

    def __call__(self, states: Sequence[State], cands: Sequence[Sequence[Candidate]]) -> list[int]:
        reqs = []
        for s, cs in zip(states, cands):
            item = self.items[s.qid]
            reqs.append(JudgeRequest(self.kind, s, [c.action for c in cs], list(_field(item, "golden_answers", [])),
                                     dict(_field(item, "metadata", None) or {})))
        t0 = time.perf_counter()
        results = self.judge.judge(reqs)
        self.seconds += time.perf_counter() - t0
        self.calls += 1
        if len(results) != len(reqs):
            raise ValueError(f"judge {self.judge.name!r} returned {len(results)} results for {len(reqs)} requests")
        fallback = select_first_valid(states, cands)
        picks = []
        for s, cs, req, res, fb in zip(states, cands, reqs, results, fallback):
            notes = candidate_notes(res, len(cs))
            ranks = (res.ranks or ranks_from_scores(res.scores)) if res.ok else None
            scored = []
            for i, c in enumerate(cs):
                comp = c.completion
                scored.append(ScoredCandidate(
                    raw=str(getattr(comp, "text", c.action.raw)), action=c.action,
                    score=res.scores[i] if res.ok else None, rank=ranks[i] if ranks else None,
                    rationale=notes[i], failure=res.failure,
                    token_ids=[int(x) for x in (getattr(comp, "token_ids", None) or ())],
                    logprobs=[float(x) for x in (getattr(comp, "logprobs", None) or ())]))
            meta = {k: v for k, v in req.metadata.items()}
            meta.update({"judge_attempts": res.attempts, "judge_seconds": res.seconds})
            if res.reply and not res.ok:
                meta["judge_reply"] = res.reply
            self.records.append(ProcessRecord(
                qid=s.qid, question=s.question, gold=list(req.gold), agent=self.agent.name, history=list(s.history),
                prompt="", candidates=scored, source=self.source, step=len(s.history), metadata=meta))
            if res.ok:
                picks.append(min(range(len(cs)), key=lambda i: (ranks[i], i)))
            else:
                self.failures += 1
                picks.append(fb)
        return picks


def collect_ranking(policy, retriever, agent, judge, questions: Sequence, cfg: RankingConfig = RankingConfig(), *,
                    summarizer=None, episodes: list | None = None) -> tuple[list[ProcessRecord], dict]:
    """RAG-Gym ranking collection over `questions` (QA dicts / QAExamples with id, question, golden_answers,
    metadata). Returns (records of kept trajectories, stats); `episodes`, when a list, receives every
    trajectory (kept or not) with `metadata["kept"]` and `metadata["outcome"]`."""
    qids = [str(_field(q, "id", "")) for q in questions]
    if len(set(qids)) != len(qids):
        dup = sorted({q for q in qids if qids.count(q) > 1})[:5]
        raise ValueError(f"collect_ranking: question ids must be unique (repeated: {dup})")
    sel = _RankSelect(judge, agent, dict(zip(qids, questions)), cfg.judge_kind,
                      cfg.source or f"{cfg.judge_kind}:{judge.name}")
    rcfg = RolloutConfig(k=cfg.k, max_steps=cfg.max_steps, batch_size=cfg.batch_size, n_candidates=cfg.n_candidates,
                         temperature=cfg.temperature, max_new_tokens=cfg.max_new_tokens,
                         summary_max_new_tokens=cfg.summary_max_new_tokens, reward=cfg.outcome_metric,
                         max_invalid=cfg.max_invalid, seed=cfg.seed, continuous=cfg.continuous, progress=cfg.progress)
    st: dict = {}
    eps = rollout(policy, retriever, agent, list(questions), rcfg, select=sel, summarizer=summarizer, stats=st)
    by_qid = {ep.qid: ep for ep in eps}
    kept_qids = set()
    for ep in eps:
        outcome = answer_reward(ep.answer, ep.gold, cfg.outcome_metric, ep.choices)
        ep.metadata["outcome"], ep.metadata["kept"] = outcome, outcome > cfg.outcome_threshold
        if ep.metadata["kept"]:
            kept_qids.add(ep.qid)
    for rec in sel.records:  # the exact prompt the policy saw at that state
        step = by_qid[rec.qid].steps[rec.step]
        rec.prompt = step.prompt
    kept = [r for r in sel.records if r.qid in kept_qids]
    if episodes is not None:
        episodes.extend(eps)
    n_states = len(sel.records)
    stats = {
        "questions": len(eps), "trajectories_kept": len(kept_qids), "trajectories_dropped": len(eps) - len(kept_qids),
        "states": n_states, "records_kept": len(kept), "records_dropped": n_states - len(kept),
        "judge_calls": sel.calls, "judge_failures": sel.failures, "judge_s": sel.seconds,
        "invalid_candidates": sum(c.action.kind == INVALID for r in sel.records for c in r.candidates),
        "policy_calls": st.get("policy_calls", 0), "engine_steps": st.get("engine_steps", 0),
        "generate_s": st.get("generate_s", 0.0), "retrieve_s": st.get("retrieve_s", 0.0),
        "total_s": st.get("total_s", 0.0),
    }
    stats["states_per_s"] = n_states / stats["total_s"] if stats["total_s"] > 0 else 0.0
    return kept, stats


def ranking_pairs(records: Sequence[ProcessRecord], chosen_above: float = CHOSEN_ABOVE,
                  rejected_below: float = REJECTED_BELOW, dedup: bool = True) -> list[Pair]:
    """Every (reward > 0.75, reward < 0.5) candidate combination at the same state, over all records.

    dedup (RAG-Gym's dpo.py, the default): each state's chosen and rejected texts are sets, so a candidate sampled
    twice gives its pairs once; False: one pair per sampled combination (a repeated candidate weighs more).
    A text that is both above and below (sampled twice, ranked apart) never pairs with itself: the released code
    pairs it with itself (an identical chosen and rejected, a zero DPO gradient); jaxrag leaves that pair out."""
    out = []
    for r in records:
        pairs = preference_pairs(r, chosen_above, rejected_below)
        if dedup:
            seen: set[tuple[str, str]] = set()
            pairs = [p for p in pairs if (p.chosen, p.rejected) not in seen and not seen.add((p.chosen, p.rejected))]
        out += pairs
    return out
