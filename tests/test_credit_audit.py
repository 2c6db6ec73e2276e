"""The credit audit: replay values against a closed form, the scores against their definitions, every signal as its
own stage computes it, and the stage's outputs on the tiny pipeline's policy."""

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as scipy_stats

from jaxrag.data.synthetic import teacher as T
from jaxrag.env.agents import get_agent
from jaxrag.env.mdp import ANSWER, INVALID, QUERY, Action, Doc, Step
from jaxrag.supervision import credit_audit as CA
from jaxrag.supervision.records import ProcessRecord, ScoredCandidate, read_records
from jaxrag.testing import ScriptedPolicy, completion, cut_at_stop

ROOT = Path(__file__).resolve().parents[1]


def _record(cands, *, qid="q", gold=("paris",), meta=None, history=()):
    return ProcessRecord(qid=qid, question="where?", gold=list(gold), agent="react", history=list(history),
                         prompt="", candidates=cands, source="test",
                         metadata=meta or {"type": "1hop", "hops": 1, "gold_chain": []})


def _cand(kind, text, **extra):
    raw = f"{'search' if kind == QUERY else 'answer'}: {text}\n"
    return ScoredCandidate(raw=raw, action=Action(kind, text, raw), extra={"origin": "policy", **extra})


# ------------------------------------------------------------------------------------------------ the scores
def test_pairwise_accuracy_counts_resolved_pairs_and_a_tie_as_half():
    v = CA.StateView(pairs=[(0, 1, 1, "search/search"), (0, 2, 1, "answer/search"), (1, 2, -1, "answer/search")],
                     n_pairs=3, labels=[1, 0, -1], truth=np.array([0.9, 0.4, 0.5]),
                     strata={"type": "1hop", "hops": "1", "step": "0", "state": "search"}, own=[0, 1, 2])
    r = CA.score_signal([v], [[3.0, 1.0, 1.0]], n_boot=50)
    assert r["pairs"] == 3 and r["ties"] == 1
    assert r["accuracy"] == pytest.approx(2.5 / 3)
    assert r["by"]["decision"]["search/search"]["accuracy"] == 1.0
    assert r["by"]["decision"]["answer/search"]["accuracy"] == pytest.approx(0.75)
    # a signal with no value for a candidate leaves its pairs out
    r = CA.score_signal([v], [[3.0, None, 1.0]], n_boot=50)
    assert r["pairs"] == 1 and r["accuracy"] == 1.0


def test_auroc_and_spearman_equal_their_definitions():
    rng = np.random.default_rng(0)
    pos, neg = rng.integers(0, 5, 40).astype(float), rng.integers(0, 4, 30).astype(float)   # with ties
    brute = np.mean([(p > n) + 0.5 * (p == n) for p in pos for n in neg])
    assert CA._auroc(pos, neg) == pytest.approx(brute)
    x, y = rng.integers(0, 4, 9).astype(float), rng.random(9)
    assert CA._spearman(x, y) == pytest.approx(scipy_stats.spearmanr(x, y).statistic)
    assert CA._spearman(np.ones(4), y[:4]) == 0.0    # a constant signal orders nothing
    assert CA._spearman(y[:4], np.ones(4)) is None   # a state whose truth is constant is not scored


def _simulated_states(n_states=200, m=64, seed=1):
    """States whose candidates succeed with known probabilities; continuations share uniforms (common random
    numbers), as the replay's do."""
    rng = np.random.default_rng(seed)
    recs, probs = [], []
    for s in range(n_states):
        p = rng.random(4)
        u = rng.random(m)
        cands = [_cand(QUERY, f"q{s}-{i}", em=[float(x) for x in (u < p[i])], f1=[0.0] * m) for i in range(4)]
        recs.append(_record(cands, qid=f"s{s}"))
        probs.append(p)
    return recs, probs


