"""Batched rollout engine: many episodes advance together, one padded policy call per step.

Each engine step: render the prompts of all live episodes -> one `policy.generate` call (n candidates
each) -> parse -> `select` one candidate per state -> one batched `retriever.search` for every query ->
one batched summarizer call (Search-o1 / Re²Search summaries, ReasonRAG grounding) -> update states;
finished episodes leave and pending ones refill the batch.

Knows only the Policy protocol (`generate(prompts, n, temperature, max_new_tokens, stop, seed) ->
list[list[Completion]]`) and the Retriever protocol (`search(queries, k) -> list[list[Hit]]`).

A policy that keeps sessions (`policy.keeps_sessions`, a JaxPolicy with session_slots: jaxrag.kv_sessions) gets
one session key per episode with each action call (n_candidates == 1 only) and `release(keys)` when episodes
finish: an episode's KV cache then lives across its turns and only what its prompt appends is prefilled.
"""
from __future__ import annotations

import copy
import dataclasses
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

from jaxrag.env.agents.base import Agent
from jaxrag.env.mdp import (ANSWER, INVALID, QUERY, Action, Doc, Episode, State, Step, answer_reward,
                            discounted_return)


@dataclass(frozen=True)
class RolloutConfig:
    k: int = 5                       # documents per search: THE default (every other config takes it from here)
    max_steps: int = 10              # actions per episode (RAG-Gym: 10)
    gamma: float = 1.0               # discount of the return
    batch_size: int = 32             # live episodes per engine step
    n_candidates: int = 1            # candidate actions sampled per state (best-of-N / supervision)
    temperature: float = 0.0
    max_new_tokens: int = 256
    summary_max_new_tokens: int = 256
    summary_temperature: float = 0.0
    reward: str = "auto"             # em | f1 | cem | acc | auto (acc for multiple choice, else f1)
    max_invalid: int = 1             # episode ends after this many Invalid actions
    seed: int = 0
    progress: bool = False


@dataclass
class Candidate:
    action: Action
    completion: Any                  # .text, .token_ids, .logprobs, .finish_reason

    def to_json(self) -> dict:
        c = self.completion
        return {"action": dataclasses.asdict(self.action), "token_ids": _ints(getattr(c, "token_ids", ())),
                "logprobs": _floats(getattr(c, "logprobs", ())), "finish_reason": str(getattr(c, "finish_reason", ""))}


Select = Callable[[Sequence[State], Sequence[Sequence[Candidate]]], Sequence[int]]


def _ints(xs) -> list[int]:
    return [int(x) for x in (xs if xs is not None else ())]


def _floats(xs) -> list[float]:
    return [float(x) for x in (xs if xs is not None else ())]


def select_first_valid(states: Sequence[State], cands: Sequence[Sequence[Candidate]]) -> list[int]:
    """Default selection: the first candidate that parsed to a query or answer (else the first)."""
    return [next((i for i, c in enumerate(cs) if c.action.kind != INVALID), 0) for cs in cands]


def prompt_fits(policy, max_new_tokens: int):
    """The policy's prompt-budget test for `agent.render(state, fits)`; None for a policy without a limit."""
    check = getattr(policy, "prompt_fits", None)
    return None if check is None else (lambda prompt: check(prompt, max_new_tokens))


def candidates(policy, agent: Agent, states: Sequence[State], n: int = 1, *, temperature: float = 0.0,
               max_new_tokens: int = 256, seed: int = 0, sessions: Sequence | None = None
               ) -> tuple[list[str], list[list[Candidate]]]:
    """N candidate actions for each state from ONE batched policy call: (prompts, candidates[state][n]).
    Over-long prompts are rendered shorter by the agent within the policy's budget (Agent.render).
    sessions: one key per state for a policy that keeps sessions (see the module doc)."""
    if not states:
        return [], []
    fits = prompt_fits(policy, max_new_tokens)
    prompts = [agent.render(s, fits) for s in states]
    extra = {} if sessions is None else {"sessions": list(sessions)}
    outs = policy.generate(prompts, n=n, temperature=temperature, max_new_tokens=max_new_tokens,
                           stop=list(agent.stop) or None, seed=seed, **extra)
    if len(outs) != len(prompts):
        raise ValueError(f"policy returned {len(outs)} completion lists for {len(prompts)} prompts")
    return prompts, [[Candidate(agent.parse(c.text), c) for c in out] for out in outs]


def search_docs(retriever, queries: Sequence[str], k: int) -> list[list[Doc]]:
    """One batched search; empty queries get no documents."""
    if not queries:
        return []
    hits = retriever.search(list(queries), k)
    if len(hits) != len(queries):
        raise ValueError(f"retriever returned {len(hits)} result lists for {len(queries)} queries")
    return [[Doc.of(h) for h in hs[:k]] for hs in hits]


