"""The credit audit: step-credit signals scored against replayed causal credit (docs/credit_audit.md).

An audit state is a ProcessRecord: a state of the policy's own episodes and candidate actions there. Its truth is
the replay (`replay`): each candidate executed, then M continuations of the current policy to an answer, with
common random numbers across the state's candidates; the EM and F1 of each continuation are kept. A signal is one
function over the audit states, returning a score per candidate (None where it has no opinion, e.g. SmartSearch's
credit of an answer); `SIGNALS` names those the project implements, each computed as its own stage computes it.
`score_signal` scores one signal against the replay (or against another signal, e.g. the oracle's label): pairwise
accuracy on the candidate pairs whose replay difference is resolved (its paired interval excludes 0), AUROC of good
vs bad actions (a candidate resolved above or below the state's on-policy value; the signal taken relative to its
mean over the state's policy samples, i.e. as an advantage), Spearman correlation per state, each with a bootstrap
interval over states.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from typing import Callable, Sequence

import jax
import numpy as np

from jaxrag.env.mdp import ANSWER, INVALID, QUERY, Episode, State, Step, answer_reward
from jaxrag.env.parsing import canon
from jaxrag.env.rollout import Candidate, RolloutConfig, rollout, select_first_valid
from jaxrag.losses import token_logprobs
from jaxrag.models.transformer import forward
from jaxrag.stage_fn import resolve_attr
from jaxrag.supervision import smartsearch as SS
from jaxrag.supervision.critic import score_records
from jaxrag.supervision.judges import judge_records
from jaxrag.supervision.mcts import MCTSConfig, expand_with, pair_value, run_mcts
from jaxrag.supervision.mcts_env import PolicyTreeEnv
from jaxrag.supervision.records import ProcessRecord, ScoredCandidate, failures_line, judge_failures
from jaxrag.supervision.rollout_values import RolloutValueConfig, rollout_values


@dataclasses.dataclass(frozen=True)
class AuditConfig:
    m: int = 32  # replay continuations per candidate
    temperature: float = 0.5  # the continuations' sampling temperature (the policy whose credit is audited)
    max_steps: int = 8
    k: int = RolloutConfig.k
    batch_size: int = 64  # live continuations per engine step
    max_new_tokens: int = 40
    seed: int = 0
    z: float = 1.96  # a pair is resolved when its paired replay difference's z-interval excludes 0
    continuous: bool = True  # through the policy's slot pool, where common random numbers apply (else lock-step)
    bootstrap: int = 1000  # resamples of the states for every interval

    def __post_init__(self):
        for key in ("m", "max_steps", "k", "batch_size", "max_new_tokens", "bootstrap"):
            if getattr(self, key) < 1:
                raise ValueError(f"AuditConfig.{key}={getattr(self, key)} must be >= 1")
        if self.m < 2:
            raise ValueError(f"AuditConfig.m={self.m}: a replay value's interval needs >= 2 continuations")


# ------------------------------------------------------------------------------------------------ audit states
class _Recorder:
    """The rollout engine's `select` hook: every state's candidates become a record; the policy's own first valid
    sample is executed, so the states are those the policy visits."""

    def __init__(self, agent, items: dict):
        self.agent, self.items, self.records = agent, items, []

    def __call__(self, states: Sequence[State], cands: Sequence[Sequence[Candidate]]) -> list[int]:
        for s, cs in zip(states, cands):
            item = self.items[s.qid]
            scored = [ScoredCandidate(raw=str(c.completion.text), action=c.action,
                                      token_ids=[int(x) for x in c.completion.token_ids],
                                      logprobs=[float(x) for x in c.completion.logprobs], extra={"origin": "policy"})
                      for c in cs]
            self.records.append(ProcessRecord(
                qid=s.qid, question=s.question, gold=list(item["golden_answers"]), agent=self.agent.name,
                history=list(s.history), prompt="", candidates=scored, source="policy", step=len(s.history),
                metadata=dict(item.get("metadata") or {})))
        return select_first_valid(states, cands)


def policy_states(policy, retriever, agent, questions: Sequence[dict], cfg: RolloutConfig) -> list[ProcessRecord]:
    """Every state of the policy's own episodes on `questions` (dicts: id, question, golden_answers, metadata), with
    cfg.n_candidates samples at cfg.temperature as candidates (origin "policy"); prompts as the policy saw them."""
    rec = _Recorder(agent, {str(q["id"]): q for q in questions})
    eps = rollout(policy, retriever, agent, list(questions), cfg, select=rec)
    by_qid = {ep.qid: ep for ep in eps}
    for r in rec.records:
        r.prompt = by_qid[r.qid].steps[r.step].prompt
    return rec.records


def distinct(rec: ProcessRecord) -> list[int]:
    """Indices of the record's candidates with distinct action texts (the first of each), the units scored."""
    seen, out = set(), []
    for i, c in enumerate(rec.candidates):
        key = canon(c.raw)
        if key not in seen:
            seen.add(key)
            out.append(i)
    return out


