"""How one RL step samples its groups: B questions in, B contiguous groups of exactly G episodes of one question out.

`sample_groups(gs, questions, rc, rcfg, stats)` dispatches on `RLConfig.group_rollout` to a strategy:
`independent` (default: G independent episodes per question, GRPO's) or `smartsearch_refine` (SmartSearch's
stage-3 "Query Aware Policy Optimization": a y0 per question, its bad queries refined and regenerated, expansion
sets of at most `refine_keep_m` appended until every group has G). `GroupSampler` holds what a strategy samples
with (policy, retriever, judge, refiner, the trainer's scorer).

Details (the rounds, paper vs released code, training the refiner's query tokens): docs/running.md,
"How a step samples its groups".
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable, Sequence

from jaxrag.env.mdp import Episode
from jaxrag.env.rollout import RolloutConfig, rollout
from jaxrag.rl.config import GROUP_ROLLOUTS
from jaxrag.supervision import smartsearch as SS
GROUP_KEY = "group_rollout"  # Episode.metadata: {"round", "set", "member"} of a refine-strategy episode
PHASES = ("generate_s", "retrieve_s", "summarize_s", "judge_s")


@dataclasses.dataclass
class GroupSampler:
    """What a strategy samples with. judge: usefulness (optional); refiner: a Judge answering "refine" requests
    (smartsearch_refine needs one; the paper's process-reward model does both). encode(prompt) -> the prompt ids the
    sampler would see; tokenize(text) -> ids of generated text; score([(prompt_ids, completion_ids)]) -> the current
    policy's log-probs of each completion id (refine_query_loss)."""
    policy: object
    retriever: object
    agent: object
    summarizer: object = None
    judge: object = None
    refiner: object = None
    encode: Callable[[str], list[int]] | None = None
    tokenize: Callable[[str], list[int]] | None = None
    score: Callable[[list[tuple[list[int], list[int]]]], list[list[float]]] | None = None


def _add(total: dict, part: dict) -> None:
    for k, v in part.items():
        if isinstance(v, (int, float)):
            total[k] = total.get(k, 0) + v


def independent(gs: GroupSampler, questions: Sequence, rc, rcfg: RolloutConfig, stats: dict) -> list[Episode]:
    """Each question G times in one rollout call (today's GRPO groups). With a usefulness judge, every episode's
    queries are credited (jaxrag.supervision.smartsearch.assess, ONE batched call): the S_t the composite reward
    reads, as SmartSearch's released reward asks its process-reward model about every trajectory."""
    items = [q for q in questions for _ in range(rc.group_size)]
    episodes = rollout(gs.policy, gs.retriever, gs.agent, items, rcfg, stats=stats, summarizer=gs.summarizer)
    if gs.judge is not None:
        tj = time.perf_counter()
        SS.assess(episodes, gs.judge)
        stats["judge_s"] = stats.get("judge_s", 0.0) + time.perf_counter() - tj
    return episodes


def round_seed(seed: int, rnd: int, phase: int) -> int:
    """Sampling seed of a refine round's y0 (phase 0) or regeneration (phase 1) rollout; round 0's y0 = `seed`."""
    return (seed + (2 * rnd + phase) * 1_000_033) % (2**31 - 1)


def expansion_sets(y0: Sequence[Episode], refined: Sequence[Episode], keep_m: int) -> list[list[Episode]]:
    """Per y0 (tagged metadata[GROUP_KEY]["set"] = its index), [y0] + its refined episodes in the order refine gave
    them (earliest refined step first), cut at M = keep_m."""
    sets = [[e] for e in y0]
    for ep in refined:
        sets[ep.metadata[GROUP_KEY]["set"]].append(ep)
    return [s[:keep_m] for s in sets]


def train_refined_query(gs: GroupSampler, episodes: Sequence[Episode]) -> None:
    """rc.refine_query_loss: give each refined step (action.extra["refined"], no generated ids) token ids of its
    text, the prompt ids the sampler would see and the current policy's own log-probs of them (one scoring call)."""
    if gs.encode is None or gs.tokenize is None or gs.score is None:
        raise ValueError("refine_query_loss needs the sampler's encode, tokenize and score (a JaxPolicy in train_rl)")
    todo = []
    for ep in episodes:
        at = ep.metadata.get(SS.REFINED_KEY, {}).get("step")
        if at is None:
            continue
        st = ep.steps[at]
        if st.token_ids:
            continue
        st.prompt_ids = list(gs.encode(st.prompt))
        st.token_ids = list(gs.tokenize(st.action.raw))
        st.finish_reason = "refined"
        todo.append(st)
    if todo:
        for st, lp in zip(todo, gs.score([(st.prompt_ids, st.token_ids) for st in todo])):
            st.logprobs = [float(x) for x in lp]


def smartsearch_refine(gs: GroupSampler, questions: Sequence, rc, rcfg: RolloutConfig,
                       stats: dict) -> list[Episode]:
    """SmartSearch's stage-3 groups (see the module docstring): y0 rounds, credit, refinement, ≤ M per set, until G."""
    if gs.refiner is None:
        raise ValueError("rl.group_rollout='smartsearch_refine' needs a refiner (the stage's `judge` section)")
    cfg = SS.SmartSearchConfig()
    t0 = time.perf_counter()
    groups: list[list[Episode]] = [[] for _ in questions]
    rnd = 0
    while True:
        short = [i for i, g in enumerate(groups) if len(g) < rc.group_size]
        if not short:
            break
        part: dict = {}
        y0 = rollout(gs.policy, gs.retriever, gs.agent, [questions[i] for i in short],
                     dataclasses.replace(rcfg, seed=round_seed(rcfg.seed, rnd, 0)), stats=part,
                     summarizer=gs.summarizer)
        _add(stats, part)
        for j, ep in enumerate(y0):
            ep.metadata[GROUP_KEY] = {"round": rnd, "set": j, "member": 0}
        tj = time.perf_counter()
        SS.assess(y0, gs.judge, cfg)
        stats["judge_s"] = stats.get("judge_s", 0.0) + time.perf_counter() - tj
        refined: list[Episode] = []
        if rc.refine_keep_m > 1:
            part = {}
            tr = time.perf_counter()
            out = SS.refine(y0, gs.refiner, gs.policy, gs.retriever, gs.agent,
                            dataclasses.replace(rcfg, seed=round_seed(rcfg.seed, rnd, 1)), summarizer=gs.summarizer,
                            keep_per_episode=rc.refine_keep_m - 1, stats=part)
            _add(stats, part)
            stats["judge_s"] += time.perf_counter() - tr - part.get("total_s", 0.0)
            stats["refine_requests"] = stats.get("refine_requests", 0) + out.requests
            stats["refine_failures"] = stats.get("refine_failures", 0) + len(out.failures)
            refined = out.episodes
        for j, s in enumerate(expansion_sets(y0, refined, rc.refine_keep_m)):
            g = groups[short[j]]
            for m, ep in enumerate(s[:rc.group_size - len(g)]):
                ep.metadata[GROUP_KEY] = {"round": rnd, "set": j, "member": m}
                g.append(ep)
        rnd += 1
    episodes = [ep for g in groups for ep in g]
    fresh = [ep for ep in episodes if SS.CREDIT_KEY not in ep.metadata]
    if fresh:  # refined episodes: their own credit, for the composite reward's S_t
        tj = time.perf_counter()
        SS.assess(fresh, gs.judge, cfg)
        stats["judge_s"] = stats.get("judge_s", 0.0) + time.perf_counter() - tj
    if rc.refine_query_loss:
        train_refined_query(gs, episodes)
    stats["refine_rounds"] = rnd
    stats["refined_episodes"] = sum(ep.metadata[GROUP_KEY]["member"] > 0 for ep in episodes)
    stats["total_s"] = time.perf_counter() - t0
    stats["host_s"] = stats["total_s"] - sum(stats.get(k, 0.0) for k in PHASES)
    return episodes


STRATEGIES: dict[str, Callable] = {"independent": independent, "smartsearch_refine": smartsearch_refine}
assert tuple(STRATEGIES) == GROUP_ROLLOUTS


def sample_groups(gs: GroupSampler, questions: Sequence, rc, rcfg: RolloutConfig, stats: dict) -> list[Episode]:
    """The step's B·G episodes by rc.group_rollout, as B contiguous groups of G (one question each)."""
    return STRATEGIES[rc.group_rollout](gs, questions, rc, rcfg, stats)
