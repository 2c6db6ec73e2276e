"""Batched rollout engine: many episodes advance together, one padded policy call per step.

`rollout(policy, retriever, agent, items, RolloutConfig)` runs every item to the end: each step renders the live
episodes' prompts, makes one `policy.generate` call (n candidates each), `select`s one per state, runs one batched
`retriever.search` and one batched summarizer call, and refills the batch. It knows only the Policy and Retriever
protocols. A policy that keeps sessions keeps each episode's KV cache across turns; `RolloutConfig(continuous=True)`
runs the turns through the policy's continuous slot pool instead of lock-step.

Details (the engine step, sessions, continuous batching, keys, fallbacks): docs/continuous_batching.md,
"The rollout engine".
"""
from __future__ import annotations

import collections
import copy
import dataclasses
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

from tqdm.auto import tqdm

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
    episode_reward: bool = True      # ep.reward = the answer step's reward; False: the caller owns ep.reward (RL)
    max_invalid: int = 1             # episode ends after this many Invalid actions
    seed: int = 0
    progress: bool = False
    continuous: bool = False         # keep the decode batch full (policy.continuous; see the module doc)
    overlap: bool = False            # continuous: the host's work on finished turns runs during the next chunk


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


def pool_generate(policy, prompts: Sequence[str], n: int, *, slots: int, temperature: float = 0.0,
                  max_new_tokens: int = 256, stop: Sequence[str] | None = None, seed: int = 0) -> list[list]:
    """`policy.generate(prompts, n=n, ...)` through the policy's slot pool (`policy.continuous(slots, ...)`): request
    (i, j) draws with fold (i x n + j, 0). When the pool keeps sessions, prompt i's n rows park as one session's
    branches and are released at the end: a pool with a prefix cache keeps them as cached rows, which later requests
    extending prompt i + one of its completions fork from (MCTS: a node's children's rollouts)."""
    sess = policy.continuous(slots, temperature=temperature, max_new_tokens=max_new_tokens, stop=stop, seed=seed,
                             **({"group": n} if n > 1 else {}))
    keep = bool(getattr(sess, "keeps_sessions", False))
    keys = [object() for _ in prompts]
    for i, p in enumerate(prompts):
        for j in range(n):
            sess.submit((i, j), p, (i * n + j, 0), **({"session": keys[i]} if keep else {}))
    got = {}
    while sess.busy:
        got.update(sess.step())
    if keep:
        sess.release(keys)
    return [[got[(i, j)] for j in range(n)] for i in range(len(prompts))]


def candidates(policy, agent: Agent, states: Sequence[State], n: int = 1, *, temperature: float = 0.0,
               max_new_tokens: int = 256, seed: int = 0, sessions: Sequence | None = None, slots: int = 0
               ) -> tuple[list[str], list[list[Candidate]]]:
    """N candidate actions for each state from ONE batched policy call: (prompts, candidates[state][n]).
    Over-long prompts are rendered shorter by the agent within the policy's budget (Agent.render).
    sessions: one key per state for a policy that keeps sessions (see the module doc). slots > 0: through the
    policy's slot pool of that many slots instead (`pool_generate`)."""
    if not states:
        return [], []
    fits = prompt_fits(policy, max_new_tokens)
    prompts = [agent.render(s, fits) for s in states]
    if slots:
        outs = pool_generate(policy, prompts, n, slots=slots, temperature=temperature, max_new_tokens=max_new_tokens,
                             stop=list(agent.stop) or None, seed=seed)
        return prompts, [[Candidate(agent.parse(c.text), c) for c in out] for out in outs]
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


def _fill_references(fresh: Sequence[Episode], retriever, agent: Agent, k: int) -> float:
    """ARENA without dataset paragraphs: the question's top-k documents are the references (one batched search).
    Returns the seconds spent."""
    need = [ep for ep in fresh if agent.uses_references and not ep.references]
    if not need:
        return 0.0
    t0 = time.perf_counter()
    for ep, docs in zip(need, search_docs(retriever, [ep.question for ep in need], k)):
        ep.references = docs
        _set_gold_refs(ep)
    return time.perf_counter() - t0


def _state(ep: Episode, cfg: RolloutConfig) -> State:
    s = ep.state()
    s.must_answer = len(ep.steps) >= cfg.max_steps - 1
    return s


def _step(state: State, prompt: str, cands: Sequence[Candidate], pick: int, timing: dict) -> Step:
    """The Step of the picked candidate (the others recorded); at the last allowed step a query that carries a
    predicted answer becomes that answer."""
    c = cands[pick]
    action = c.action
    if state.must_answer and action.kind == QUERY and action.extra.get("predicted_answer"):
        action = Action(ANSWER, action.extra["predicted_answer"], action.raw,
                        {**action.extra, "forced_by_max_steps": True})
    return Step(action=action, prompt=prompt, token_ids=_ints(getattr(c.completion, "token_ids", ())),
                prompt_ids=_ints(getattr(c.completion, "prompt_ids", ())),
                logprobs=_floats(getattr(c.completion, "logprobs", ())),
                finish_reason=str(getattr(c.completion, "finish_reason", "")), timing=timing,
                candidates=[x.to_json() for n, x in enumerate(cands) if n != pick])