# -------------------------------------------------------------------------------------------------- the truth
def replay(policy, retriever, agent, records: Sequence[ProcessRecord], cfg: AuditConfig,
           stats: dict | None = None) -> list[ProcessRecord]:
    """Causal credit: every candidate executed and continued M times by the policy (rollout_values, common random
    numbers where the policy has a slot pool). Returns records with source "replay", score = mean EM and
    extra["em"], extra["f1"]: the M continuations' outcomes."""
    vc = RolloutValueConfig(m=cfg.m, temperature=cfg.temperature, metric="em", max_steps=cfg.max_steps, k=cfg.k,
                            batch_size=cfg.batch_size, max_new_tokens=cfg.max_new_tokens, seed=cfg.seed,
                            continuous=cfg.continuous, crn=cfg.continuous, answers=True)
    out = rollout_values(policy, retriever, agent, records, vc, stats=stats)
    for rec in out:
        for c in rec.candidates:
            c.extra["em"] = c.extra.pop("outcomes")
            c.extra["f1"] = [answer_reward(a, rec.gold, "f1") for a in c.extra.pop("answers")]
        rec.source = "replay"
    return out


def outcomes(rec: ProcessRecord, metric: str = "em") -> np.ndarray:
    """[distinct candidates, M] replay outcomes of a replayed record."""
    return np.asarray([rec.candidates[i].extra[metric] for i in distinct(rec)], np.float64)


def paired_interval(d: np.ndarray, z: float) -> tuple[float, float]:
    """(mean, z x standard error) of paired differences d [M]."""
    return float(d.mean()), float(z * d.std(ddof=1) / np.sqrt(len(d))) if len(d) > 1 else float("inf")


def resolved_sign(d: np.ndarray, z: float) -> int:
    """+1 / -1 when the paired differences' interval lies above / below 0, else 0 (unresolved)."""
    mean, half = paired_interval(d, z)
    return 0 if abs(mean) <= half or mean == 0 else (1 if mean > 0 else -1)


# ------------------------------------------------------------------------------------------------- the signals
@dataclasses.dataclass
class AuditContext:
    """What signals read: the policy and its world, the audit's settings, and the optional pieces a signal needs
    (None: that signal is unavailable and the audit says so)."""

    policy: object
    retriever: object
    agent: object
    cfg: AuditConfig
    judge: object = None  # the world's oracle (step labels; SmartSearch's usefulness)
    llm_judge: object = None  # an LLM judge (HttpJudge or LocalJudge) ranking candidates with RAG-Gym's prompt
    critic: object = None  # a CriticScorer (the Bradley–Terry critic, the PRM of best-of-N)
    rollout: RolloutValueConfig | None = None  # the supervision stage's rollout-value settings
    mcts: MCTSSignalConfig | None = None  # the mcts stage's search settings and the audit's budget
    cost: dict = dataclasses.field(default_factory=dict)  # signal -> {"policy_calls": ...}, where a signal counts
    cache: dict = dataclasses.field(default_factory=dict)  # what several signals read (the teacher-forced log-probs)