def summarize(policy, agent: Agent, states: Sequence[State], steps: Sequence[Step], *, max_new_tokens: int = 256,
              temperature: float = 0.0, seed: int = 0) -> None:
    """Fill step.summary (Search-o1 summary / ReasonRAG evidence) for query steps, in one batched call."""
    if not steps:
        return
    fits = prompt_fits(policy, max_new_tokens)
    prompts = [agent.render_summary(s, st.action.text, st.docs, fits) for s, st in zip(states, steps)]
    outs = policy.generate(prompts, n=1, temperature=temperature, max_new_tokens=max_new_tokens,
                           stop=list(agent.summary_stop) or None, seed=seed)
    for st, p, out in zip(steps, prompts, outs):
        text = out[0].text if out else ""
        st.summary_prompt, st.summary_raw = p, text
        try:
            st.summary = agent.parse_summary(text)
        except Exception:  # a parser bug is recorded as a missing summary, never a crash
            st.summary = None


def execute(states: Sequence[State], steps: Sequence[Step], retriever, agent: Agent, k: int,
            summarizer=None, *, summary_max_new_tokens: int = 256, summary_temperature: float = 0.0,
            seed: int = 0) -> dict:
    """The IR environment: retrieve (and summarize) for every query step, batched. Returns phase seconds."""
    q_idx = [i for i, st in enumerate(steps) if st.action.kind == QUERY]
    t0 = time.perf_counter()
    docs = search_docs(retriever, [steps[i].action.text for i in q_idx], k)
    for i, d in zip(q_idx, docs):
        steps[i].docs = d
    t1 = time.perf_counter()
    if agent.summarizes and q_idx and summarizer is not None:
        summarize(summarizer, agent, [states[i] for i in q_idx], [steps[i] for i in q_idx],
                  max_new_tokens=summary_max_new_tokens, temperature=summary_temperature, seed=seed)
    t2 = time.perf_counter()
    for i in q_idx:
        steps[i].timing["retrieve_s"] = (t1 - t0) / len(q_idx)
        if agent.summarizes:
            steps[i].timing["summarize_s"] = (t2 - t1) / len(q_idx)
    return {"retrieve_s": t1 - t0, "summarize_s": t2 - t1, "queries": len(q_idx)}


# ---- episodes ----------------------------------------------------------------------------------------------
def _field(item, name, default=None):
    return item.get(name, default) if isinstance(item, dict) else getattr(item, name, default)


def new_episode(item, agent: Agent) -> Episode:
    """An empty Episode from a QA example (QAExample or dict); an Episode is continued as a copy."""
    if isinstance(item, Episode):
        return copy.deepcopy(item)
    qid = str(_field(item, "id", ""))
    choices = list(_field(item, "choices", None) or [])
    meta = {"dataset": _field(item, "dataset", ""), "supporting_titles": list(_field(item, "supporting_titles", None) or [])}
    refs = []
    if agent.uses_references:
        for i, c in enumerate(_field(item, "contexts", None) or []):
            refs.append(Doc(f"{qid}#{i}", 0.0, str(c.get("title", "")), str(c.get("text", ""))))
    ep = Episode(qid=qid, question=str(_field(item, "question", "")), gold=list(_field(item, "golden_answers", [])),
                 agent=agent.name, choices=choices, references=refs, metadata=meta)
    _set_gold_refs(ep)
    return ep


def _set_gold_refs(ep: Episode) -> None:
    sup = set(ep.metadata.get("supporting_titles", []))
    if ep.references:
        ep.metadata["gold_ref_ids"] = [i for i, d in enumerate(ep.references, 1) if d.title in sup]


def _finish(ep: Episode, cfg: RolloutConfig, done: str) -> None:
    ep.done = done
    ep.ret = discounted_return([s.reward for s in ep.steps], cfg.gamma)


