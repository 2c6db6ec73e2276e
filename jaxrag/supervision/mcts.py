"""ReasonRAG MCTS with Shortest Path Reward Estimation (002 §2.2, App. A; METHODS.md §5), batched over many trees.

`run_mcts(env, items, MCTSConfig)` grows one tree per question, every phase (select, expand, simulate, backup) one
batched call over all active trees; `expand_with` starts a search below the question. `value_scheme` "code" (the
released code, default) or "paper". Outputs: `tree_records`, `tree_pairs` and JSON trees (`tree_to_json`,
`write_trees` / `read_trees`). The environment is a `TreeEnv` (expand + rollout over many (tree, node) pairs);
`jaxrag.supervision.mcts_env.PolicyTreeEnv` is the real one.

Details (the tree, the formulas of one iteration, budget, value schemes, outputs): docs/mcts.md.
"""

from __future__ import annotations

import dataclasses
import math
import string
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Protocol, Sequence

from jaxrag.env.mdp import ANSWER, INVALID, QUERY, Action, Episode, State, Step
from jaxrag.jsonl import iter_jsonl, write_jsonl
from jaxrag.supervision.judge_protocol import Judge, JudgeRequest
from jaxrag.supervision.records import Pair, ProcessRecord, ScoredCandidate

REASONING, GROUNDING, TERMINAL = "Reasoning", "Grounding", "Terminal"
STAGES = (REASONING, GROUNDING, TERMINAL)
UCT_VARIANTS = ("paper", "code")
BACKUPS = ("children", "all")
VALUE_SCHEMES = ("code", "paper")


@dataclass(frozen=True)
class MCTSConfig:
    """Search settings. Defaults: ReasonRAG's released code (data_generation.py, reasonrag_pipeline.py)."""

    uct: str = "code"  # "paper" (002 Eq. 5) | "code" (Q + c·sqrt(ln N_parent / N))
    c: float = 1.414
    max_children: int = 2  # children per expansion (code: max_children=2)
    max_rollouts: int = 64  # per tree: rollouts + terminal evaluations + re-visits (code: max_rollouts=64)
    max_iterations: int = 64  # MCTS rounds per tree
    max_depth: int = 7  # steps per trajectory, Reasoning and Grounding both counting (code: max_iter=7)
    rollouts_per_node: int = 1  # SPRE k for every new non-terminal node (0: judge only, the code's simulate())
    alpha: float = 0.9  # SPRE decay α ∈ (0, 1] (paper 0.9–0.95; preference script BETA=0.9, pipeline beta=0.95)
    judge_weight: float = 0.0  # w in Q = (1-w)·SPRE + w·judge for new non-terminal nodes (0: no judge)
    backup: str = "children"  # "children" (visit-weighted mean of children) | "all" (own rollouts too)
    min_margin: float = 0.01  # sibling pairs need |ΔQ| >= this (002 §2.3)
    value_scheme: str = "code"  # "code": rewardless leaves skipped, pairs from code_rewards | "paper": one Q

    def validate(self) -> "MCTSConfig":
        def bad(key, why):
            raise ValueError(f"MCTSConfig.{key}: {why} (got {getattr(self, key)!r})")

        if self.uct not in UCT_VARIANTS:
            bad("uct", f"must be one of {UCT_VARIANTS}")
        if self.backup not in BACKUPS:
            bad("backup", f"must be one of {BACKUPS}")
        if self.value_scheme not in VALUE_SCHEMES:
            bad("value_scheme", f"must be one of {VALUE_SCHEMES}")
        for key in ("max_children", "max_rollouts", "max_iterations", "max_depth"):
            if getattr(self, key) < 1:
                bad(key, "must be >= 1")
        if self.rollouts_per_node < 0:
            bad("rollouts_per_node", "must be >= 0")
        if not 0.0 < self.alpha <= 1.0:
            bad("alpha", "must be in (0, 1]")
        if not 0.0 <= self.judge_weight <= 1.0:
            bad("judge_weight", "must be in [0, 1]")
        if self.rollouts_per_node == 0 and self.judge_weight != 1.0:
            bad("judge_weight", "must be 1.0 when rollouts_per_node == 0 (the judge is then the only value)")
        if self.c < 0:
            bad("c", "must be >= 0")
        return self