class Unavailable(Exception):
    """A signal's need is absent (no critic trained, no judge): reported, not fatal."""


Signal = Callable[[AuditContext, Sequence[ProcessRecord]], list]
SIGNALS: dict[str, Signal] = {}


def signal(name: str):
    def register(fn: Signal) -> Signal:
        SIGNALS[name] = fn
        return fn
    return register


def _scores(records: Sequence[ProcessRecord]) -> list[list[float | None]]:
    return [[c.score for c in r.candidates] for r in records]


@signal("random")
def random_signal(ctx: AuditContext, records):
    """Chance: a uniform draw per candidate (seeded)."""
    rng = np.random.default_rng([ctx.cfg.seed, 17])
    return [[float(x) for x in rng.random(len(r.candidates))] for r in records]


@signal("oracle")
def oracle_signal(ctx: AuditContext, records):
    """The world's step label (the supervision stage's annotator: 0/1 from the gold chain)."""
    if ctx.judge is None:
        raise Unavailable("no oracle judge")
    return _scores(judge_records(ctx.judge, records, kind="step_score"))


@signal("oracle_rank")
def oracle_rank_signal(ctx: AuditContext, records):
    """RAG-Gym's ranking annotator over the oracle's labels: one ranking of a state's candidates, score 1/(1+rank),
    so candidates the oracle labels alike are still ranked apart (ties by candidate order)."""
    if ctx.judge is None:
        raise Unavailable("no oracle judge")
    return _scores(judge_records(ctx.judge, records, kind="rank"))


@signal("llm_rank")
def llm_rank_signal(ctx: AuditContext, records):
    """RAG-Gym's ranking annotator with an LLM judge (its prompt, one ranking per state, score 1/(1+rank)): an
    HTTP endpoint where configured, else a local checkpoint. A state whose reply does not parse scores None."""
    if ctx.llm_judge is None:
        raise Unavailable("no LLM judge configured (an HTTP endpoint or a local checkpoint)")
    calls0 = getattr(ctx.llm_judge, "generate_calls", 0)
    out = judge_records(ctx.llm_judge, records, kind="rank")
    fails = judge_failures(out)
    name = getattr(ctx.llm_judge, "name", "")
    if records and fails["failed_states"] == len(records):
        raise Unavailable(f"judge {name} scored none of {len(records)} states ({failures_line(fails)})")
    ctx.cost["llm_rank"] = {"policy_calls": getattr(ctx.llm_judge, "generate_calls", 0) - calls0,
                            "judge": name, "failed_states": fails["failed_states"]}
    return _scores(out)


@signal("rollout")
def rollout_signal(ctx: AuditContext, records):
    """RAG-Gym's / Math-Shepherd's rollout value at the supervision stage's M, temperature and seed."""
    if ctx.rollout is None:
        raise Unavailable("no rollout-value settings")
    st: dict = {}
    out = rollout_values(ctx.policy, ctx.retriever, ctx.agent, records, ctx.rollout, stats=st)
    ctx.cost["rollout"] = {"policy_calls": st.get("policy_calls", 0)}
    return _scores(out)


@signal("critic")
def critic_signal(ctx: AuditContext, records):
    """The Bradley–Terry critic's score (the PRM that guides best-of-N), on each record's prompt."""
    if ctx.critic is None:
        raise Unavailable("no critic")
    return _scores(score_records(ctx.critic, records))


@dataclasses.dataclass(frozen=True)
class MCTSSignalConfig:
    """The mcts signal's settings: the mcts stage's search (MCTSConfig), sampling and seed, and the audit's budget."""

    search: MCTSConfig = MCTSConfig(value_scheme="paper")
    per_candidate: int = 2  # simulations per distinct candidate: a state's tree searches to this x its candidates
    temperature: float = 1.0  # expansions and rollouts (the mcts stage's)
    max_new_tokens: int = 40
    batch_size: int = 64
    seed: int = 0

    def __post_init__(self):
        self.search.validate()
        if self.per_candidate < 1:
            raise ValueError(f"MCTSSignalConfig.per_candidate={self.per_candidate} must be >= 1")


