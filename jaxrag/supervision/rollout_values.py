"""Math-Shepherd rollout values (METHODS.md §5): value(s, a) = mean outcome of M continuations from (s, a).

For every candidate of every record: the candidate is executed as the next step (all candidate queries in one
batched `execute`: search, and summaries for designs that summarize), then M copies of that partial Episode are
continued to the end by ONE call of the rollout engine (`jaxrag.env.rollout.rollout`, temperature from config;
the engine batches every continuation of every candidate of every state together; `continuous`: through the
policy's slot pool, where the M copies of a candidate inserted together share one prefill). Outcome = F(final answer,
gold) with F = f1 | em | cem | acc (config). A terminal candidate needs no continuation: an answer's value is its
own outcome, an invalid action that ends the episode (max_invalid) is worth 0, as is a query on the last
allowed step. Output: one ProcessRecord per input record, source "rollout", score = value, extra["outcomes"] =
the M outcomes (extra["terminal"] = true when no continuation was run).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Sequence

from jaxrag.env.mdp import ANSWER, INVALID, QUERY, Episode, Step, answer_reward
from jaxrag.env.rollout import RolloutConfig, execute, rollout
from jaxrag.supervision.records import ProcessRecord, ScoredCandidate


@dataclasses.dataclass(frozen=True)
class RolloutValueConfig:
    m: int = 4  # continuations per candidate
    temperature: float = 1.0  # continuation sampling temperature
    metric: str = "f1"  # f1 | em | cem | acc
    max_steps: int = 10
    k: int = RolloutConfig.k  # documents per search (the engine's default)
    batch_size: int = 256  # live continuations per engine step
    max_new_tokens: int = 256
    summary_max_new_tokens: int = 256
    max_invalid: int = 1
    seed: int = 0
    continuous: bool = False  # the engine's continuous batching (RolloutConfig.continuous: a policy's slot pool)
    # common random numbers: continuation j of every candidate of record r draws from one stream (r x m + j), so two
    # candidates' values differ by what the action changed, not by sampling luck; needs `continuous` (the slot
    # pool's per-request keys); a policy without a pool falls back to lock-step, where streams are ignored
    crn: bool = False
    answers: bool = False  # keep every continuation's final answer in extra["answers"] (other metrics later)

    def __post_init__(self):
        for key in ("m", "max_steps", "k", "batch_size", "max_new_tokens", "max_invalid"):
            if getattr(self, key) < 1:
                raise ValueError(f"RolloutValueConfig.{key}={getattr(self, key)} must be >= 1")
        if self.metric not in ("f1", "em", "cem", "acc"):
            raise ValueError(f"RolloutValueConfig.metric={self.metric!r}: choose f1 | em | cem | acc")
        if self.crn and not self.continuous:
            raise ValueError("RolloutValueConfig.crn=True needs continuous=True (per-request keys of the slot pool)")


def _partial(rec: ProcessRecord, cand: ScoredCandidate) -> Episode:
    """The record's trajectory with `cand` as its next (not yet executed) step."""
    step = Step(action=cand.action, prompt=rec.prompt, token_ids=list(cand.token_ids), logprobs=list(cand.logprobs))
    return Episode(qid=rec.qid, question=rec.question, gold=list(rec.gold), agent=rec.agent,
                   choices=list(rec.metadata.get("choices", [])), steps=list(rec.history) + [step],
                   metadata={"record_step": rec.step})


def rollout_values(policy, retriever, agent, records: Sequence[ProcessRecord],
                   cfg: RolloutValueConfig = RolloutValueConfig(), *, summarizer=None,
                   stats: dict | None = None) -> list[ProcessRecord]:
    """Value every candidate of every record by M continuations; returns records with source "rollout"."""
    t0 = time.perf_counter()
    parts = [(r, c, _partial(rec, cand)) for r, rec in enumerate(records) for c, cand in enumerate(rec.candidates)]
    # execute every candidate query at once (retrieval, summaries)
    q = [p for p in parts if p[2].steps[-1].action.kind == QUERY]
    if q:
        execute([ep.state(len(ep.steps) - 1) for _, _, ep in q], [ep.steps[-1] for _, _, ep in q], retriever, agent,
                cfg.k, summarizer if summarizer is not None else policy,
                summary_max_new_tokens=cfg.summary_max_new_tokens, seed=cfg.seed + 7919)
    outcomes: dict[tuple[int, int], list[float]] = {}
    answers: dict[tuple[int, int], list] = {}
    terminal: set[tuple[int, int]] = set()
    live, keys = [], []
    for r, c, ep in parts:
        act = ep.steps[-1].action
        if act.kind == ANSWER:
            outcomes[(r, c)] = [answer_reward(act.text, ep.gold, cfg.metric, ep.choices)] * cfg.m
            answers[(r, c)] = [act.text] * cfg.m
        elif (act.kind == INVALID and ep.num_invalid >= cfg.max_invalid) or len(ep.steps) >= cfg.max_steps:
            outcomes[(r, c)] = [0.0] * cfg.m
            answers[(r, c)] = [None] * cfg.m
        elif cfg.crn:  # one stream per (record, continuation), shared by the record's candidates
            live += [dataclasses.replace(ep, metadata={**ep.metadata, "stream": r * cfg.m + j}) for j in range(cfg.m)]
            keys += [(r, c)] * cfg.m
            continue
        else:
            live += [ep] * cfg.m  # the engine continues a copy of each item
            keys += [(r, c)] * cfg.m
            continue
        terminal.add((r, c))
    rst: dict = {}
    if live:
        rcfg = RolloutConfig(k=cfg.k, max_steps=cfg.max_steps, batch_size=cfg.batch_size, n_candidates=1,
                             temperature=cfg.temperature, max_new_tokens=cfg.max_new_tokens,
                             summary_max_new_tokens=cfg.summary_max_new_tokens, reward=cfg.metric,
                             max_invalid=cfg.max_invalid, seed=cfg.seed, continuous=cfg.continuous)
        for key, ep in zip(keys, rollout(policy, retriever, agent, live, rcfg, summarizer=summarizer, stats=rst)):
            outcomes.setdefault(key, []).append(answer_reward(ep.answer, ep.gold, cfg.metric, ep.choices))
            answers.setdefault(key, []).append(ep.answer)
    out = []
    for r, rec in enumerate(records):
        cands = []
        for c, cand in enumerate(rec.candidates):
            vals = outcomes[(r, c)]
            extra = {**cand.extra, "outcomes": vals, "m": cfg.m, "metric": cfg.metric}
            if (r, c) in terminal:
                extra["terminal"] = True
            if cfg.answers:
                extra["answers"] = answers[(r, c)]
            cands.append(dataclasses.replace(cand, score=sum(vals) / len(vals), rank=None, rationale="", failure="",
                                             extra=extra))
        out.append(dataclasses.replace(rec, candidates=cands, source="rollout"))
    if stats is not None:
        stats.update({"candidates": len(parts), "continuations": len(live), "terminal_candidates": len(terminal),
                      "policy_calls": rst.get("policy_calls", 0), "engine_steps": rst.get("engine_steps", 0),
                      "total_s": time.perf_counter() - t0,
                      **({"idle_slot_share": rst["idle_slot_share"]} if "idle_slot_share" in rst else {})})
    return out