@dataclass
class Child:
    """One expansion result from a TreeEnv: the generated text and what it leads to."""

    raw: str  # the generation (what a preference pair trains on)
    stage: str  # stage of the new node: Reasoning | Grounding | Terminal
    action: Action | None = None  # the parsed action (None for an evidence extraction)
    prompt: str = ""  # the prompt the policy saw (the parent's state rendered)
    value: float | None = None  # Terminal: v = F1 (or acc) vs gold; None = no answer (v = 0)
    step: Step | None = None  # real env: the engine Step this node appends (or completes, for evidence)
    kind: str = "action"  # "action" | "evidence"
    extra: dict = field(default_factory=dict)


@dataclass
class Outcome:
    """One rollout to the end: v(rollout) and the total number of steps of the trajectory."""

    value: float
    steps: int
    answer: str | None = None


@dataclass
class Node:
    id: int
    parent: int | None
    stage: str
    depth: int  # steps from the question (root 0)
    raw: str = ""
    action: Action | None = None
    kind: str = "root"  # "root" | "action" | "evidence"
    prompt: str = ""
    step: Step | None = None
    children: list[int] = field(default_factory=list)
    expanded: bool = False
    visits: int = 0  # own evaluations (rollouts, terminal visits)
    own_q: float = 0.0  # the value of the node's own evaluations (SPRE / judge-mixed / exact terminal)
    N: int = 0
    Q: float = 0.0
    value: float | None = None  # Terminal: v vs gold
    samples: list[float] = field(default_factory=list)  # v·α^steps of each own rollout
    judge_score: float | None = None
    judge_failure: str = ""
    reward: float | None = None  # value_scheme "code": the pair value (code_rewards); None = no reward
    extra: dict = field(default_factory=dict)

    @property
    def content(self) -> str:
        """What sibling pairs compare (the tag content, as ReasonRAG's get_content): query/answer text or evidence."""
        if self.kind == "evidence":
            ev = self.step.summary if self.step is not None else None
            return (ev if ev is not None else self.raw).strip()
        if self.action is not None and self.action.kind != INVALID:
            return self.action.text.strip()
        return self.raw.strip()

    @property
    def valid(self) -> bool:
        return self.kind == "evidence" or (self.action is not None and self.action.kind != INVALID)

    @property
    def tagged(self) -> bool:
        """Valid, and an evidence extraction only when its evidence was read (the released script never prefers a
        response without an <answer>, <query> or <evidence> tag)."""
        return self.valid and not (self.kind == "evidence" and self.step is not None and self.step.summary is None)

    @property
    def rewardless(self) -> bool:
        """A leaf without a valid answer under value_scheme "code" (no reward; its value enters no mean)."""
        return bool(self.extra.get("no_reward"))


@dataclass
class Tree:
    qid: str
    question: str
    gold: list[str]
    choices: list[str] = field(default_factory=list)
    nodes: list[Node] = field(default_factory=list)
    metadata: dict = field(default_factory=dict)
    used: int = 0  # budget spent: rollouts + terminal evaluations + re-visits
    iterations: int = 0

    @property
    def root(self) -> Node:
        return self.nodes[0]

    def add(self, parent: Node | None, **kw) -> Node:
        node = Node(id=len(self.nodes), parent=None if parent is None else parent.id, **kw)
        self.nodes.append(node)
        if parent is not None:
            parent.children.append(node.id)
        return node

    def kids(self, node: Node) -> list[Node]:
        return [self.nodes[i] for i in node.children]

    def path(self, node: Node) -> list[Node]:
        """Root ... node."""
        out = [node]
        while out[-1].parent is not None:
            out.append(self.nodes[out[-1].parent])
        return out[::-1]

    def history(self, node: Node) -> list[Step]:
        """The executed engine steps at `node` (an evidence node completes the query step before it)."""
        hist: list[Step] = []
        for n in self.path(node)[1:]:
            if n.step is None:
                continue
            if n.kind == "evidence" and hist:
                hist[-1] = n.step
            else:
                hist.append(n.step)
        return hist

    def state(self, node: Node) -> State:
        """The State before `node`'s pending action (a Grounding node: before its query step)."""
        hist = self.history(node)
        if node.stage == GROUNDING and hist:
            hist = hist[:-1]
        return State(self.question, hist, tuple(self.choices), (), self.qid)