@signal("mcts")
def mcts_signal(ctx: AuditContext, records):
    """ReasonRAG's MCTS-SPRE value: per state, a tree grown to the state whose node there has the state's distinct
    candidates as children (evaluated as the search evaluates new children: an answer exactly, v·α^depth; a query
    by SPRE rollouts), then searched on with the mcts stage's settings to `per_candidate` x candidates simulations;
    a candidate's value is its node's pair value (Q under the "paper" scheme)."""
    if ctx.mcts is None:
        raise Unavailable("no MCTS settings")
    m = ctx.mcts
    policy = _CountingPolicy(ctx.policy)
    env = PolicyTreeEnv(policy, ctx.retriever, ctx.agent, k=ctx.cfg.k, temperature=m.temperature,
                        rollout_temperature=m.temperature, max_new_tokens=m.max_new_tokens, batch_size=m.batch_size,
                        seed=m.seed)
    trees, nodes = state_trees(env, records, m.search)
    search_states(env, trees, [len(n) for n in nodes], m)
    ctx.cost["mcts"] = {"policy_calls": policy.calls, "sampled_actions": env.sampled_actions}
    out = []
    for rec, tree, kids in zip(records, trees, nodes):
        value = {canon(rec.candidates[i].raw): pair_value(tree, node) for i, node in zip(distinct(rec), kids)}
        out.append([value[canon(c.raw)] for c in rec.candidates])
    return out


class _CountingPolicy:
    """The policy, counting its batched `generate` calls (the audit's unit of policy calls, as the rollout engine
    counts its steps); everything else is the policy's."""

    def __init__(self, policy):
        self._policy, self.calls = policy, 0

    def generate(self, *args, **kwargs):
        self.calls += 1
        return self._policy.generate(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._policy, name)


def state_trees(env: PolicyTreeEnv, records: Sequence[ProcessRecord], cfg: MCTSConfig) -> tuple[list, list[list]]:
    """One tree per record, grown along its history to its state (`PolicyTreeEnv.path_tree`: the state's node has
    the depth the search would give it), expanded with the record's distinct candidates (`distinct`'s order) by
    `expand_with`: each evaluated as run_mcts evaluates a new child. Returns the trees and each one's candidate
    nodes."""
    items, proposals = [], []
    for rec in records:
        tree, node = env.path_tree({"qid": rec.qid, "question": rec.question, "gold": rec.gold}, rec.history)
        items.append((tree, node))
        proposals.append([(rec.candidates[i].raw, _candidate_step(rec, rec.candidates[i])) for i in distinct(rec)])
    children = env.children(items, proposals, cfg.max_depth)
    nodes = expand_with(env, [(t, n, kids) for (t, n), kids in zip(items, children)], cfg)
    return [t for t, _ in items], nodes


def _candidate_step(rec: ProcessRecord, c: ScoredCandidate) -> Step:
    return Step(action=copy.deepcopy(c.action), prompt=rec.prompt, token_ids=list(c.token_ids),
                logprobs=list(c.logprobs))


def search_states(env: PolicyTreeEnv, trees: Sequence, n_candidates: Sequence[int], m: MCTSSignalConfig) -> None:
    """run_mcts on each state's tree up to its budget, `per_candidate` x its candidates simulations (the candidates'
    own evaluations included; as many rounds at most): trees of one budget are searched together."""
    groups: dict[int, list] = {}
    for tree, n in zip(trees, n_candidates):
        groups.setdefault(m.per_candidate * n, []).append(tree)
    for budget, group in sorted(groups.items()):
        run_mcts(env, group, dataclasses.replace(m.search, max_rollouts=budget, max_iterations=budget))