def _apply(ep: Episode, step: Step, cfg: RolloutConfig) -> bool:
    """Append the executed step (reward for an answer) and end the episode where it ends; True when it ended."""
    ep.steps.append(step)
    kind = step.action.kind
    if kind == ANSWER:
        ep.answer = step.action.text
        step.reward = answer_reward(ep.answer, ep.gold, cfg.reward, ep.choices)
        if cfg.episode_reward:
            ep.reward = step.reward
        _finish(ep, cfg, "answer")
    elif kind == INVALID and ep.num_invalid >= cfg.max_invalid:
        _finish(ep, cfg, "invalid")
    elif len(ep.steps) >= cfg.max_steps:
        _finish(ep, cfg, "max_steps")
    return bool(ep.done)


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
    if cfg.continuous and hasattr(policy, "continuous") and not agent.summarizes:
        return _rollout_continuous(policy, retriever, agent, items, cfg, select, stats, on_episode)
    pending = list(enumerate(items))
    pending.reverse()
    total = len(pending)
    live: list[tuple[int, Episode]] = []
    done: dict[int, Episode] = {}
    run_stats = _RunStats(agent, total, cfg.progress)
    st, bar = run_stats.st, run_stats.bar
    it = 0
    run = object()   # session keys (run, index): unique to this call
    keep = bool(getattr(policy, "keeps_sessions", False))   # at any n_candidates: a branch per candidate
    while pending or live:
        # refill; ARENA without dataset paragraphs: the question's top-k documents are the references
        fresh = []
        while pending and len(live) < cfg.batch_size:
            idx, item = pending.pop()
            live.append((idx, new_episode(item, agent)))
            fresh.append(live[-1][1])
        st["retrieve_s"] += _fill_references(fresh, retriever, agent, cfg.k)

        states = [_state(ep, cfg) for _, ep in live]
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
            steps[i] = _step(states[i], prompts[j], cands[j], picks[j],
                             {"generate_s": t_gen / len(gen_idx), "batch": len(gen_idx)})

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
            if _apply(ep, step, cfg):
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
    st["engine_steps"] = it
    return run_stats.finish(done, stats)


