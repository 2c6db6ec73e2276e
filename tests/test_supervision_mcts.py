"""ReasonRAG MCTS + SPRE on a deterministic toy environment (hand-computed N and Q), and on the real engine."""
import math

import pytest

from fakes import OverlapRetriever, Passage, ScriptedPolicy, SlotScripted
from jaxrag.env.agents import get_agent
from jaxrag.env.mdp import ANSWER, QUERY, Action
from jaxrag.supervision.judge_protocol import JudgeResult
from jaxrag.supervision.mcts import (GROUNDING, REASONING, TERMINAL, Child, MCTSConfig, Outcome, code_rewards, new_tree,
                                     read_trees,
                                     run_mcts, spre, tree_from_json, tree_pairs, tree_records, tree_to_json, uct_score,
                                     write_trees)
from jaxrag.supervision.mcts_env import PolicyTreeEnv


class ToyEnv:
    """Fixed children per node (keyed by the path of child texts) and fixed rollout outcomes; counts calls."""

    def __init__(self, children, outcomes):
        self.children, self.outcomes = children, outcomes
        self.expand_calls, self.rollout_calls = [], []

    @staticmethod
    def key(tree, node):
        return "/".join([tree.qid] + [n.raw for n in tree.path(node)[1:]])

    def expand(self, items, n, max_depth):
        self.expand_calls.append([self.key(t, nd) for t, nd in items])
        out = []
        for t, nd in items:
            kids = []
            for text, value in self.children[self.key(t, nd)][:n]:
                kind = ANSWER if value is not None else QUERY
                kids.append(Child(text, TERMINAL if value is not None else REASONING, Action(kind, text, text),
                                  prompt=f"prompt:{self.key(t, nd)}", value=value))
            out.append(kids)
        return out

    def rollout(self, items, k, max_depth):
        self.rollout_calls.append([self.key(t, nd) for t, nd in items])
        return [[Outcome(v, s) for v, s in self.outcomes[self.key(t, nd)][:k]] for t, nd in items]


# root q: A (query, one rollout v=0.6 in 2 steps), B (answer, F1 1.0); A: C (query, rollout v=1 in 3 steps), D (F1 0)
CHILDREN = {"q": [("A", None), ("B", 1.0)], "q/A": [("C", None), ("D", 0.0)], "q/A/C": [("E", 1.0), ("F", 0.5)]}
OUTCOMES = {"q/A": [(0.6, 2)], "q/A/C": [(1.0, 3)]}


def stats_by_text(tree):
    return {n.raw or "root": (n.N, pytest.approx(n.Q, abs=1e-9)) for n in tree.nodes}


def grow(cfg, iterations, qids=("q",)):
    env = ToyEnv({f"{qid}{k[1:]}": v for qid in qids for k, v in CHILDREN.items()},
                 {f"{qid}{k[1:]}": v for qid in qids for k, v in OUTCOMES.items()})
    trees = [new_tree({"id": qid, "question": "toy?", "golden_answers": ["b"]}) for qid in qids]
    snaps = []
    for _ in range(iterations):  # one iteration at a time: trees are grown in place
        run_mcts(env, trees, MCTSConfig(**{**cfg, "max_iterations": trees[0].iterations + 1}))
        snaps.append(stats_by_text(trees[0]))
    return env, trees, snaps


BASE = {"c": 1.414, "alpha": 0.9, "max_children": 2, "rollouts_per_node": 1}


def test_code_uct_hand_computed():
    _, _, snaps = grow({**BASE, "uct": "code"}, 3)
    # it1: A: 0.6·0.9² = 0.486 (N1); B: 1·0.9 = 0.9 (N1); root = mean = 0.693
    assert snaps[0] == {"root": (2, 0.693), "A": (1, 0.486), "B": (1, 0.9)}
    # it2: equal bonus sqrt(ln2/1) -> higher Q: B is re-visited (Terminal): N_B=2, root = (0.486+2·0.9)/3
    assert snaps[1] == {"root": (3, 0.762), "A": (1, 0.486), "B": (2, 0.9)}
    # it3: A 0.486+1.414·sqrt(ln3/1) = 1.9681 > B 0.9+1.414·sqrt(ln3/2) = 1.9480 -> expand A:
    # C: 1·0.9³ = 0.729, D: 0 (wrong answer), A = (0.729+0)/2 over N=1+2, root = (3·0.3645 + 2·0.9)/5
    assert snaps[2] == {"root": (5, 0.5787), "A": (3, 0.3645), "B": (2, 0.9), "C": (1, 0.729), "D": (1, 0.0)}