def _policy_logprobs(ctx: AuditContext, records) -> list[list[np.ndarray]]:
    """Per-token log-probs (T = 1) of every candidate under the policy, teacher-forced after its state's prompt;
    computed once per audit (logprob and confidence share it)."""
    key = ("logprobs", id(records))
    if key not in ctx.cache:
        ctx.cache[key] = teacher_forced_logprobs(ctx.policy, records, ctx.cfg.max_new_tokens)
    return ctx.cache[key]


@signal("logprob")
def logprob_signal(ctx: AuditContext, records):
    """The policy's log-probability of the action (sum over its tokens): the field's cheapest baseline."""
    return [[float(x.sum()) for x in row] for row in _policy_logprobs(ctx, records)]


@signal("confidence")
def confidence_signal(ctx: AuditContext, records):
    """The policy's confidence: the geometric-mean token probability of the action."""
    return [[float(np.exp(x.mean())) if len(x) else 0.0 for x in row] for row in _policy_logprobs(ctx, records)]


@signal("smartsearch")
def smartsearch_signal(ctx: AuditContext, records):
    """SmartSearch's step credit S_t = novel and useful (usefulness from the oracle) of a query; None for answers."""
    if ctx.judge is None:
        raise Unavailable("no usefulness judge")
    where = [(r, c) for r, rec in enumerate(records) for c, cand in enumerate(rec.candidates)
             if cand.action.kind == QUERY]
    hits = ctx.retriever.search([records[r].candidates[c].action.text for r, c in where], ctx.cfg.k) if where else []
    eps = []
    for (r, c), docs in zip(where, hits):
        rec = records[r]
        step = Step(action=rec.candidates[c].action, docs=list(docs[: ctx.cfg.k]))
        eps.append(Episode(qid=rec.qid, question=rec.question, gold=list(rec.gold), agent=rec.agent,
                           steps=list(rec.history) + [step], metadata=dict(rec.metadata)))
    credits = SS.assess(eps, ctx.judge)
    out: list[list[float | None]] = [[None] * len(rec.candidates) for rec in records]
    for (r, c), cr in zip(where, credits):
        out[r][c] = float(cr[-1].good)
    return out


def teacher_forced_logprobs(policy, records: Sequence[ProcessRecord], max_new_tokens: int,
                            batch_rows: int = 32) -> list[list[np.ndarray]]:
    """Per-token log-probs (temperature 1) of each candidate's tokens after its record's prompt, as the policy
    encodes prompts for sampling; a candidate without token ids (a teacher's or oracle's action) is tokenized from
    its text. Rows are padded to powers of two in length (few compiled shapes)."""
    seqs, spans = [], []
    for rec in records:
        p = policy.encode_prompt(rec.prompt, max_new_tokens)
        for c in rec.candidates:
            a = list(c.token_ids) or policy.tokenizer.encode(c.raw)
            a = a[: max(policy.cfg.max_seq_len - len(p), 0)]
            seqs.append(p + a)
            spans.append((len(p), len(p) + len(a)))
    fn = jax.jit(lambda params, tokens: token_logprobs(forward(policy.cfg, params, tokens), tokens))
    flat: list[np.ndarray] = [np.zeros(0, np.float32)] * len(seqs)
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
    for start in range(0, len(order), batch_rows):
        idx = order[start:start + batch_rows]
        cols = min(1 << (max(len(seqs[i]) for i in idx) - 1).bit_length(), policy.cfg.max_seq_len)
        tokens = np.full((batch_rows, cols), policy.cfg.pad_id, np.int32)
        for j, i in enumerate(idx):
            tokens[j, :len(seqs[i])] = seqs[i]
        lp = np.asarray(fn(policy.params, tokens))
        for j, i in enumerate(idx):
            flat[i] = lp[j, spans[i][0]:spans[i][1]]
    out, n = [], 0
    for rec in records:
        out.append(flat[n:n + len(rec.candidates)])
        n += len(rec.candidates)
    return out