def test_the_replay_itself_scores_one_and_a_random_signal_chance():
    recs, _ = _simulated_states()
    views = CA.replay_views(recs, z=1.96)
    assert sum(len(v.pairs) for v in views) > 600   # most pairs resolved at M = 64 with common random numbers
    truth = CA.on_distinct(recs, [[float(np.mean(c.extra["em"])) for c in r.candidates] for r in recs])
    r = CA.score_signal(views, truth, n_boot=200)
    assert r["accuracy"] == 1.0 and r["auroc"] == 1.0 and r["spearman"] > 0.95
    rnd = CA.on_distinct(recs, CA.random_signal(CA.AuditContext(None, None, None, CA.AuditConfig()), recs))
    r = CA.score_signal(views, rnd, n_boot=200)
    assert 0.45 < r["accuracy"] < 0.55 and 0.45 < r["auroc"] < 0.55 and abs(r["spearman"]) < 0.1
    assert r["accuracy_ci"][0] < 0.5 < r["accuracy_ci"][1]
    flipped = [[-x for x in row] for row in truth]
    assert CA.score_signal(views, flipped, n_boot=50)["accuracy"] == 0.0


def test_label_views_take_a_signal_as_the_truth():
    recs, _ = _simulated_states(n_states=20)
    labels = [[1.0, 0.0, 0.0, 1.0] for _ in recs]
    views = CA.label_views(recs, labels)
    assert all(len(v.pairs) == 4 for v in views)          # 2 x 2 strictly ordered pairs per state
    r = CA.score_signal(views, CA.on_distinct(recs, labels), n_boot=50)
    assert r["accuracy"] == 1.0


# --------------------------------------------------------------------------------- replay, a hand-built world
class _World:
    """One search finds the key passage ("good") or a useless one ("bad"); the policy then answers right with
    probability P[what it read], drawn per continuation."""

    P = {"good": 0.8, "bad": 0.3}

    def search(self, queries, k):
        return [[Doc(q, 1.0, q, "the key fact" if q == "good" else "nothing here")] for q in queries]


class _Policy:
    def __init__(self):
        self.rng = np.random.default_rng(0)

    def generate(self, prompts, *, n=1, temperature=0.0, max_new_tokens=128, stop=None, seed=0):
        out = []
        for p in prompts:
            pr = _World.P["good" if "the key fact" in p else "bad"]
            out.append([completion(cut_at_stop(
                "answer: paris\n" if self.rng.random() < pr else "answer: rome\n", stop)) for _ in range(n)])
        return out


def test_replay_values_equal_the_closed_form_of_a_hand_built_world():
    m = 400
    rec = _record([_cand(QUERY, "good"), _cand(QUERY, "bad"), _cand(ANSWER, "paris"), _cand(ANSWER, "rome")])
    cfg = CA.AuditConfig(m=m, temperature=1.0, max_steps=4, k=1, continuous=False)
    (out,) = CA.replay(_Policy(), _World(), get_agent("react", mode="plain"), [rec], cfg)
    em = [np.mean(c.extra["em"]) for c in out.candidates]
    for value, p in zip(em[:2], (0.8, 0.3)):   # continued: binomial estimates of the known rates
        assert abs(value - p) < 4 * np.sqrt(p * (1 - p) / m)
    assert em[2:] == [1.0, 0.0]                # answers are their own outcome, with no continuation
    assert all(len(c.extra["em"]) == len(c.extra["f1"]) == m for c in out.candidates)
    assert out.candidates[0].extra["f1"] == out.candidates[0].extra["em"]   # one-word answers: F1 = EM
    assert out.source == "replay" and out.candidates[0].score == pytest.approx(em[0])


def _mcts_settings(**kw):
    from jaxrag.supervision.mcts import MCTSConfig

    search = MCTSConfig(**{"max_depth": 4, "alpha": 0.9, "value_scheme": "paper", **kw.pop("search", {})})
    return CA.MCTSSignalConfig(**{"search": search, "temperature": 1.0, "max_new_tokens": 16, "batch_size": 256,
                                  "seed": 3, **kw})