def _rollout_continuous(policy, retriever, agent: Agent, items: Iterable, cfg: RolloutConfig, select: Select,
                        stats: dict | None, on_episode) -> list[Episode]:
    """`rollout` through `policy.continuous` (the module doc): up to batch_size live episodes, each with at most one
    turn queued or decoding: its N = n_candidates requests (ids (episode, j)) in a pool of batch_size x N slots, the
    lock-step decode batch's rows, so a turn's candidates never wait for a slot. After every chunk the turns whose
    N candidates have all finished are parsed, selected (one `select` call over them), executed (one batched
    retrieval) and applied, and the next turns queued. Candidate j of episode e draws with fold (e x N + j, step):
    distinct per candidate, and (e, step) at N = 1. A continued Episode whose metadata names a "stream" s draws with
    (s x N + j, step) instead: callers give two episodes one stream for common random numbers (the credit audit's
    continuations of one state's candidates), and keep streams of episodes meant to differ apart."""
    N = cfg.n_candidates
    pending = collections.deque(enumerate(items))
    total = len(pending)
    sess = policy.continuous(cfg.batch_size * N, temperature=cfg.temperature, max_new_tokens=cfg.max_new_tokens,
                             stop=list(agent.stop) or None, seed=cfg.seed, **({"group": N} if N > 1 else {}))
    fits = prompt_fits(policy, cfg.max_new_tokens)
    keep = bool(getattr(sess, "keeps_sessions", False))   # the pool keeps each episode's rows (session i)
    live: dict[int, Episode] = {}
    waiting: dict[int, tuple[State, str]] = {}     # episode -> (state, prompt) of its queued or decoding turn
    got: dict[int, dict[int, tuple[Any, float]]] = {}   # episode -> candidate j -> (completion, its generate_s)
    done: dict[int, Episode] = {}
    run_stats = _RunStats(agent, total, cfg.progress)
    st, bar = run_stats.st, run_stats.bar

    def admit() -> list[int]:
        fresh = []
        while pending and len(live) < cfg.batch_size:
            idx, item = pending.popleft()
            live[idx] = new_episode(item, agent)
            fresh.append(idx)
        st["retrieve_s"] += _fill_references([live[i] for i in fresh], retriever, agent, cfg.k)
        return fresh

    def advance(idxs: list[int], states: list[State], steps: list[Step]) -> list[int]:
        """Execute the steps (one batched search) and apply them; the episodes that go on."""
        ph = execute(states, steps, retriever, agent, cfg.k, None)
        st["retrieve_s"] += ph["retrieve_s"]
        st["queries"] += ph["queries"]
        going = []
        for i, step in zip(idxs, steps):
            if _apply(live[i], step, cfg):
                done[i] = live.pop(i)
                if keep:
                    sess.release([i])
                bar.update(1)
                if on_episode is not None:
                    on_episode(done[i])
            else:
                going.append(i)
        return going

    def schedule(idxs: list[int]) -> None:
        """Queue each episode's next turn; a scripted first action (RAG's first query) is executed at once."""
        while idxs:
            scripted = []
            for i in idxs:
                s = _state(live[i], cfg)
                fa = agent.first_action(s)
                if fa is not None:
                    scripted.append((i, s, Step(action=fa, prompt="", timing={"generate_s": 0.0})))
                    continue
                prompt = agent.render(s, fits)
                stream = live[i].metadata.get("stream", i)
                for j in range(N):
                    sess.submit((i, j), prompt, (stream * N + j, len(live[i].steps)), *([i] if keep else []))
                waiting[i], got[i] = (s, prompt), {}
            if not scripted:
                return
            going = advance(*map(list, zip(*scripted)))
            idxs = going + admit()

    def process(finished: list, chunk_s: float) -> None:
        """Record the finished candidates (each with its share of the chunk's time); the turns whose N candidates
        are all in go on, selected together."""
        for (i, j), c in finished:
            got[i][j] = (c, chunk_s / len(finished))
        idxs = [i for i, cs in got.items() if len(cs) == N]
        if not idxs:
            return
        states, prompts = zip(*(waiting.pop(i) for i in idxs))
        turns = [got.pop(i) for i in idxs]
        cands = [[Candidate(agent.parse(turn[j][0].text), turn[j][0]) for j in range(N)] for turn in turns]
        picks = list(select(states, cands))
        steps = [_step(s, p, cs, k, {"generate_s": sum(t for _, t in turn.values()), "batch": cfg.batch_size})
                 for s, p, cs, k, turn in zip(states, prompts, cands, picks, turns)]
        st["generations"] += len(idxs) * N
        schedule(advance(idxs, list(states), steps) + admit())

    schedule(admit())
    finished, chunk_s = [], 0.0
    while live:
        t0 = time.perf_counter()
        launched = sess.launch()
        t_launch = time.perf_counter() - t0
        if cfg.overlap:   # the host's work on the last chunk's turns while this chunk decodes
            process(finished, chunk_s)
            finished = []
        t1 = time.perf_counter()
        new = sess.collect()
        chunk_s = t_launch + time.perf_counter() - t1
        st["generate_s"] += chunk_s
        st["engine_steps"] += int(launched)
        if not launched and not new and not finished and live and not sess.busy:
            raise RuntimeError(f"rollout(continuous): {len(live)} live episodes but no turn queued or decoding")
        finished += new
        if not cfg.overlap:
            process(finished, chunk_s)
            finished = []
    st["policy_calls"] = st["engine_steps"]
    st["idle_slot_share"] = float(getattr(sess, "idle_share", float("nan")))
    return run_stats.finish(done, stats)


class _RunStats:
    """One rollout call's counters and progress bar: seconds per phase, policy calls, the prompts the agent had to
    shorten during this call (agent.prompt_cuts is cumulative), and host time as what is left of the wall time."""

    def __init__(self, agent: Agent, total: int, progress: bool):
        self.agent, self.total, self.t_start = agent, total, time.perf_counter()
        self.cuts_before = dict(getattr(agent, "prompt_cuts", {}))
        self.st = {"generate_s": 0.0, "retrieve_s": 0.0, "summarize_s": 0.0, "policy_calls": 0, "engine_steps": 0,
                   "generations": 0, "queries": 0}
        self.bar = _progress(total, progress)

    def finish(self, done: dict[int, Episode], stats: dict | None) -> list[Episode]:
        """Close the bar, complete the counters (into `stats` if given); the episodes in input order."""
        self.bar.close()
        st = self.st
        st["episodes"] = self.total
        for kind in ("shortened", "over_budget"):   # prompts the agent rendered shorter to fit the policy's budget
            st[f"prompts_{kind}"] = getattr(self.agent, "prompt_cuts", {}).get(kind, 0) - self.cuts_before.get(kind, 0)
        st["total_s"] = time.perf_counter() - self.t_start
        st["host_s"] = st["total_s"] - st["generate_s"] - st["retrieve_s"] - st["summarize_s"]
        if stats is not None:
            stats.update(st)
        return [done[i] for i in range(self.total)]


class _NoBar:
    def update(self, n):
        pass

    def close(self):
        pass


def _progress(total: int, on: bool):
    if not on:
        return _NoBar()
    return tqdm(total=total, desc="episodes", unit="ep")