def new_tree(item) -> Tree:
    """A one-node tree (the question, stage Reasoning) from a QA example, a dict or an Episode."""
    if isinstance(item, Tree):
        return item

    def get(name, default=None):
        return item.get(name, default) if isinstance(item, dict) else getattr(item, name, default)

    qid = str(get("qid", None) or get("id", "") or "")
    gold = get("gold", None)
    gold = list(gold if gold is not None else get("golden_answers", []) or [])
    tree = Tree(qid, str(get("question", "")), gold, list(get("choices", None) or []))
    tree.add(None, stage=REASONING, depth=0)
    return tree


class TreeEnv(Protocol):
    """What MCTS needs from the world. Both methods are called once per iteration with every tree's work."""

    def expand(self, items: Sequence[tuple[Tree, Node]], n: int, max_depth: int) -> list[list[Child]]: ...

    def rollout(self, items: Sequence[tuple[Tree, Node]], k: int, max_depth: int) -> list[list[Outcome]]: ...


# ---------------------------------------------------------------------------------------------------------- UCT
def uct_score(cfg: MCTSConfig, parent: Node, child: Node, siblings: Sequence[Node]) -> float:
    """The selection score of `child` under `cfg.uct` (see the module docstring)."""
    if cfg.uct == "paper":
        total = sum(s.N for s in siblings)
        return child.Q + cfg.c * math.sqrt(total) / (1 + child.N)
    if child.N == 0:
        return math.inf
    return child.Q + cfg.c * math.sqrt(math.log(max(parent.N, 1)) / child.N)


def select_child(tree: Tree, node: Node, cfg: MCTSConfig) -> Node:
    """The child of `node` with the highest UCT score (max keeps the first of equal scores)."""
    kids = tree.kids(node)
    return max(kids, key=lambda ch: uct_score(cfg, node, ch, kids))


def select(tree: Tree, cfg: MCTSConfig) -> Node:
    """Descend by UCT to the first Terminal or unexpanded node."""
    node = tree.root
    while node.stage != TERMINAL and node.expanded:
        if not node.children:
            return node
        node = select_child(tree, node, cfg)
    return node


def _valued(node: Node, cfg: MCTSConfig) -> bool:
    """Whether a visited child's Q enters its parent's mean: under "code" a rewardless leaf only when judged."""
    return node.N > 0 and not (cfg.value_scheme == "code" and node.rewardless and node.judge_score is None)


def backup(tree: Tree, node: Node, cfg: MCTSConfig) -> None:
    """Recompute N and Q from `node` up to the root (N counts every visit; Q averages the valued children)."""
    cur: Node | None = node
    while cur is not None:
        visited = [k for k in tree.kids(cur) if k.N > 0]
        kids = [k for k in visited if _valued(k, cfg)]
        n_kids = sum(k.N for k in kids)
        cur.N = cur.visits + sum(k.N for k in visited)
        if not kids:
            cur.Q = cur.own_q
        elif cfg.backup == "children":
            cur.Q = sum(k.N * k.Q for k in kids) / n_kids
        else:
            cur.Q = (cur.visits * cur.own_q + sum(k.N * k.Q for k in kids)) / (cur.visits + n_kids)
        cur = None if cur.parent is None else tree.nodes[cur.parent]


def spre(outcomes: Sequence[Outcome], alpha: float) -> list[float]:
    """v(rollout_i) · α^{steps(rollout_i)} per rollout (002 Eq. 1; Q is their mean)."""
    return [float(o.value) * alpha ** int(o.steps) for o in outcomes]