@pytest.mark.parametrize("search", [False, True])
def test_mcts_values_are_spre_on_a_hand_built_world(search):
    """At a state after one step (a useless search): an answer's value is its exact leaf value v * alpha^depth with
    depth = the state's step + 1; with no budget left after the candidates' own evaluation, a query's value is the
    mean of its rollouts' SPRE values v * alpha^steps (the rollout ends with the answer at step 3), here 0.8 or 0.3
    times alpha^3 in expectation; a repeated text shares its node. With budget left, the search grows the tree
    below the candidates and the answers keep their exact values."""
    from jaxrag.supervision.mcts_env import PolicyTreeEnv

    r, alpha = 300, 0.9
    first = Step(action=Action(QUERY, "bad", "search: bad\n"), docs=_World().search(["bad"], 1)[0])
    rec = _record([_cand(QUERY, "good"), _cand(QUERY, "bad"), _cand(ANSWER, "paris"), _cand(ANSWER, "rome"),
                   _cand(QUERY, "good")], history=[first])
    rec.step = 1
    # the queries' r rollouts and the answers' one evaluation each exceed a budget of 1 per candidate
    m = _mcts_settings(search={"rollouts_per_node": 1 if search else r}, per_candidate=30 if search else 1)
    agent = get_agent("react", mode="plain")
    ctx = CA.AuditContext(_Policy(), _World(), agent, CA.AuditConfig(m=2, k=1, continuous=False), mcts=m)
    out = CA.run_signal("mcts", ctx, [rec])
    good, bad, right, wrong, again = out["values"][0]
    assert (right, wrong) == (alpha ** 2, 0.0) and again == good
    assert out["sampled_actions"] >= out["policy_calls"] == ctx.cost["mcts"]["policy_calls"] > 0

    env = PolicyTreeEnv(_Policy(), _World(), agent, k=1, temperature=1.0, rollout_temperature=1.0,
                        max_new_tokens=16, batch_size=256, seed=3)   # the signal's env, drawing the same samples
    (tree,), (kids,) = CA.state_trees(env, [rec], m.search)
    assert [n.depth for n in kids] == [rec.step + 1] * 4 and tree.used == (4 if search else 2 * r + 2)
    if search:
        CA.search_states(env, [tree], [4], m)
        assert tree.used >= 4 * 30 and max(n.depth for n in tree.nodes) > rec.step + 1
        assert kids[2].N > 1 and kids[2].Q == alpha ** 2   # re-visited, still exact
        return
    for node, value, p in zip(kids, (good, bad), (0.8, 0.3)):
        spre = [o["value"] * alpha ** o["steps"] for o in node.extra["rollouts"]]
        assert {o["steps"] for o in node.extra["rollouts"]} == {3} and len(spre) == r
        assert value == node.Q == pytest.approx(np.mean(spre), abs=1e-12)
        assert abs(value - p * alpha ** 3) < 4 * alpha ** 3 * np.sqrt(p * (1 - p) / r)


@pytest.mark.parametrize("agent", ["react", "reasonrag"])
def test_a_state_tree_is_the_path_the_search_grows_to_that_state(agent):
    """PolicyTreeEnv.path_tree rebuilds from an executed history the path run_mcts grew to that state: the same
    stages, depths, kinds, texts and steps (ReasonRAG's grounded query: a Grounding node, then its evidence node), so
    the state's depth counts tree steps as the search counts them."""
    from fakes import OverlapRetriever, Passage
    from jaxrag.supervision.mcts import REASONING, MCTSConfig, run_mcts
    from jaxrag.supervision.mcts_env import PolicyTreeEnv
    from jaxrag.testing import ScriptedPolicy

    def respond(prompt, j):   # evidence for ReasonRAG's grounding prompts; else search twice, then answer
        if agent == "reasonrag" and prompt.rstrip("\n").split("\n")[-1].startswith("doc:"):
            return f"evidence: ev{j}\n"
        n = prompt.count("\nsearch: ")
        return f"search: topic{(n + j) % 3} fact\n" if n < 2 else "answer: a0\n"

    passages = [Passage(f"p{i}", f"Title {i}", f"fact {i} about topic{i % 3}") for i in range(6)]
    env = PolicyTreeEnv(ScriptedPolicy(respond), OverlapRetriever(passages), get_agent(agent, mode="plain"), k=2)
    item = {"id": "q0", "question": "item 0 ?", "golden_answers": ["a0"]}
    [tree] = run_mcts(env, [item], MCTSConfig(max_iterations=30, rollouts_per_node=1, value_scheme="paper"))
    deepest = max((n for n in tree.nodes if n.stage == REASONING), key=lambda n: n.depth)
    assert deepest.depth >= (4 if agent == "reasonrag" else 2)
    rebuilt, node = env.path_tree(item, tree.history(deepest))

    def path(t, n):
        return [(x.stage, x.depth, x.kind, x.raw, x.prompt, x.action, x.step) for x in t.path(n)]

    assert path(rebuilt, node) == path(tree, deepest) and not node.expanded
    assert rebuilt.history(node) == tree.history(deepest)