def test_paper_uct_hand_computed_and_diverges_from_code():
    _, _, snaps = grow({**BASE, "uct": "paper"}, 4)
    assert snaps[0] == {"root": (2, 0.693), "A": (1, 0.486), "B": (1, 0.9)}
    assert snaps[1] == {"root": (3, 0.762), "A": (1, 0.486), "B": (2, 0.9)}
    # it3: A 0.486+1.414·sqrt(3)/2 = 1.7106 < B 0.9+1.414·sqrt(3)/3 = 1.7164 -> B again (code chose A)
    assert snaps[2] == {"root": (4, 0.7965), "A": (1, 0.486), "B": (3, 0.9)}
    # it4: A 0.486+1.414·2/2 = 1.9 > B 0.9+1.414·2/4 = 1.607 -> expand A; root = (3·0.3645 + 3·0.9)/6
    assert snaps[3] == {"root": (6, 0.63225), "A": (3, 0.3645), "B": (3, 0.9), "C": (1, 0.729), "D": (1, 0.0)}


def test_uct_formulas_and_unvisited_first():
    tree = new_tree({"id": "x", "question": "?", "golden_answers": []})
    root = tree.root
    a = tree.add(root, stage=REASONING, depth=1)
    b = tree.add(root, stage=REASONING, depth=1)
    root.N, a.N, a.Q, b.N, b.Q = 5, 3, 0.5, 2, 0.1
    code, paper = MCTSConfig(uct="code", c=2.0), MCTSConfig(uct="paper", c=2.0)
    assert uct_score(code, root, a, [a, b]) == pytest.approx(0.5 + 2.0 * math.sqrt(math.log(5) / 3))
    assert uct_score(paper, root, a, [a, b]) == pytest.approx(0.5 + 2.0 * math.sqrt(5) / 4)
    b.N = 0
    assert uct_score(code, root, b, [a, b]) == math.inf
    assert uct_score(paper, root, b, [a, b]) == pytest.approx(0.1 + 2.0 * math.sqrt(3) / 1)


def test_spre_formula_and_visit_weighted_backup_modes():
    outs = [Outcome(1.0, 2), Outcome(0.5, 4), Outcome(0.0, 1)]
    assert spre(outs, 0.9) == pytest.approx([0.81, 0.5 * 0.9**4, 0.0])
    env = ToyEnv({"q": [("A", None), ("B", 1.0)], "q/A": [("C", None), ("D", 0.0)]},
                 {"q/A": [(o.value, o.steps) for o in outs], "q/A/C": [(1.0, 3)] * 3})
    trees = [new_tree({"id": "q", "question": "?", "golden_answers": ["b"]})]
    run_mcts(env, trees, MCTSConfig(alpha=0.9, rollouts_per_node=3, max_iterations=1))
    a = trees[0].nodes[1]
    assert (a.N, a.Q) == (3, pytest.approx((0.81 + 0.5 * 0.9**4) / 3))
    # force A's expansion, once per backup mode
    for mode, expect in (("children", (3 * 0.729 + 1 * 0.0) / 4),
                         ("all", (3 * a.Q + 3 * 0.729 + 0.0) / 7)):
        t = new_tree({"id": "q", "question": "?", "golden_answers": ["b"]})
        cfg = MCTSConfig(alpha=0.9, rollouts_per_node=3, max_iterations=1, backup=mode)
        run_mcts(env, [t], cfg)
        t.nodes[2].Q = -1.0  # make B unattractive so iteration 2 descends into A
        t.nodes[2].own_q = -1.0
        run_mcts(env, [t], MCTSConfig(alpha=0.9, rollouts_per_node=3, max_iterations=2, backup=mode))
        a2 = t.nodes[1]
        assert a2.N == 3 + 3 + 1 and a2.Q == pytest.approx(expect), mode


def test_batched_one_expand_and_one_rollout_call_per_iteration():
    qids = ("q1", "q2", "q3")
    env, trees, _ = grow({**BASE, "uct": "code"}, 3, qids)
    # it1: all three roots in one expand call, their three A children in one rollout call; it2: B re-visits only
    assert env.expand_calls == [["q1", "q2", "q3"], ["q1/A", "q2/A", "q3/A"]]
    assert env.rollout_calls == [["q1/A", "q2/A", "q3/A"], ["q1/A/C", "q2/A/C", "q3/A/C"]]
    assert [stats_by_text(t) for t in trees[1:]] == [stats_by_text(trees[0])] * 2
    stats = {}
    run_mcts(env, trees, MCTSConfig(**BASE, max_iterations=5), stats=stats)
    assert stats["iterations"] == 2 and stats["expand_calls"] <= 2 and stats["rollout_calls"] <= 2