# ------------------------------------------------------------------------------------------------------- search
def run_mcts(env: TreeEnv, items: Iterable, cfg: MCTSConfig = MCTSConfig(), *, judge: Judge | None = None,
             stats: dict | None = None) -> list[Tree]:
    """Grow one tree per item (QA example / dict / Episode / partly grown Tree), all trees advancing together."""
    cfg.validate()
    if cfg.judge_weight > 0 and judge is None:
        raise ValueError("MCTSConfig.judge_weight > 0 needs a judge")
    trees = [new_tree(it) for it in items]
    st = _new_stats()
    t_start = time.perf_counter()
    while True:
        active = [t for t in trees if t.used < cfg.max_rollouts and t.iterations < cfg.max_iterations]
        if not active:
            break
        picked = [(t, select(t, cfg)) for t in active]
        to_expand = [(t, n) for t, n in picked if n.stage != TERMINAL]
        touched: list[tuple[Tree, Node]] = []
        for t, n in picked:  # re-visit of a Terminal leaf
            t.iterations += 1
            if n.stage == TERMINAL:
                n.visits += 1
                t.used += 1
                st["revisits"] += 1
                touched.append((t, n))

        new_open: list[tuple[Tree, Node]] = []
        if to_expand:
            t0 = time.perf_counter()
            children = env.expand(to_expand, cfg.max_children, cfg.max_depth)
            st["expand_s"] += time.perf_counter() - t0
            st["expand_calls"] += 1
            if len(children) != len(to_expand):
                raise ValueError(f"TreeEnv.expand returned {len(children)} child lists for {len(to_expand)} nodes")
            for (t, n), kids in zip(to_expand, children):
                st["expanded"] += 1
                _attach(t, n, kids[: cfg.max_children], cfg, touched, new_open)
        _evaluate(env, judge, cfg, st, touched, new_open)
        st["iterations"] += 1
    for t in trees:
        t.metadata["value_scheme"] = cfg.value_scheme
        if cfg.value_scheme == "code":
            code_rewards(t, cfg.alpha)
    st["trees"] = len(trees)
    st["nodes"] = sum(len(t.nodes) for t in trees)
    st["total_s"] = time.perf_counter() - t_start
    if stats is not None:
        stats.update(st)
    return trees


def expand_with(env: TreeEnv, items: Sequence[tuple[Tree, Node, Sequence[Child]]], cfg: MCTSConfig = MCTSConfig(),
                *, judge: Judge | None = None, stats: dict | None = None) -> list[list[Node]]:
    """Expand each (tree, node) with the given children instead of the env's samples (all of them, however many:
    e.g. the candidate actions of an audited state), each evaluated as `run_mcts` evaluates a new expansion's
    children (a Terminal child, or one at max_depth, exactly; the others rolled out `rollouts_per_node` times, all
    trees' in ONE `env.rollout` call, and judged where the search judges), then backed up. Budget (`Tree.used`) is
    spent as run_mcts spends it, but not checked, and no iteration is counted; `run_mcts` on the trees searches on.
    Returns the new child nodes of each item, in the children's order."""
    cfg.validate()
    if cfg.judge_weight > 0 and judge is None:
        raise ValueError("MCTSConfig.judge_weight > 0 needs a judge")
    st = _new_stats()
    touched: list[tuple[Tree, Node]] = []
    new_open: list[tuple[Tree, Node]] = []
    added = []
    for t, n, kids in items:
        if n.expanded or n.stage == TERMINAL:
            raise ValueError(f"tree {t.qid!r}: node {n.id} is already expanded or Terminal")
        first = len(t.nodes)
        st["expanded"] += 1
        _attach(t, n, list(kids), cfg, touched, new_open)
        added.append(t.nodes[first:])
    _evaluate(env, judge, cfg, st, touched, new_open)
    if stats is not None:
        stats.update(st)
    return added


def _new_stats() -> dict:
    return {"iterations": 0, "expand_calls": 0, "rollout_calls": 0, "judge_calls": 0, "expanded": 0, "rollouts": 0,
            "revisits": 0, "judge_failures": 0, "expand_s": 0.0, "rollout_s": 0.0, "judge_s": 0.0}


def _attach(t: Tree, n: Node, kids: Sequence[Child], cfg: MCTSConfig, touched: list, new_open: list) -> None:
    """Add an expanded node's children: a Terminal child (or one at max_depth) is scored exactly and goes to
    `touched`, the others to `new_open` (to be rolled out); no child at all makes `n` a dead end, scored 0."""
    n.expanded = True
    if not kids:  # nothing came back: a dead end, scored 0
        _make_terminal(t, n, None, cfg, reason="no children")
        touched.append((t, n))
    for ch in kids:
        node = t.add(n, stage=ch.stage, depth=n.depth + 1, raw=ch.raw, action=ch.action, kind=ch.kind,
                     prompt=ch.prompt, step=ch.step, extra=dict(ch.extra))
        if node.stage == TERMINAL:
            _make_terminal(t, node, ch.value, cfg)
            touched.append((t, node))
        elif node.depth >= cfg.max_depth:
            _make_terminal(t, node, None, cfg, reason="max_depth")
            touched.append((t, node))
        else:
            new_open.append((t, node))