def get_signal(name: str, where: str = "credit_audit.signals") -> Signal:
    """A signal of the table by name, or any function named "module.path:function" (a signal outside the package)."""
    if ":" in name:
        return resolve_attr(name, where, "signal function")
    if name not in SIGNALS:
        raise ValueError(f"{where}: unknown signal {name!r} (known: {', '.join(sorted(SIGNALS))}, or "
                         f"'module.path:function')")
    return SIGNALS[name]


def run_signal(name: str, ctx: AuditContext, records: Sequence[ProcessRecord]) -> dict:
    """{"values": per record per candidate (or None), "seconds", "policy_calls", and what else the signal counted
    (e.g. "sampled_actions")} | {"unavailable": why}."""
    fn = get_signal(name)
    t0 = time.perf_counter()
    try:
        values = fn(ctx, records)
    except Unavailable as e:
        return {"unavailable": str(e)}
    if len(values) != len(records) or any(len(v) != len(r.candidates) for v, r in zip(values, records)):
        raise ValueError(f"credit audit: signal {name!r} must return one score per candidate of every state")
    return {"policy_calls": 0, **ctx.cost.get(name, {}), "values": values, "seconds": time.perf_counter() - t0}


# --------------------------------------------------------------------------------------------------- scores
@dataclasses.dataclass
class StateView:
    """One audit state as the scores see it: its distinct candidates' truth (a sign per pair, a good/bad label per
    candidate) and a signal's values over the same candidates."""

    pairs: list[tuple[int, int, int, str]]  # (i, j, sign of truth i - j, decision kind), resolved pairs only
    n_pairs: int  # distinct candidate pairs, resolved or not
    labels: list[int]  # +1 good, -1 bad, 0 unresolved, per distinct candidate
    truth: np.ndarray  # [distinct] the truth's point values (Spearman)
    strata: dict  # the state's type, hops, step, kind
    own: list[int] = dataclasses.field(default_factory=list)  # the policy's own samples among the candidates
    tied: int = 0  # pairs with the same outcome in every continuation (no replay could order them)


def _kind(a, b) -> str:
    names = {QUERY: "search", ANSWER: "answer", INVALID: "invalid"}
    return "/".join(sorted((names.get(a.kind, a.kind), names.get(b.kind, b.kind))))


def state_kind(rec: ProcessRecord) -> str:
    """'answer' when every hop of the gold chain has been retrieved before this state, else 'search'."""
    seen = {d.doc_id for s in rec.history for d in s.docs}
    chain = rec.metadata.get("gold_chain") or []
    return "answer" if chain and all(h["passage_id"] in seen for h in chain) else "search"


def replay_views(records: Sequence[ProcessRecord], z: float, metric: str = "em") -> list[StateView]:
    """The replay's resolved pairs and good/bad labels. good/bad: the candidate's paired difference with the state's
    on-policy value (the mean over its policy-sampled candidates per continuation) resolved above/below 0."""
    views = []
    for rec in records:
        idx = distinct(rec)
        x = outcomes(rec, metric)
        own = [k for k, i in enumerate(idx) if rec.candidates[i].extra.get("origin", "policy") == "policy"]
        v = x[own].mean(axis=0) if own else x.mean(axis=0)
        pairs, n, tied = [], 0, 0
        for a in range(len(idx)):
            for b in range(a + 1, len(idx)):
                n += 1
                tied += bool(np.all(x[a] == x[b]))
                s = resolved_sign(x[a] - x[b], z)
                if s:
                    pairs.append((a, b, s, _kind(rec.candidates[idx[a]].action, rec.candidates[idx[b]].action)))
        labels = [resolved_sign(x[a] - v, z) for a in range(len(idx))]
        views.append(StateView(pairs, n, labels, x.mean(axis=1), _strata(rec), own, tied))
    return views