def rollout(policy, retriever, agent: Agent, items: Iterable, cfg: RolloutConfig = RolloutConfig(), *,
            select: Select | None = None, summarizer=None, stats: dict | None = None,
            on_episode: Callable[[Episode], None] | None = None) -> list[Episode]:
    """Run every item (QA example or partial Episode) to the end; episodes come back in input order.

    select: picks one of the n candidates per state (a critic for best-of-N); default first valid.
    summarizer: the policy for summaries / grounding (default: `policy`, as ReasonRAG; RAG-Gym keeps
    an untuned summarizer). stats: filled with total seconds per phase and counts.
    """
    select = select or select_first_valid
    summarizer = summarizer if summarizer is not None else policy
    pending = list(enumerate(items))
    pending.reverse()
    total = len(pending)
    live: list[tuple[int, Episode]] = []
    done: dict[int, Episode] = {}
    st = {"generate_s": 0.0, "retrieve_s": 0.0, "summarize_s": 0.0, "policy_calls": 0, "engine_steps": 0,
          "generations": 0, "queries": 0}
    cuts_before = dict(getattr(agent, "prompt_cuts", {}))
    t_start = time.perf_counter()
    bar = _progress(total, cfg.progress)
    it = 0
    run = object()   # session keys (run, index): unique to this call
    keep = bool(getattr(policy, "keeps_sessions", False)) and cfg.n_candidates == 1
    while pending or live:
        # refill; ARENA without dataset paragraphs: the question's top-k documents are the references
        fresh = []
        while pending and len(live) < cfg.batch_size:
            idx, item = pending.pop()
            live.append((idx, new_episode(item, agent)))
            fresh.append(live[-1][1])
        need_refs = [ep for ep in fresh if agent.uses_references and not ep.references]
        if need_refs:
            t0 = time.perf_counter()
            for ep, docs in zip(need_refs, search_docs(retriever, [ep.question for ep in need_refs], cfg.k)):
                ep.references = docs
                _set_gold_refs(ep)
            st["retrieve_s"] += time.perf_counter() - t0

        states = []
        for _, ep in live:
            s = ep.state()
            s.must_answer = len(ep.steps) >= cfg.max_steps - 1
            states.append(s)
        steps: list[Step | None] = [None] * len(live)
        gen_idx = []
        for i, s in enumerate(states):
            fa = agent.first_action(s)
            if fa is not None:
                steps[i] = Step(action=fa, prompt="", timing={"generate_s": 0.0})
            else:
                gen_idx.append(i)

        t0 = time.perf_counter()
        prompts, cands = candidates(policy, agent, [states[i] for i in gen_idx], cfg.n_candidates,
                                    temperature=cfg.temperature, max_new_tokens=cfg.max_new_tokens,
                                    seed=cfg.seed + it,
                                    sessions=[(run, live[i][0]) for i in gen_idx] if keep else None)
        t_gen = time.perf_counter() - t0
        if gen_idx:
            st["policy_calls"] += 1
            st["generations"] += len(gen_idx) * cfg.n_candidates
        st["generate_s"] += t_gen
        picks = list(select([states[i] for i in gen_idx], cands)) if gen_idx else []
        for j, i in enumerate(gen_idx):
            c = cands[j][picks[j]]
            action = c.action
            if states[i].must_answer and action.kind == QUERY and action.extra.get("predicted_answer"):
                action = Action(ANSWER, action.extra["predicted_answer"], action.raw,
                                {**action.extra, "forced_by_max_steps": True})
            steps[i] = Step(action=action, prompt=prompts[j], token_ids=_ints(getattr(c.completion, "token_ids", ())),
                            prompt_ids=_ints(getattr(c.completion, "prompt_ids", ())),
                            logprobs=_floats(getattr(c.completion, "logprobs", ())),
                            finish_reason=str(getattr(c.completion, "finish_reason", "")),
                            timing={"generate_s": t_gen / len(gen_idx), "batch": len(gen_idx)},
                            candidates=[x.to_json() for n, x in enumerate(cands[j]) if n != picks[j]])

        ph = execute(states, steps, retriever, agent, cfg.k, summarizer,
                     summary_max_new_tokens=cfg.summary_max_new_tokens,
                     summary_temperature=cfg.summary_temperature, seed=cfg.seed + it + 7919)
        st["retrieve_s"] += ph["retrieve_s"]
        st["summarize_s"] += ph["summarize_s"]
        st["queries"] += ph["queries"]
        if agent.summarizes and ph["queries"]:
            st["policy_calls"] += 1

        still = []
        for (idx, ep), step in zip(live, steps):
            ep.steps.append(step)
            kind = step.action.kind
            if kind == ANSWER:
                ep.answer = step.action.text
                step.reward = answer_reward(ep.answer, ep.gold, cfg.reward, ep.choices)
                ep.reward = step.reward
                _finish(ep, cfg, "answer")
            elif kind == INVALID and ep.num_invalid >= cfg.max_invalid:
                _finish(ep, cfg, "invalid")
            elif len(ep.steps) >= cfg.max_steps:
                _finish(ep, cfg, "max_steps")
            if ep.done:
                if keep:
                    policy.release([(run, idx)])
                done[idx] = ep
                bar.update(1)
                if on_episode is not None:
                    on_episode(ep)
            else:
                still.append((idx, ep))
        live = still
        it += 1
    bar.close()
    st["engine_steps"] = it
    st["episodes"] = total
    for kind in ("shortened", "over_budget"):   # prompts the agent rendered shorter to fit the policy's budget
        st[f"prompts_{kind}"] = getattr(agent, "prompt_cuts", {}).get(kind, 0) - cuts_before.get(kind, 0)
    st["total_s"] = time.perf_counter() - t_start
    st["host_s"] = st["total_s"] - st["generate_s"] - st["retrieve_s"] - st["summarize_s"]
    if stats is not None:
        stats.update(st)
    return [done[i] for i in range(total)]


class _NoBar:
    def update(self, n):
        pass

    def close(self):
        pass


def _progress(total: int, on: bool):
    if not on:
        return _NoBar()
    from tqdm.auto import tqdm
    return tqdm(total=total, desc="episodes", unit="ep")