def test_budget_depth_limit_and_judge_mixing():
    env = ToyEnv(CHILDREN, OUTCOMES)
    t = new_tree({"id": "q", "question": "toy?", "golden_answers": ["b"]})
    run_mcts(env, [t], MCTSConfig(**BASE, max_rollouts=3))
    assert t.used >= 3 and t.iterations <= 3
    # max_depth 1: the query child A becomes Terminal with no answer, no rollout is asked for. The released code
    # (value_scheme "code") gives it no reward: it counts its visit but the root's value is B's alone, and no pair;
    # the paper scheme scores it 0 and averages it in (root 0.45) and pairs B over it
    for scheme, root_q, root_n, n_pairs in (("code", 0.9, 2, 0), ("paper", 0.45, 2, 1)):
        env = ToyEnv(CHILDREN, OUTCOMES)
        t = new_tree({"id": "q", "question": "toy?", "golden_answers": ["b"]})
        run_mcts(env, [t], MCTSConfig(**BASE, max_depth=1, max_iterations=1, value_scheme=scheme))
        a = t.nodes[1]
        assert a.stage == TERMINAL and a.extra["terminal_reason"] == "max_depth" and not env.rollout_calls
        assert (t.root.N, t.root.Q, len(tree_pairs(t))) == (root_n, pytest.approx(root_q), n_pairs), scheme
        assert a.rewardless == (scheme == "code") and a.reward is None

    class FakeJudge:
        name = "fake"

        def __init__(self, fail):
            self.fail, self.requests = fail, []

        def judge(self, requests):
            self.requests += requests
            return [JudgeResult(None, failure="HTTP 500") if self.fail else JudgeResult([0.2]) for _ in requests]

    for fail, expect in ((False, 0.5 * 0.486 + 0.5 * 0.2), (True, 0.486)):
        judge = FakeJudge(fail)
        t = new_tree({"id": "q", "question": "toy?", "golden_answers": ["b"]})
        run_mcts(ToyEnv(CHILDREN, OUTCOMES), [t], MCTSConfig(**BASE, judge_weight=0.5, max_iterations=1), judge=judge)
        a = t.nodes[1]
        assert a.Q == pytest.approx(expect)
        assert [r.kind for r in judge.requests] == ["step_score"] and judge.requests[0].candidates[0].text == "A"
        assert judge.requests[0].gold == ["b"]
        assert a.judge_failure == ("HTTP 500" if fail else "")
    with pytest.raises(ValueError, match="judge_weight"):
        MCTSConfig(rollouts_per_node=0, judge_weight=0.5).validate()
    with pytest.raises(ValueError, match="MCTSConfig.uct"):
        MCTSConfig(uct="ucb").validate()
    with pytest.raises(ValueError, match="MCTSConfig.value_scheme"):
        MCTSConfig(value_scheme="both").validate()


def test_pair_filter_margin_and_text():
    t = new_tree({"id": "q", "question": "?", "golden_answers": ["b"]})
    root = t.root
    specs = [("search: x", QUERY, "x", 0.50), ("search: x2", QUERY, "x2", 0.505), ("answer: b", ANSWER, "b", 0.30),
             ("Reasoning... search: x", QUERY, "x", 0.10)]
    for raw, kind, text, q in specs:
        n = t.add(root, stage=REASONING, depth=1, raw=raw, action=Action(kind, text, raw), kind="action", prompt="P")
        n.N, n.Q = 1, q
    unvisited = t.add(root, stage=REASONING, depth=1, raw="search: y", action=Action(QUERY, "y"), kind="action")
    unvisited.Q = 0.9
    got = {(p.chosen, p.rejected): p.margin for p in tree_pairs(t)}
    # 0.50 vs 0.505: |ΔQ| < 0.01; "search: x" vs "Reasoning... search: x": same query text; unvisited: no pair
    assert got == pytest.approx({("search: x", "answer: b"): 0.2, ("search: x2", "answer: b"): 0.205,
                                 ("search: x2", "Reasoning... search: x"): 0.405,
                                 ("answer: b", "Reasoning... search: x"): 0.2})
    assert all(p.source == "mcts" and p.prompt == "P" and p.qid == "q" and p.step == 0 for p in tree_pairs(t))
    # exactly 0.01 apart is kept (the code skips only < 0.01)
    t.nodes[2].Q = 0.51
    assert ("search: x2", "search: x") in {(p.chosen, p.rejected) for p in tree_pairs(t)}