def _evaluate(env: TreeEnv, judge: Judge | None, cfg: MCTSConfig, st: dict, touched: list, new_open: list) -> None:
    """Simulate the new open nodes (SPRE over `rollouts_per_node` rollouts, one env call), judge where the search
    judges, and back up every touched and new node."""
    if new_open and cfg.rollouts_per_node > 0:
        t0 = time.perf_counter()
        outs = env.rollout(new_open, cfg.rollouts_per_node, cfg.max_depth)
        st["rollout_s"] += time.perf_counter() - t0
        st["rollout_calls"] += 1
        if len(outs) != len(new_open):
            raise ValueError(f"TreeEnv.rollout returned {len(outs)} outcome lists for {len(new_open)} nodes")
        for (t, node), oc in zip(new_open, outs):
            node.samples = spre(oc, cfg.alpha)
            node.visits = len(node.samples)
            node.own_q = sum(node.samples) / len(node.samples) if node.samples else 0.0
            node.extra["rollouts"] = [dataclasses.asdict(o) for o in oc]
            t.used += len(node.samples)
            st["rollouts"] += len(node.samples)

    judged = list(new_open)
    if cfg.value_scheme == "code" and cfg.rollouts_per_node == 0:  # the code judges every new node
        judged += [(t, n) for t, n in touched if n.visits == 1 and n.judge_score is None and n.parent is not None]
    if judged and judge is not None and cfg.judge_weight > 0:
        t0 = time.perf_counter()
        _judge_nodes(judge, judged, cfg, st)
        st["judge_s"] += time.perf_counter() - t0
        st["judge_calls"] += 1

    for t, node in touched + new_open:
        backup(t, node, cfg)


def _make_terminal(tree: Tree, node: Node, value: float | None, cfg: MCTSConfig, reason: str = "") -> None:
    """An exact leaf: Q = v · α^{depth} (no answer: v = 0; under "code" it is rewardless), one visit."""
    if value is None and cfg.value_scheme == "code":
        node.extra["no_reward"] = True
    node.stage = TERMINAL
    node.value = float(value) if value is not None else 0.0
    node.own_q = node.value * cfg.alpha ** node.depth
    node.samples = [node.own_q]
    node.visits += 1
    tree.used += 1
    if reason:
        node.extra["terminal_reason"] = reason


def _judge_nodes(judge: Judge, items: list[tuple[Tree, Node]], cfg: MCTSConfig, st: dict) -> None:
    """One batched "step_score" call for every new intermediate node; Q = (1-w)·SPRE + w·judge.

    Request: state.history = the trajectory up to and including the judged step (ReasonRAG's `node.thoughts`; an
    evidence node's query step carries its evidence), candidates = [the judged output]; metadata["in_history"] says
    whether that step is history's last item (toy environments have no engine steps)."""
    reqs = []
    for t, n in items:
        hist = t.history(n)
        reqs.append(JudgeRequest("step_score", State(t.question, hist, tuple(t.choices), (), t.qid), [_as_action(t, n)],
                                 gold=list(t.gold), metadata={"qid": t.qid, "node": n.id, "stage": n.stage,
                                                              "in_history": n.step is not None}))
    results = judge.judge(reqs)
    if len(results) != len(reqs):
        raise ValueError(f"judge returned {len(results)} results for {len(reqs)} requests")
    w = cfg.judge_weight
    for (t, n), res in zip(items, results):
        if cfg.value_scheme == "code" and cfg.rollouts_per_node == 0 and n.stage != TERMINAL:
            t.used += 1  # the code's budget counts simulations: one judged node each (a Terminal one counted already)
        if res.ok and res.scores:
            n.judge_score = float(res.scores[0])
            if cfg.rollouts_per_node == 0:
                n.own_q, n.visits = n.judge_score, 1
            else:
                n.own_q = (1 - w) * n.own_q + w * n.judge_score
        else:
            n.judge_failure = res.failure or "judge returned no score"
            st["judge_failures"] += 1
            if cfg.rollouts_per_node == 0:  # no value at all: visited once, scored 0, left out of pairs
                n.visits, n.own_q = 1, 0.0
                n.extra["unscored"] = True