def label_views(records: Sequence[ProcessRecord], values: Sequence[Sequence[float | None]]) -> list[StateView]:
    """Views whose truth is a signal's own values (e.g. the oracle's label), over the same distinct candidates as
    `replay_views`: every pair it orders strictly counts; good/bad = above/below the state's mean value; a
    candidate it gives no value takes part in nothing."""
    views = []
    for rec, vals in zip(records, values):
        idx = distinct(rec)
        x = np.asarray([np.nan if vals[i] is None else vals[i] for i in idx], np.float64)
        ok = ~np.isnan(x)
        pairs = [(a, b, int(np.sign(x[a] - x[b])), _kind(rec.candidates[idx[a]].action, rec.candidates[idx[b]].action))
                 for a in range(len(idx)) for b in range(a + 1, len(idx)) if ok[a] and ok[b] and x[a] != x[b]]
        own = [a for a, i in enumerate(idx) if ok[a] and rec.candidates[i].extra.get("origin", "policy") == "policy"]
        m = x[own].mean() if own else (x[ok].mean() if ok.any() else 0.0)
        labels = [int(np.sign(v - m)) if o else 0 for v, o in zip(x, ok)]
        own = [a for a, i in enumerate(idx) if rec.candidates[i].extra.get("origin", "policy") == "policy"]
        views.append(StateView(pairs, int(ok.sum()) * (int(ok.sum()) - 1) // 2, labels, x, _strata(rec), own))
    return views


def _strata(rec: ProcessRecord) -> dict:
    return {"type": str(rec.metadata.get("type", "")), "hops": str(rec.metadata.get("hops", "")),
            "step": str(rec.step), "state": state_kind(rec)}


def _per_state(view: StateView, sig: Sequence[float | None], decision: str | None = None):
    """(correct, counted, ties) over the view's resolved pairs (of one decision kind) where the signal has values;
    a signal tie counts half (chance)."""
    c = n = t = 0.0
    for a, b, s, kind in view.pairs:
        if decision is not None and kind != decision:
            continue
        if sig[a] is None or sig[b] is None:
            continue
        n += 1
        d = sig[a] - sig[b]
        if d == 0:
            c += 0.5
            t += 1
        elif (d > 0) == (s > 0):
            c += 1
    return c, n, t


def _centered(view: StateView, sig: Sequence[float | None]) -> list[float | None]:
    """The signal minus its mean over the state's own policy samples (over all its valued candidates where it
    values none of them): its advantage estimate, comparable across states as the good/bad labels are."""
    vals = [x for x in sig if x is not None]
    own = [sig[a] for a in view.own if sig[a] is not None] or vals
    m = float(np.mean(own)) if own else 0.0
    return [None if x is None else x - m for x in sig]


def _auroc(pos: np.ndarray, neg: np.ndarray) -> float:
    """P(signal of a good action > of a bad one), ties half (Mann-Whitney)."""
    if not len(pos) or not len(neg):
        return float("nan")
    ranks = _avg_ranks(np.concatenate([pos, neg])) + 1   # 1-based, ties averaged
    return float((ranks[:len(pos)].sum() - len(pos) * (len(pos) + 1) / 2) / (len(pos) * len(neg)))


def _spearman(x: np.ndarray, y: np.ndarray) -> float | None:
    """Spearman's rho (average ranks); None where either side is constant."""
    if len(x) < 2 or np.all(x == x[0]) or np.all(y == y[0]):
        return None if np.all(y == y[0]) else 0.0
    rx, ry = _avg_ranks(x), _avg_ranks(y)
    return float(np.corrcoef(rx, ry)[0, 1])


def _avg_ranks(x: np.ndarray) -> np.ndarray:
    """0-based ranks of x, tied values sharing their mean rank."""
    order = x.argsort(kind="mergesort")
    r = np.empty(len(x))
    sx = x[order]
    i = 0
    while i < len(sx):
        j = i
        while j + 1 < len(sx) and sx[j + 1] == sx[i]:
            j += 1
        r[order[i:j + 1]] = (i + j) / 2
        i = j + 1
    return r


def score_signal(views: Sequence[StateView], signal_values: Sequence[Sequence[float | None]], *, n_boot: int = 1000,
                 seed: int = 0, breakdown: Sequence[str] = ("decision", "type", "hops", "state")) -> dict:
    """A signal against a truth. signal_values: per state, the signal's value per distinct candidate (in the
    view's order). Returns pairwise accuracy (ci: percentile bootstrap over states), AUROC of good vs bad, mean
    Spearman per state, counts, and the pairwise accuracy per stratum (decision: the pair's action kinds)."""
    rng = np.random.default_rng(seed)
    S = len(views)
    per = np.asarray([_per_state(v, s) for v, s in zip(views, signal_values)], np.float64).reshape(S, 3)
    centered = [_centered(v, s) for v, s in zip(views, signal_values)]
    pos = [[c[a] for a, lab in enumerate(v.labels) if lab > 0 and c[a] is not None] for v, c in zip(views, centered)]
    neg = [[c[a] for a, lab in enumerate(v.labels) if lab < 0 and c[a] is not None] for v, c in zip(views, centered)]
    rho = []
    for v, s in zip(views, signal_values):
        keep = [a for a in range(len(v.truth)) if s[a] is not None and not np.isnan(v.truth[a])]
        r = _spearman(np.asarray([s[a] for a in keep], np.float64), v.truth[keep]) if len(keep) >= 3 else None
        rho.append(np.nan if r is None else r)
    rho = np.asarray(rho)
    boots = rng.integers(0, S, size=(n_boot, S)) if S else np.zeros((0, 0), int)

    def acc(rows):
        c, n = per[rows, 0].sum(), per[rows, 1].sum()
        return c / n if n else np.nan

    def auc(rows):
        return _auroc(np.asarray([x for r in rows for x in pos[r]], np.float64),
                      np.asarray([x for r in rows for x in neg[r]], np.float64))

    def mean_rho(rows):
        x = rho[rows]
        x = x[~np.isnan(x)]
        return float(x.mean()) if len(x) else np.nan

    out = {"states": S, "pairs": int(per[:, 1].sum()), "ties": int(per[:, 2].sum()),
           "good": sum(map(len, pos)), "bad": sum(map(len, neg)),
           "spearman_states": int((~np.isnan(rho)).sum())}
    allrows = np.arange(S)
    for key, fn in (("accuracy", acc), ("auroc", auc), ("spearman", mean_rho)):
        point = fn(allrows)
        bs = np.asarray([fn(b) for b in boots]) if S else np.zeros(0)
        bs = bs[~np.isnan(bs)]
        out[key] = None if np.isnan(point) else float(point)
        out[key + "_ci"] = ([float(np.percentile(bs, 2.5)), float(np.percentile(bs, 97.5))]
                            if len(bs) and out[key] is not None else None)
    out["by"] = {}
    for dim in breakdown:
        groups = sorted({k for v in views for *_, k in v.pairs} if dim == "decision" else {v.strata[dim] for v in views})
        rows_of = {}
        for g in groups:
            if dim == "decision":
                pg = np.asarray([_per_state(v, s, g) for v, s in zip(views, signal_values)], np.float64).reshape(S, 3)
            else:
                pg = per * np.asarray([[v.strata[dim] == g] for v in views], np.float64)
            c_, n_ = pg[:, 0].sum(), pg[:, 1].sum()
            bs = np.asarray([pg[b, 0].sum() / pg[b, 1].sum() for b in boots if pg[b, 1].sum()])
            rows_of[g] = {"accuracy": float(c_ / n_) if n_ else None, "pairs": int(n_),
                          "accuracy_ci": [float(np.percentile(bs, 2.5)), float(np.percentile(bs, 97.5))]
                          if len(bs) and n_ else None}
        out["by"][dim] = rows_of
    return out


def on_distinct(records: Sequence[ProcessRecord], values: Sequence[Sequence]) -> list[list]:
    """A signal's values per record, kept at the record's distinct candidates (the views' order)."""
    return [[vals[i] for i in distinct(rec)] for rec, vals in zip(records, values)]