# -------------------------------------------------------------------------------------- synthetic world parts
def test_oracle_action_follows_the_gold_chain():
    q = {"id": "x", "golden_answers": ["Oslo"], "metadata": {"type": "2hop", "gold_chain": [
        {"passage_id": "p1", "entity": "Ann", "relation": "born_in", "answer": "Bergen"},
        {"passage_id": "p2", "entity": "Bergen", "relation": "in_country", "answer": "Oslo"}]}}
    first = T.QUERY_TEMPLATES["born_in"][0].format(e="Ann")
    a = T.oracle_action(q, [])
    assert (a.kind, a.text) == ("query", first)
    missed = [T.TeacherStep(T.TeacherAction("query", first, {}), ["p9"])]   # issued, but the passage was not found
    assert T.oracle_action(q, missed).text == T.QUERY_TEMPLATES["born_in"][1].format(e="Ann")
    found = [T.TeacherStep(T.TeacherAction("query", first, {}), ["p1"])]
    assert T.oracle_action(q, found).text == T.QUERY_TEMPLATES["in_country"][0].format(e="Bergen")
    both = found + [T.TeacherStep(T.TeacherAction("query", "x", {}), ["p2"])]
    assert (T.oracle_action(q, both).kind, T.oracle_action(q, both).text) == ("answer", "Oslo")


def test_choose_states_spreads_over_strata():
    from jaxrag.pipelines.synthetic.credit_audit import choose_states

    recs = [_record([_cand(QUERY, "a")], qid=f"{t}{i}", meta={"type": t, "hops": 1, "gold_chain": []})
            for t, n in (("A", 10), ("B", 2), ("C", 5)) for i in range(n)]
    picked = choose_states(recs, 6, seed=0)
    assert sorted(r.metadata["type"] for r in picked) == ["A", "A", "B", "B", "C", "C"]
    assert len({r.qid for r in picked}) == 6
    assert choose_states(recs, 0, seed=0) == recs