def _as_action(tree: Tree, node: Node) -> Action:
    """The node's output as an Action (an evidence extraction: the query it grounds, raw = the evidence text)."""
    if node.kind == "evidence":
        query = node.step.action.text if node.step is not None else ""
        ev = node.step.summary if node.step is not None else None
        return Action(QUERY, query, node.raw, {"stage": GROUNDING, "evidence": ev})
    if node.action is not None:
        return node.action
    return Action.invalid(node.raw, "no action")


# ----------------------------------------------------------------------------------------------------- outputs
def _code_scheme(tree: Tree) -> bool:
    return tree.metadata.get("value_scheme", "paper") == "code"


def pair_value(tree: Tree, node: Node) -> float | None:
    """The value pairs compare: "code": the node's reward (code_rewards); "paper": Q (None if never visited or
    unscored)."""
    if _code_scheme(tree):
        return node.reward
    return node.Q if node.N > 0 and not node.extra.get("unscored") else None


def tree_records(tree: Tree, agent: str = "") -> list[ProcessRecord]:
    """One ProcessRecord per expanded node: its children as candidates, score = the child's pair value."""
    out = []
    for node in tree.nodes:
        kids = tree.kids(node)
        if not kids:
            continue
        cands = [ScoredCandidate(k.raw, _as_action(tree, k), score=pair_value(tree, k),
                                 failure=k.judge_failure,
                                 token_ids=list(k.step.token_ids) if k.step is not None and k.kind == "action" else [],
                                 logprobs=list(k.step.logprobs) if k.step is not None and k.kind == "action" else [],
                                 extra={"node": k.id, "N": k.N, "stage": k.stage, "kind": k.kind,
                                        "judge_score": k.judge_score, "Q": k.Q})
                 for k in kids]
        out.append(ProcessRecord(tree.qid, tree.question, list(tree.gold), agent, tree.history(node),
                                 kids[0].prompt, cands, "mcts", step=node.depth,
                                 metadata={"node": node.id, "stage": node.stage, "N": node.N, "Q": node.Q}))
    return out


def tree_pairs(tree: Tree, min_margin: float = 0.01) -> list[Pair]:
    """Sibling preference pairs (the tree's value scheme, recorded by run_mcts; "paper" when absent)."""
    if _code_scheme(tree):
        return _code_pairs(tree, min_margin)
    out = []
    for node in tree.nodes:
        kids = [k for k in tree.kids(node) if k.N > 0 and not k.extra.get("unscored")]
        out += _sibling_pairs(tree, node, kids, lambda k: k.Q, lambda k: k.valid, min_margin)
    return out


def _sibling_pairs(tree: Tree, node, kids, value, preferable, min_margin: float) -> list[Pair]:
    """Pairs between siblings whose values differ by at least min_margin and whose contents differ, the higher one
    preferred where `preferable(it)`; the pair's step is the parent's depth."""
    out = []
    for i in range(len(kids)):
        for j in range(i + 1, len(kids)):
            a, b = kids[i], kids[j]
            if abs(value(a) - value(b)) < min_margin - 1e-12:
                continue
            hi, lo = (a, b) if value(a) > value(b) else (b, a)
            if not preferable(hi) or hi.content == lo.content:
                continue
            out.append(Pair(hi.prompt, hi.raw, lo.raw, value(hi) - value(lo), "mcts", tree.qid, node.depth))
    return out


def _code_pairs(tree: Tree, min_margin: float) -> list[Pair]:
    """The released preference script's walk: from a rewarded root down through rewarded children; a node with
    fewer than two children ends its branch; pairs between rewarded siblings with a reward gap >= min_margin and
    different content, the preferred one tagged. Pair step = the parent's depth."""
    out: list[Pair] = []
    if tree.root.reward is None:
        return out
    stack = [tree.root]
    while stack:
        node = stack.pop()
        kids = tree.kids(node)
        if len(kids) < 2:
            continue
        valid = [k for k in kids if k.reward is not None]
        out += _sibling_pairs(tree, node, valid, lambda k: k.reward, lambda k: k.tagged, min_margin)
        stack.extend(reversed(valid))  # depth first, children in order (the script's recursion)
    return out