def test_tree_json_round_trip_and_records(tmp_path):
    env, trees, _ = grow({**BASE, "uct": "code"}, 4)
    t = trees[0]
    d = tree_to_json(t)
    back = tree_from_json(d)
    assert tree_to_json(back) == d
    path = write_trees(tmp_path / "trees.jsonl", trees)
    assert [tree_to_json(x) for x in read_trees(path)] == [d]
    recs = tree_records(t, agent="toy")
    assert [r.metadata["node"] for r in recs] == [0, 1]  # root and A (C is not expanded yet)
    root_rec = recs[0]
    assert root_rec.source == "mcts" and [c.raw for c in root_rec.candidates] == ["A", "B"]
    # value_scheme "code" (default): the pair value; A's only answered leaf is D (F1 0), C is not expanded yet
    assert [c.score for c in root_rec.candidates] == pytest.approx([0.0, 0.9])
    assert [c.extra["Q"] for c in root_rec.candidates] == pytest.approx([t.nodes[1].Q, 0.9])
    _, paper, _ = grow({**BASE, "uct": "code", "value_scheme": "paper"}, 4)
    scores = [c.score for c in tree_records(paper[0])[0].candidates]
    assert scores == pytest.approx([paper[0].nodes[1].Q, 0.9])
    (tmp_path / "bad.jsonl").write_text('{"qid": "x", "nodes": [{"id": 3}]}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1"):
        read_trees(tmp_path / "bad.jsonl")


# ---- the real environment: ReasonRAG (plain) over the rollout engine ------------------------------------------------
PASSAGES = [Passage(f"p{i}", f"Title {i}", f"fact {i} about topic{i % 3}") for i in range(12)]


def reasonrag_plain(prompt, j):
    """Grounding prompts end with doc lines; Reasoning: sample 0 searches once then answers, sample 1 answers 'no'."""
    if prompt.rstrip("\n").split("\n")[-1].startswith("doc:"):
        return f"evidence: ev{j}\n"
    qid = prompt.split("question: item ")[1].split(" ")[0]
    if prompt.count("\nsearch: ") == 0:
        return "search: topic1 fact\n" if j == 0 else "answer: no\n"
    return f"answer: a{qid}\n"


def test_policy_tree_env_batches_and_builds_grounding_nodes(tmp_path):
    items = [{"id": f"q{i}", "question": f"item {i} ?", "golden_answers": [f"a{i}"]} for i in range(3)]
    pol = ScriptedPolicy(reasonrag_plain)
    env = PolicyTreeEnv(pol, OverlapRetriever(PASSAGES), get_agent("reasonrag", mode="plain"), k=2)
    stats = {}
    trees = run_mcts(env, items, MCTSConfig(alpha=0.9, max_iterations=2, rollouts_per_node=2, value_scheme="paper"),
                     stats=stats)
    # iteration 1: ONE generate call holds all 3 roots x n=2
    assert len(pol.calls[0]["prompts"]) == 3 and pol.calls[0]["n"] == 2
    assert stats["expand_calls"] == 2 and stats["rollout_calls"] == 2 and env.calls["engine"] == 2
    # policy samples (the compute unit of the equal-budget study): 3 roots x 2 actions; evidence: 3 A-nodes x 2
    # rollout copies, then 3 x 2 extractions; rollout answers: 3 x 2 from A, then 6 evidence nodes x 2
    assert env.sampled == {"expand": 6, "evidence": 12, "rollout": 18} and env.sampled_actions == 36
    t = trees[0]
    a, b = t.kids(t.root)
    assert (a.stage, a.action.text, len(a.step.docs)) == (GROUNDING, "topic1 fact", 2)
    assert (b.stage, b.value, b.Q) == (TERMINAL, 0.0, 0.0)
    # rollouts from A: evidence, then the right answer: 3 tree steps -> v·α³
    assert a.samples == pytest.approx([0.9**3] * 2)
    # iteration 2 expanded A (UCT) into two evidence nodes, each with its rollouts (answer at step 3)
    ev = t.kids(a)
    assert [n.kind for n in ev] == ["evidence", "evidence"] and [n.step.summary for n in ev] == ["ev0", "ev1"]
    assert all(n.stage == REASONING and n.depth == 2 and n.Q == pytest.approx(0.9**3) for n in ev)
    assert t.history(ev[1])[-1].summary == "ev1" and t.history(a)[-1].summary is None
    # the grounding prompts of all 3 trees went out in one call
    ground_calls = [c for c in pol.calls if c["prompts"][0].rstrip("\n").split("\n")[-1].startswith("doc:")]
    assert any(len(c["prompts"]) == 3 and c["n"] == 2 for c in ground_calls)
    pairs = tree_pairs(t)
    assert [(p.chosen, p.rejected) for p in pairs] == [("search: topic1 fact\n", "answer: no\n")]
    # value_scheme "code" on the same tree: A's subtree holds no answered leaf (its values are rollouts), so A has
    # no reward and the released script makes no pair
    code = tree_from_json(tree_to_json(t))
    code.metadata["value_scheme"] = "code"
    code_rewards(code, 0.9)
    assert code.nodes[a.id].reward is None and code.root.reward == 0.0 and tree_pairs(code) == []
    recs = tree_records(t, "reasonrag")
    assert recs[0].history == [] and recs[1].history[-1].action.text == "topic1 fact"
    assert recs[1].candidates[0].action.extra["evidence"] == "ev0"
    back = read_trees(write_trees(tmp_path / "t.jsonl", trees))
    assert tree_to_json(back[0]) == tree_to_json(t) and back[0].history(back[0].nodes[ev[0].id])[-1].summary == "ev0"


def test_policy_tree_env_rollouts_through_the_continuous_pool_build_the_same_trees():
    """PolicyTreeEnv(continuous=True): the rollouts run through the policy's slot pool (expansions keep their
    batched candidates call) and every tree, value and pair is the lock-step env's."""
    items = [{"id": f"q{i}", "question": "w" * (i + 2) + " ?", "golden_answers": [f"a{i % 2}"]} for i in range(4)]

    def respond(prompt, j):
        q, n = prompt.splitlines()[0], prompt.count("\nsearch: ")
        return f"search: topic{(len(q) + j) % 3} fact" if n + j < 2 else f"answer: a{(len(q) + n + j) % 2}"

    def untimed(x):   # step timings are wall-clock seconds
        if isinstance(x, dict):
            return {k: untimed(v) for k, v in x.items() if k != "timing"}
        return [untimed(v) for v in x] if isinstance(x, list) else x

    cfg = MCTSConfig(alpha=0.9, max_iterations=3, rollouts_per_node=2)
    trees = {}
    for continuous, pol in ((False, ScriptedPolicy(respond)), (True, SlotScripted(respond))):
        env = PolicyTreeEnv(pol, OverlapRetriever(PASSAGES), get_agent("react", mode="plain"), k=2,
                            continuous=continuous)
        trees[continuous] = [untimed(tree_to_json(t)) for t in run_mcts(env, items, cfg)]
    assert trees[True] == trees[False]
    assert len({n["Q"] for t in trees[True] for n in t["nodes"]}) > 2   # values that differ between nodes
    assert pol.session.most > 1 and not pol.session.busy             # the last env's rollouts used the pool
    assert all(c["n"] == 2 for c in pol.calls)                       # only expansions called generate


def env_revisits(tree) -> int:
    return sum(n.visits - 1 for n in tree.nodes[1:] if n.stage == TERMINAL)


def test_code_scheme_judges_every_new_node_with_the_policy_as_judge():
    """configs/reasonrag/table3.py's search: value_scheme "code", the judge alone (the policy itself, 0-100 scale):
    every new node, Terminal answers included, is judged in one batched call per iteration; selection Q is the
    mean of the scores; the pair value comes from the answered leaves (the root's wrong answer "no": 0)."""
    from jaxrag.supervision.judges import LocalJudge
    from jaxrag.supervision.prompts import STEP_SCORE_SYSTEM, PromptOptions

    marker = STEP_SCORE_SYSTEM["code"][:40]

    def respond(prompt, j):
        return "So the score is 60" if marker in prompt else reasonrag_plain(prompt, j)

    pol = ScriptedPolicy(respond)
    env = PolicyTreeEnv(pol, OverlapRetriever(PASSAGES), get_agent("reasonrag", mode="plain"), k=2)
    judge = LocalJudge(pol, options=PromptOptions(step_score_variant="code"))
    cfg = MCTSConfig(alpha=0.9, max_iterations=3, rollouts_per_node=0, judge_weight=1.0, backup="all")
    [t] = run_mcts(env, [{"id": "q0", "question": "item 0 ?", "golden_answers": ["a0"]}], cfg, judge=judge)
    judged = [n for n in t.nodes[1:] if n.judge_score is not None]
    assert len(judged) == len(t.nodes) - 1 and all(n.judge_score == pytest.approx(0.6) for n in judged)
    # the code's root N counts its simulations: one per judged node or re-visit, the budget's unit
    assert t.root.Q == pytest.approx(0.6) and t.root.N == t.used == len(t.nodes) - 1 + env_revisits(t)
    a, b = t.kids(t.root)
    assert (b.stage, b.reward) == (TERMINAL, 0.0) and not env.calls["rollout"]
    assert t.metadata["value_scheme"] == "code" and t.root.reward is not None