# ------------------------------------------------------------------------------ on the tiny pipeline's policy
def _audit_config():
    spec = importlib.util.spec_from_file_location("credit_audit_config", ROOT / "configs/synthetic/credit_audit.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.get_config("tiny")


@pytest.fixture(scope="module")
def audit_run(synthetic_run, tmp_path_factory):
    """The credit audit stage on a copy of the session's tiny pipeline run (its SFT policy and critic; the shared
    run's folder stays as the other tests read it)."""
    import shutil

    from jaxrag.pipelines.synthetic.credit_audit import credit_audit_stage

    workdir = tmp_path_factory.mktemp("audit") / "run"
    shutil.copytree(synthetic_run[1], workdir, ignore=shutil.ignore_patterns(".xla_cache"))
    config = _audit_config()
    credit_audit_stage(config, workdir, "credit_audit")
    return config, Path(workdir)


def test_signals_compute_as_their_own_stages(audit_run):
    """On the supervision stage's dev states: the oracle signal is that stage's oracle label, the rollout signal its
    rollout values (same M, temperature, seed), the critic signal the agreement stage's critic scores, and the
    log-prob signal the sampler's own log-probs (the tiny preset samples those states at T = 1)."""
    from jaxrag.pipelines.synthetic.credit_audit import audit_context
    from jaxrag.pipelines.synthetic.world import load_tokenizer, make_retriever, stage_policy

    config, workdir = audit_run
    agree = workdir / "supervision" / "agreement"
    recs = read_records(agree / "records_oracle.jsonl")
    agent = get_agent("react", mode="plain")
    policy = stage_policy(workdir, "sft", load_tokenizer(workdir), config.get("sampler"))
    ctx = audit_context(config, workdir, "credit_audit", policy, make_retriever(config, workdir), agent,
                        CA.AuditConfig(max_new_tokens=config.supervision.max_new_tokens))

    def scores(path):
        return [[c.score for c in r.candidates] for r in read_records(path)]

    assert CA.oracle_signal(ctx, recs) == scores(agree / "records_oracle.jsonl")
    # RAG-Gym's ranking annotator over the same labels: 1/(1+rank), equal labels ranked apart by candidate order
    for rec, ranked in zip(recs, CA.oracle_rank_signal(ctx, recs)):
        labels = [c.score for c in rec.candidates]
        order = sorted(range(len(labels)), key=lambda i: (rec.candidates[i].action.kind == INVALID, -labels[i], i))
        assert ranked == [1.0 / (1 + order.index(i)) for i in range(len(labels))]
    assert CA.rollout_signal(ctx, recs) == scores(agree / "records_rollout.jsonl")
    np.testing.assert_allclose(np.concatenate(CA.critic_signal(ctx, recs)),
                               np.concatenate(scores(workdir / "agreement" / "records_critic.jsonl")), rtol=1e-5,
                               atol=1e-6)
    assert config.supervision.temperature == 1.0
    forced = CA.teacher_forced_logprobs(policy, recs, config.supervision.max_new_tokens)
    sampled = [np.asarray(c.logprobs) for r in recs for c in r.candidates]
    forced = [x for row in forced for x in row]
    assert sum(map(len, sampled)) > 50
    for f, s_ in zip(forced, sampled):
        np.testing.assert_allclose(f, s_, atol=2e-3)


class _ForcedRoot:
    """A TreeEnv: ReasonRAG's search over the policy (PolicyTreeEnv), except that expanding an audit state's node
    gives the state's candidates instead of samples (other nodes get the stage's max_children samples)."""

    def __init__(self, env, forced: dict, n: int):
        self.env, self.forced, self.n = env, forced, n

    def expand(self, items, n, max_depth):
        keys = [(id(t), nd.id) for t, nd in items]
        if any(k in self.forced for k in keys):
            assert all(k in self.forced for k in keys)   # the first round expands every state at once
            return self.env.children(items, [self.forced[k] for k in keys], max_depth)
        return self.env.expand(items, self.n, max_depth)

    def rollout(self, items, k, max_depth):
        return self.env.rollout(items, k, max_depth)


def test_mcts_signal_is_run_mcts_from_the_state(audit_run):
    """The mcts signal's value of every candidate is the Q that run_mcts itself gives that child when it searches
    from the state (its tree grown along the state's history, the same settings, seed and budget) and its expansion
    of the state yields the candidates: on the tiny policy's audit states with a common number of candidates."""
    import collections
    import dataclasses

    from jaxrag.env.parsing import canon
    from jaxrag.pipelines.synthetic.credit_audit import audit_context
    from jaxrag.pipelines.synthetic.world import load_tokenizer, make_retriever, stage_policy
    from jaxrag.supervision.mcts import pair_value, run_mcts
    from jaxrag.supervision.mcts_env import PolicyTreeEnv

    config, workdir = audit_run
    truth = read_records(workdir / "credit_audit" / "records_replay.jsonl")
    d, _ = collections.Counter(len(CA.distinct(r)) for r in truth).most_common(1)[0]
    recs = [r for r in truth if len(CA.distinct(r)) == d]   # one budget: the signal searches them together
    agent, retriever = get_agent("react", mode="plain"), make_retriever(config, workdir)
    policy = stage_policy(workdir, "sft", load_tokenizer(workdir), config.get("sampler"))
    ctx = audit_context(config, workdir, "credit_audit", policy, retriever, agent,
                        CA.AuditConfig(k=config.index.k, max_new_tokens=config.credit_audit.max_new_tokens))
    m = ctx.mcts
    assert m.search.max_depth == config.credit_audit.max_steps and m.per_candidate == config.supervision.rollout_m
    got = CA.mcts_signal(ctx, recs)

    env = PolicyTreeEnv(policy, retriever, agent, k=config.index.k, temperature=m.temperature,
                        rollout_temperature=m.temperature, max_new_tokens=m.max_new_tokens, batch_size=m.batch_size,
                        seed=m.seed)
    trees, forced, states = [], {}, []
    for rec in recs:
        tree, node = env.path_tree({"qid": rec.qid, "question": rec.question, "gold": rec.gold}, rec.history)
        assert node.depth == rec.step   # the react agent: one tree step per engine step
        forced[(id(tree), node.id)] = [(rec.candidates[i].raw, Step(action=rec.candidates[i].action, prompt=rec.prompt))
                                       for i in CA.distinct(rec)]
        trees.append(tree)
        states.append(node)
    budget = m.per_candidate * d
    # run_mcts keeps at most max_children of an expansion: room for the candidates; elsewhere the env samples the
    # stage's max_children
    cfg = dataclasses.replace(m.search, max_rollouts=budget, max_iterations=budget,
                              max_children=max(d, m.search.max_children))
    run_mcts(_ForcedRoot(env, forced, m.search.max_children), trees, cfg)
    grew = 0
    for rec, tree, node, row in zip(recs, trees, states, got):
        kids = tree.kids(node)
        want = {canon(k.raw): pair_value(tree, k) for k in kids}
        assert row == [want[canon(c.raw)] for c in rec.candidates]
        assert tree.used >= budget
        grew += any(tree.kids(k) for k in kids)
    assert grew > 0   # the search went on below the candidates
    assert ctx.cost["mcts"]["sampled_actions"] == env.sampled_actions > ctx.cost["mcts"]["policy_calls"] > 0


def test_common_random_numbers_give_equal_candidates_equal_continuations(audit_run):
    """Replay through the slot pool: a state's duplicated candidate is continued exactly as the original (the same
    streams); every continuation's EM and F1 is kept."""
    config, workdir = audit_run
    truth = read_records(workdir / "credit_audit" / "records_replay.jsonl")
    m = config.credit_audit.m
    dup = 0
    for rec in truth:
        by_text = {}
        for c in rec.candidates:
            assert len(c.extra["em"]) == len(c.extra["f1"]) == m
            if c.raw.strip() in by_text:   # the teacher's action equal to the oracle's (or a repeated sample)
                other = by_text[c.raw.strip()]
                assert (c.extra["em"], c.extra["f1"]) == (other.extra["em"], other.extra["f1"])
                dup += 1
            by_text[c.raw.strip()] = c
    assert dup > 0


def test_the_stage_reports_what_its_files_hold(audit_run):
    """results.json is the scores recomputed from the files the stage wrote (records_replay.jsonl, signals.jsonl);
    every state carries the teacher's and the oracle's action, the oracle's an answer exactly at answer states."""
    from jaxrag.jsonl import read_jsonl

    config, workdir = audit_run
    out = workdir / "credit_audit"
    res = json.loads((out / "results.json").read_text())
    truth = read_records(out / "records_replay.jsonl")
    sig = read_jsonl(out / "signals.jsonl")
    s = config.credit_audit
    assert 0 < res["states"] == len(truth) == len(sig) <= s.states
    for rec in truth:
        origin = [c.extra["origin"] for c in rec.candidates]
        assert origin == ["policy"] * s.n_candidates + ["teacher", "oracle"]
        assert (rec.candidates[-1].action.kind == ANSWER) == (CA.state_kind(rec) == "answer")
    views = CA.replay_views(truth, s.z)
    assert res["resolved_pairs"] == sum(len(v.pairs) for v in views) and res["pairs"] == sum(v.n_pairs for v in views)
    assert set(res["signals"]) == set(s.signals)
    assert res["signals"]["llm_rank"] == {"unavailable": "no LLM judge configured (an HTTP endpoint or a local "
                                                         "checkpoint)"}   # the tiny preset names none
    for name in [n for n in s.signals if n != "llm_rank"]:
        got = res["signals"][name]["replay"]
        want = CA.score_signal(views, CA.on_distinct(truth, [row[name] for row in sig]), n_boot=s.bootstrap,
                               seed=config.seed + 13)
        assert (got["accuracy"], got["pairs"], got["auroc"]) == (want["accuracy"], want["pairs"], want["auroc"])
    band = res["chance"]["all"]   # 200 random signals on the same pairs: chance's spread
    assert band["draws"] == 200 and band["band"][0] <= 0.5 <= band["band"][1] and abs(band["mean"] - 0.5) < 0.1
    text = (out / "results.md").read_text()
    assert all(f"| {name} |" in text for name in s.signals)
    assert (out / "credit_audit.png").stat().st_size > 0


def test_llm_rank_is_a_judges_ranking_and_says_what_it_could_not_score():
    """llm_rank sends each state's candidates to the judge with RAG-Gym's ranking prompt and scores 1/(1+rank); a
    state whose reply does not parse scores None and is counted; a judge that parses nowhere makes the signal
    unavailable with the reason, not a row of n/a."""
    from jaxrag.supervision.judges import LocalJudge

    recs = [_record([_cand(QUERY, "capital of france"), _cand(ANSWER, "paris")], qid="a"),
            _record([_cand(QUERY, "who founded x"), _cand(QUERY, "x founder"), _cand(ANSWER, "bob")], qid="b")]

    def respond(prompt, j):
        return "no idea" if "founded" in prompt else '```json{"ranked_indices": [1, 0]}```'

    pol = ScriptedPolicy(respond)
    ctx = CA.AuditContext(None, None, None, CA.AuditConfig(), llm_judge=LocalJudge(pol, name="scripted",
                                                                                   max_retries=0))
    got = CA.run_signal("llm_rank", ctx, recs)
    assert got["values"] == [[0.5, 1.0], [None, None, None]]
    assert (got["judge"], got["failed_states"], got["policy_calls"]) == ("scripted", 1, 1)
    assert "capital of france" in pol.calls[0]["prompts"][0] and "ranked_indices" in pol.calls[0]["prompts"][0]
    ctx = CA.AuditContext(None, None, None, CA.AuditConfig(), llm_judge=LocalJudge(
        ScriptedPolicy(lambda p, j: "no idea"), name="mute", max_retries=0))
    got = CA.run_signal("llm_rank", ctx, recs)
    assert "unavailable" in got and got["unavailable"].startswith("judge mute scored none of 2 states (2 of 2")


def test_a_signal_is_named_by_the_table_or_by_module_and_function(tmp_path, monkeypatch):
    """The config check resolves every signal before any stage runs: a table name, or "module:function" from a
    file outside the package (then audited like any other); a wrong name stops with the key."""
    from jaxrag.pipelines.synthetic.credit_audit import check_audit

    (tmp_path / "my_signals.py").write_text(
        "def shorter(ctx, records):\n    return [[-len(c.raw) for c in r.candidates] for r in records]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    config = _audit_config()
    config.credit_audit.signals = ["oracle", "my_signals:shorter"]
    check_audit(config, "credit_audit")
    recs, _ = _simulated_states(n_states=3)
    got = CA.run_signal("my_signals:shorter", CA.AuditContext(None, None, None, CA.AuditConfig()), recs)
    assert got["values"] == [[-len(c.raw) for c in r.candidates] for r in recs]
    config.credit_audit.signals = ["oracle", "orcale"]
    with pytest.raises(ValueError, match=r"config.credit_audit.signals\[1\]: unknown signal 'orcale'"):
        check_audit(config, "credit_audit")
    config.credit_audit.signals = ["my_signals:nope"]
    with pytest.raises(Exception, match=r"config.credit_audit.signals\[0\]: module 'my_signals' has no signal"):
        check_audit(config, "credit_audit")
    config.credit_audit.signals, config.credit_audit.m = ["oracle"], 1
    with pytest.raises(ValueError, match=r"config.credit_audit.m: 1 must be >= 2"):
        check_audit(config, "credit_audit")
    config.credit_audit.signals, config.credit_audit.m, config.credit_audit.mcts_rollouts = ["mcts"], 2, 0
    with pytest.raises(ValueError, match=r"config.credit_audit.mcts_rollouts: 0 must be >= 1"):
        check_audit(config, "credit_audit")
    config.credit_audit.mcts_rollouts, config.credit_audit.mcts.search.alpha = 1, 0.0
    with pytest.raises(ValueError, match=r"config.credit_audit.mcts: MCTSConfig.alpha: must be in \(0, 1\]"):
        check_audit(config, "credit_audit")
    config.credit_audit.mcts.search.alpha, config.credit_audit.llm_judge.policy = 0.5, "stf"
    with pytest.raises(ValueError, match=r"config.credit_audit.llm_judge.policy: 'stf' is not a stage of this config"):
        check_audit(config, "credit_audit")
