"""The real environment of ReasonRAG MCTS (jaxrag.supervision.mcts.TreeEnv) over a Policy, a Retriever and an agent.

Expansion and rollouts go through the rollout engine's batched calls (`rollout.candidates`, `rollout.execute`,
`rollout.rollout` over partial Episodes), so one MCTS iteration over many trees costs a handful of sampler calls.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from typing import Sequence

from jaxrag.env.mdp import ANSWER, INVALID, QUERY, Action, Episode, State, Step, answer_reward
from jaxrag.env.rollout import RolloutConfig, candidates, execute, rollout
from jaxrag.supervision.mcts import GROUNDING, REASONING, TERMINAL, Child, Node, Outcome, Tree, new_tree


@dataclass
class PolicyTreeEnv:
    """TreeEnv over a Policy, a Retriever and an agent design (ReasonRAG's Reasoning/Grounding stages).

    expand: every Reasoning leaf of the iteration in ONE `rollout.candidates` call (n samples each; through the
    policy's slot pool with `pool_expansions`), their queries in ONE batched search; every Grounding leaf in ONE
    `policy.generate` call over `agent.render_summary` prompts (two stages need two calls: their prompts and stop
    strings differ). A query child becomes a Grounding node when the agent summarizes and `grounding_stage` is on;
    otherwise its summary (if any) is filled at once.
    rollout: k copies of every node as partial Episodes (Grounding nodes first get their evidence sampled, in one
    call), all continued by ONE `rollout.rollout` call; v = the engine's answer reward (F1, or accuracy for multiple
    choice), steps = tree steps of the whole trajectory (a query with its evidence counts 2 when grounding counts).
    """

    policy: object
    retriever: object
    agent: object
    k: int = 3  # documents per search (ReasonRAG: top 3)
    temperature: float = 1.0  # expansion sampling
    rollout_temperature: float = 1.0
    max_new_tokens: int = 256
    summary_max_new_tokens: int = 256
    batch_size: int = 64  # live episodes per engine step in rollouts
    grounding_stage: bool = True
    summarizer: object = None  # policy for evidence in rollouts (default: `policy`, as ReasonRAG)
    continuous: bool = False  # rollouts through the policy's slot pool (RolloutConfig.continuous)
    # with continuous, expansions too: with a policy whose pool is kept between calls (prefix_cache) a node's
    # children's rollouts then fork from the rows their expansion left (the parent's prompt + the child's action).
    # Off by default: in benchmarks.prefix_reuse --mcts on 2 CPU cores it forked 3x as often (229 against 76 requests)
    # but ran at 0.95x the no-cache speed, where the cache with lock-step expansions ran at 1.05x (the pool's decode
    # over all its slots costs more than the batched call). Needs a policy with `continuous` (else lock-step).
    pool_expansions: bool = False
    reward: str = "auto"  # v: f1, or acc for multiple choice
    seed: int = 0
    calls: dict = field(default_factory=lambda: {"expand": 0, "rollout": 0, "engine": 0})  # counts per method
    sampled: dict = field(default_factory=lambda: {"expand": 0, "evidence": 0, "rollout": 0})  # policy samples
    _draws: int = 0  # sampler seeds handed out so far

    @property
    def sampled_actions(self) -> int:
        """Every sampled policy output so far (expansion candidates, evidence, rollout actions): MCTS's compute in
        the unit of the ranking collection's N candidates per state."""
        return sum(self.sampled.values())

    @property
    def _grounds(self) -> bool:
        return bool(self.grounding_stage and getattr(self.agent, "summarizes", False))

    @property
    def _pool_slots(self) -> int:
        """Slots for expansions through the policy's slot pool (`pool_expansions` with `continuous`); else 0: one
        batched `generate` call."""
        pooled = self.continuous and self.pool_expansions and hasattr(self.policy, "continuous")
        return self.batch_size if pooled else 0

    def _seed(self) -> int:
        """A fresh seed for every sampler call (temperature 1 samples must differ between iterations)."""
        self._draws += 1
        return self.seed + 7919 * self._draws

    def tree_steps(self, steps: Sequence[Step]) -> int:
        per_query = 2 if self._grounds else 1
        return sum(per_query if s.action.kind == QUERY else 1 for s in steps)

    def engine_max_steps(self, max_depth: int) -> int:
        """Engine steps whose tree steps fit in max_depth (q queries + answer: 2q+1 ≤ max_depth with grounding)."""
        return (max_depth - 1) // 2 + 1 if self._grounds else max_depth

    # ---- expand -----------------------------------------------------------------------------------------
    def expand(self, items: Sequence[tuple[Tree, Node]], n: int, max_depth: int) -> list[list[Child]]:
        self.calls["expand"] += 1
        out: list[list[Child]] = [[] for _ in items]
        reason = [i for i, (_, nd) in enumerate(items) if nd.stage == REASONING]
        ground = [i for i, (_, nd) in enumerate(items) if nd.stage == GROUNDING]
        if reason:
            states = self._states([items[i] for i in reason], max_depth)
            prompts, cands = candidates(self.policy, self.agent, states, n, temperature=self.temperature,
                                        max_new_tokens=self.max_new_tokens, seed=self._seed(), slots=self._pool_slots)
            self.sampled["expand"] += sum(len(c) for c in cands)
            proposals = []
            for j in range(len(reason)):
                row = []
                for c in cands[j]:
                    comp = c.completion
                    step = Step(action=c.action, prompt=prompts[j],
                                token_ids=[int(x) for x in getattr(comp, "token_ids", ()) or ()],
                                logprobs=[float(x) for x in getattr(comp, "logprobs", ()) or ()],
                                finish_reason=str(getattr(comp, "finish_reason", "")))
                    row.append((getattr(comp, "text", c.action.raw), step))
                proposals.append(row)
            for i, kids in zip(reason, self._action_children([items[i] for i in reason], states, proposals)):
                out[i] = kids
        if ground:
            prompts = []
            for i in ground:
                t, nd = items[i]
                qstep = t.history(nd)[-1]
                prompts.append(self.agent.render_summary(t.state(nd), qstep.action.text, qstep.docs))
            outs = self.policy.generate(prompts, n=n, temperature=self.temperature,
                                        max_new_tokens=self.summary_max_new_tokens,
                                        stop=list(self.agent.summary_stop) or None, seed=self._seed())
            self.sampled["evidence"] += sum(len(o) for o in outs)
            for j, i in enumerate(ground):
                t, nd = items[i]
                qstep = t.history(nd)[-1]
                for comp in outs[j]:
                    step = copy.deepcopy(qstep)
                    step.summary_prompt, step.summary_raw = prompts[j], comp.text
                    step.summary = self._parse_summary(comp.text)
                    out[i].append(Child(comp.text, REASONING, None, prompts[j], None, step, kind="evidence"))
        return out

    def children(self, items: Sequence[tuple[Tree, Node]], proposals: Sequence[Sequence[tuple[str, Step]]],
                 max_depth: int) -> list[list[Child]]:
        """Children of Reasoning nodes from given actions instead of samples (e.g. an audited state's candidates):
        each (raw text, Step holding its parsed action and prompt) becomes the Child `expand` makes of a sampled one
        (an answer Terminal with its reward, an unparsable action Terminal, a query executed: one batched search)."""
        if any(nd.stage != REASONING for _, nd in items):
            raise ValueError("PolicyTreeEnv.children: actions are proposed at Reasoning nodes only")
        return self._action_children(items, self._states(items, max_depth), proposals)

    def path_tree(self, item, history: Sequence[Step]) -> tuple[Tree, Node]:
        """A tree grown along executed engine steps (an episode's state): per step the node `expand` makes of it (a
        query with its evidence node when grounding is a tree stage), each parent expanded with that one child.
        Returns the tree and the node after the last step (unexpanded; its depth the steps' tree steps)."""
        tree = new_tree(item)
        node = tree.root
        for h in history:
            grounded = self._grounds and h.action.kind == QUERY
            node.expanded = True
            step = copy.deepcopy(h)
            if grounded:  # the query node holds the step before its evidence, as expand leaves it
                step.summary, step.summary_prompt, step.summary_raw = None, "", ""
            node = tree.add(node, stage=GROUNDING if grounded else REASONING, depth=node.depth + 1, raw=h.action.raw,
                            action=h.action, kind="action", prompt=h.prompt, step=step)
            if grounded:
                node.expanded = True
                node = tree.add(node, stage=REASONING, depth=node.depth + 1, raw=h.summary_raw, kind="evidence",
                                prompt=h.summary_prompt, step=copy.deepcopy(h))
        return tree, node

    def _states(self, items: Sequence[tuple[Tree, Node]], max_depth: int) -> list[State]:
        """The States of Reasoning nodes, `must_answer` on the last step max_depth allows."""
        states = []
        for t, nd in items:
            s = t.state(nd)
            s.must_answer = nd.depth + 1 >= max_depth or len(s.history) + 1 >= self.engine_max_steps(max_depth)
            states.append(s)
        return states

    def _action_children(self, items: Sequence[tuple[Tree, Node]], states: Sequence[State],
                         proposals: Sequence[Sequence[tuple[str, Step]]]) -> list[list[Child]]:
        """Children from (raw text, Step) proposals per Reasoning node: on a must-answer state a query carrying a
        predicted answer becomes that answer; queries are executed in ONE batched search (+ summaries when
        grounding is not a tree stage)."""
        out: list[list[Child]] = [[] for _ in items]
        q_states, q_steps = [], []
        for j, (t, nd) in enumerate(items):
            for raw, step in proposals[j]:
                action = step.action
                if states[j].must_answer and action.kind == QUERY and action.extra.get("predicted_answer"):
                    action = Action(ANSWER, action.extra["predicted_answer"], action.raw,
                                    {**action.extra, "forced_by_max_steps": True})
                    step = dataclasses.replace(step, action=action)
                if action.kind == ANSWER:
                    v = answer_reward(action.text, t.gold, self.reward, t.choices)
                    out[j].append(Child(raw, TERMINAL, action, step.prompt, v, step))
                elif action.kind == INVALID:
                    out[j].append(Child(raw, TERMINAL, action, step.prompt, None, step,
                                        extra={"terminal_reason": "invalid"}))
                else:
                    out[j].append(Child(raw, GROUNDING if self._grounds else REASONING, action, step.prompt, None,
                                        step))
                    q_states.append(states[j])
                    q_steps.append(step)
        if q_steps:  # one batched search (+ summaries when grounding is not a tree stage)
            summarizer = None if self._grounds else (self.summarizer or self.policy)
            execute(q_states, q_steps, self.retriever, self.agent, self.k, summarizer,
                    summary_max_new_tokens=self.summary_max_new_tokens, seed=self._seed())
        return out

    def _parse_summary(self, text: str) -> str | None:
        try:
            return self.agent.parse_summary(text)
        except Exception:  # a parser bug is a missing evidence, never a crash
            return None

    # ---- rollout ----------------------------------------------------------------------------------------
    def rollout(self, items: Sequence[tuple[Tree, Node]], k: int, max_depth: int) -> list[list[Outcome]]:
        self.calls["rollout"] += 1
        episodes, owner = [], []
        pending_ev: list[tuple[Episode, State, Step]] = []
        for i, (t, nd) in enumerate(items):
            hist = t.history(nd)
            for _ in range(k):
                ep = Episode(t.qid, t.question, list(t.gold), agent=getattr(self.agent, "name", ""),
                             choices=list(t.choices), steps=copy.deepcopy(hist))
                if nd.stage == GROUNDING:
                    pending_ev.append((ep, t.state(nd), ep.steps[-1]))
                episodes.append(ep)
                owner.append(i)
        if pending_ev:  # Grounding nodes: sample the evidence of each copy first (one call)
            prompts = [self.agent.render_summary(s, st.action.text, st.docs) for _, s, st in pending_ev]
            outs = (self.summarizer or self.policy).generate(
                prompts, n=1, temperature=self.rollout_temperature, max_new_tokens=self.summary_max_new_tokens,
                stop=list(self.agent.summary_stop) or None, seed=self._seed())
            for (_, _, st), p, o in zip(pending_ev, prompts, outs):
                text = o[0].text if o else ""
                st.summary_prompt, st.summary_raw, st.summary = p, text, self._parse_summary(text)
        cfg = RolloutConfig(k=self.k, max_steps=self.engine_max_steps(max_depth), batch_size=self.batch_size,
                            temperature=self.rollout_temperature, max_new_tokens=self.max_new_tokens,
                            summary_max_new_tokens=self.summary_max_new_tokens,
                            summary_temperature=self.rollout_temperature, reward=self.reward, seed=self._seed(),
                            continuous=self.continuous)
        done = rollout(self.policy, self.retriever, self.agent, episodes, cfg, summarizer=self.summarizer)
        self.calls["engine"] += 1
        self.sampled["evidence"] += len(pending_ev)
        out: list[list[Outcome]] = [[] for _ in items]
        for i, ep in zip(owner, done):
            self.sampled["rollout"] += max(0, len(ep.steps) - len(items[i][0].history(items[i][1])))
            v = ep.reward if ep.done == "answer" else 0.0
            out[i].append(Outcome(float(v), self.tree_steps(ep.steps), ep.answer))
        return out