# ----------------------------------------------------------------------------------------------- code rewards
def _normalize_keep_articles(text: str) -> str:
    """Lowercase, drop ASCII punctuation, collapse whitespace; articles are kept (the preference script's rule)."""
    text = "".join(ch for ch in text.lower() if ch not in string.punctuation)
    return " ".join(text.split())


def reasonrag_f1(prediction: str, golds) -> float:
    """The F1 of ReasonRAG's preference script (max over the gold answers): token F1 after
    `_normalize_keep_articles`; a yes / no / noanswer on either side scores 0 unless both are equal."""
    best = 0.0
    pred = _normalize_keep_articles(prediction or "")
    for gold in golds:
        g = _normalize_keep_articles(str(gold))
        if (pred in ("yes", "no", "noanswer") or g in ("yes", "no", "noanswer")) and pred != g:
            continue
        p_tok, g_tok = pred.split(), g.split()
        common = sum((Counter(p_tok) & Counter(g_tok)).values())
        if common == 0:
            continue
        prec, rec = common / len(p_tok), common / len(g_tok)
        best = max(best, 2 * prec * rec / (prec + rec))
    return best


def _leaf_reward(tree: Tree, node: Node, alpha: float) -> float | None:
    """An answered leaf: F1 · α^depth (multiple choice: the env's value); anything else: None."""
    if node.rewardless or node.stage != TERMINAL or node.action is None or node.action.kind != ANSWER:
        return None
    v = node.value if tree.choices else reasonrag_f1(node.action.text, tree.gold)
    return float(v if v is not None else 0.0) * alpha ** node.depth


def code_rewards(tree: Tree, alpha: float) -> Tree:
    """Fill every node's `reward` bottom-up (value_scheme "code"): answered leaves by `_leaf_reward`, every other
    leaf None, an inner node the visit-weighted mean Σ N_c r_c / Σ N_c of its rewarded children (None if none)."""
    for node in reversed(tree.nodes):  # children are created after their parent
        kids = tree.kids(node)
        if not kids:
            node.reward = _leaf_reward(tree, node, alpha)
            continue
        rated = [k for k in kids if k.reward is not None and k.N > 0]
        total = sum(k.N for k in rated)
        node.reward = sum(k.N * k.reward for k in rated) / total if total > 0 else None
    return tree


# -------------------------------------------------------------------------------------------------------- JSON
def _step_json(step: Step | None) -> dict | None:
    return None if step is None else dataclasses.asdict(step)


def _step_from(d: dict | None) -> Step | None:
    if d is None:
        return None
    return Episode.from_json({"qid": "", "question": "", "gold": [], "steps": [d]}).steps[0]


def tree_to_json(tree: Tree) -> dict:
    nodes = []
    for n in tree.nodes:
        d = dataclasses.asdict(n)
        d["action"] = None if n.action is None else dataclasses.asdict(n.action)
        d["step"] = _step_json(n.step)
        nodes.append(d)
    return {"qid": tree.qid, "question": tree.question, "gold": list(tree.gold), "choices": list(tree.choices),
            "used": tree.used, "iterations": tree.iterations, "metadata": dict(tree.metadata), "nodes": nodes}


def tree_from_json(d: dict) -> Tree:
    d = dict(d)
    nodes = []
    for i, nd in enumerate(d.pop("nodes")):
        nd = dict(nd)
        nd["action"] = None if nd.get("action") is None else Action(**nd["action"])
        nd["step"] = _step_from(nd.get("step"))
        node = Node(**nd)
        if node.id != i:
            raise ValueError(f"tree {d.get('qid')!r}: node {i} has id {node.id}")
        nodes.append(node)
    return Tree(nodes=nodes, **d)


def write_trees(path: str | Path, trees: Iterable[Tree]) -> Path:
    return write_jsonl(path, (tree_to_json(t) for t in trees))


def read_trees(path: str | Path) -> list[Tree]:
    out = []
    for where, rec in iter_jsonl(path):
        try:
            out.append(tree_from_json(rec))
        except (TypeError, KeyError, ValueError) as e:
            raise ValueError(f"{where}: not an MCTS tree: {e}") from e
    return out
