"""SmartSearch (004 §4; METHODS.md §5): dual-level credit of every search query, process-reward-guided query
refinement, the three-stage curriculum data, and the composite reward (registered as reward "smartsearch"; the
outcome-only reward of Eq. 5 as "smartsearch_outcome").

Credit (004 Eqs. 8–12), per search step t of a trajectory:
  O_t = Σ_i 1[D_i^t ∈ ∪_{s<t} D^s]   (documents of step t already retrieved at an earlier step; same doc_id, or the
                                      same title + text when a document has no id)
  S_novel = 0 if O_t > K else 1       (K = `overlap_threshold`; code: a step is redundant when redundancy > 1)
  S_useful ∈ {0, 1}, T_useful         from a Judge, kind "usefulness", given question, gold answer and trajectory H_t
  S_t = S_novel ∧ S_useful,  T_t = T_novel ‖ T_useful.
  A failed judge item is recorded (`failure`) and S_useful left unknown: S_t then rests on novelty alone, as the
  released reward does (only a "0" judge reply counts a query as wrong there).
Refinement (Eq. 13): for every step with S_t = 0 a refiner (Judge kind "refine") rewrites the query from
  (q, H_i, T_i); the agent then regenerates the trajectory from the refined query on, all in one rollout call.
Curriculum: stage 1 `sft_filter` (correct, well formed, every S_t = 1); stage 2 `dpo_pairs` over a question's original
  and refined trajectories (correct ≻ incorrect; among correct fewer S_t = 0 ≻; among incorrect more S_t = 1 ≻);
  stage 3 `smartsearch_reward`: r = r_comp + λ·r_format, r_comp = max(1 − γ·n_wrong, φ_min) if correct else
  min(γ·n_correct, φ_max); code: correct ⇔ F1 ≥ 0.8, γ = 0.1, φ_min = 0.7, φ_max = 0.3, λ = 0.1.

Judge requests (the convention the concrete judges read): `state.history` is the trajectory up to AND including the
judged search step (its documents are the query result the usefulness prompt checks; the code's "search process up
to the current search round"), `candidates` = [that step's action], `metadata["step"]` its index; "refine" requests
add `explanation` = T_t and carry no gold answer (the refinement prompt shows none).

Where the per-step labels of the RL reward come from (the judge is too expensive to call inside the reward): in order,
`episode.metadata["smartsearch_credit"]` (written by `assess`), else per-step `step.action.extra["useful"]` (0/1, set
by whoever judged the rollout) combined with novelty, else novelty alone. The reward's "judged" component says which.
"""

from __future__ import annotations

import copy
import dataclasses
import re
from collections import OrderedDict
from dataclasses import dataclass
from typing import Sequence

from jaxrag import metrics
from jaxrag.env.mdp import QUERY, Action, Doc, Episode, Step, answer_reward
from jaxrag.env.parsing import code_boxed_answer
from jaxrag.env.rollout import RolloutConfig, execute, rollout
from jaxrag.supervision.judge_protocol import Judge, JudgeRequest
from jaxrag.supervision.records import Pair, ProcessRecord, ScoredCandidate
from jaxrag.supervision.rewards import Reward, register

CREDIT_KEY = "smartsearch_credit"  # Episode.metadata: list of StepCredit dicts
REFINED_KEY = "smartsearch_refined"  # Episode.metadata of a refined trajectory: where it branched
NOVEL_TEXT, REDUNDANT_TEXT = "the query is novel", "the query is redundant"  # 004 Eq. 8
# The released refinement script's wording of the same issue (query_refinement.py), used with explanations="code".
CODE_REDUNDANT_TEXT = ("The agent's query of the current search round is redundant, meaning that the query result "
                       "duplicates information from previous search rounds.")


ANSWER_FROM = ("boxed", "parsed")


@dataclass(frozen=True)
class SmartSearchConfig:
    overlap_threshold: int = 1  # K: S_novel = 0 iff O_t > K (code: redundancy > 1)
    correct_f1: float = 0.8  # an answer is correct iff F1 >= this (code; accuracy for multiple choice)
    gamma: float = 0.1  # γ: process reward per query
    phi_min: float = 0.7  # φ_min: floor of a correct trajectory's composite reward
    phi_max: float = 0.3  # φ_max: ceiling of an incorrect trajectory's composite reward
    format_weight: float = 0.1  # λ: format bonus
    explanations: str = "paper"  # "paper": T_novel ‖ T_useful | "code": only the issues (useless, then redundant)
    pairs: str = "paper"  # "paper": one (best, worst) pair per question | "all": every strictly ordered pair
    require_judged: bool = True  # stage 1 keeps a trajectory only if every S_useful came from the judge
    # where the scored answer comes from: "boxed" = the released reward's (the last \\boxed in the generated
    # transcript, its rules in `code_boxed_answer`; none -> ""; in the synthetic world's line format, which has no
    # tags, the agent's answer); "parsed" = the agent's answer (ep.answer: the <answer> text when it has no \\boxed)
    answer_from: str = "boxed"

    def validate(self) -> "SmartSearchConfig":
        if self.explanations not in ("paper", "code"):
            raise ValueError(f"SmartSearchConfig.explanations must be 'paper' or 'code', got {self.explanations!r}")
        if self.pairs not in ("paper", "all"):
            raise ValueError(f"SmartSearchConfig.pairs must be 'paper' or 'all', got {self.pairs!r}")
        if self.answer_from not in ANSWER_FROM:
            raise ValueError(f"SmartSearchConfig.answer_from must be one of {ANSWER_FROM}, got {self.answer_from!r}")
        if self.overlap_threshold < 0:
            raise ValueError(f"SmartSearchConfig.overlap_threshold must be >= 0, got {self.overlap_threshold}")
        return self


@dataclass
class StepCredit:
    step: int  # index in episode.steps
    query: str
    overlap: int  # O_t
    novel: int  # S_novel
    useful: int | None  # S_useful; None = not judged (no judge, or the judge failed: see failure)
    good: int  # S_t
    explanation: str  # T_t
    failure: str = ""

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @staticmethod
    def from_json(d: dict) -> "StepCredit":
        return StepCredit(**d)


# ------------------------------------------------------------------------------------------------------ novelty
def doc_key(doc: Doc) -> str:
    return doc.doc_id if doc.doc_id else f"{doc.title}\n{doc.text}"


def search_steps(ep: Episode) -> list[int]:
    return [i for i, s in enumerate(ep.steps) if s.action.kind == QUERY]


def overlaps(ep: Episode) -> list[int]:
    """O_t for every search step (004 Eq. 9)."""
    seen: set[str] = set()
    out = []
    for i in search_steps(ep):
        keys = [doc_key(d) for d in ep.steps[i].docs]
        out.append(sum(k in seen for k in keys))
        seen.update(keys)
    return out


def novelty(ep: Episode, threshold: int = 1) -> list[int]:
    """S_novel per search step: 0 iff O_t > K."""
    return [0 if o > threshold else 1 for o in overlaps(ep)]


def _explain(novel: int, useful: int | None, useful_text: str, style: str) -> str:
    if style == "code":
        parts = [useful_text if useful == 0 else "", CODE_REDUNDANT_TEXT if not novel else ""]
    else:
        parts = [(NOVEL_TEXT if novel else REDUNDANT_TEXT) + ".", useful_text]
    return " ".join(p.strip() for p in parts if p and p.strip())


def assess(episodes: Sequence[Episode], judge: Judge | None = None,
           cfg: SmartSearchConfig = SmartSearchConfig()) -> list[list[StepCredit]]:
    """Dual-level credit of every search step of every episode; ONE batched judge call for all of them.

    Writes the credits into `episode.metadata["smartsearch_credit"]` and returns them. Without a judge, S_useful is
    unknown and S_t = S_novel."""
    cfg.validate()
    reqs, where = [], []
    for e, ep in enumerate(episodes):
        for i in search_steps(ep):
            reqs.append(JudgeRequest("usefulness", ep.state(i + 1), [ep.steps[i].action], gold=list(ep.gold),
                                     metadata={**_judge_metadata(ep), "qid": ep.qid, "step": i}))
            where.append((e, i))
    results = judge.judge(reqs) if (judge is not None and reqs) else [None] * len(reqs)
    if len(results) != len(reqs):
        raise ValueError(f"judge returned {len(results)} results for {len(reqs)} usefulness requests")
    by_step = dict(zip(where, results))
    out = []
    for e, ep in enumerate(episodes):
        credits = []
        for i, o in zip(search_steps(ep), overlaps(ep)):
            novel = 0 if o > cfg.overlap_threshold else 1
            res = by_step[(e, i)]
            useful, text, failure = None, "", ""
            if res is None:
                failure = "" if judge is None else "no judge result"
            elif res.ok and res.scores:
                useful, text = int(float(res.scores[0]) >= 0.5), res.rationale
            else:
                failure = res.failure or "judge returned no score"
            good = int(bool(novel) and useful != 0)
            credits.append(StepCredit(i, ep.steps[i].action.text, o, novel, useful, good,
                                      _explain(novel, useful, text, cfg.explanations), failure))
        ep.metadata[CREDIT_KEY] = [c.to_json() for c in credits]
        out.append(credits)
    return out


def _judge_metadata(ep: Episode) -> dict:
    """What a judge may read of the episode's metadata (e.g. the synthetic world's gold_chain for the oracle): all of
    it but the credit bookkeeping."""
    return {k: v for k, v in ep.metadata.items() if k not in (CREDIT_KEY, REFINED_KEY)}


def credits_of(ep: Episode) -> list[StepCredit] | None:
    rows = ep.metadata.get(CREDIT_KEY)
    return None if rows is None else [StepCredit.from_json(r) for r in rows]


def step_labels(ep: Episode, cfg: SmartSearchConfig = SmartSearchConfig()) -> tuple[list[int], str]:
    """S_t per search step and where they came from: "credit" | "step" (action.extra["useful"]) | "novelty"."""
    credits = credits_of(ep)
    if credits is not None:
        return [c.good for c in credits], "credit"
    nov = novelty(ep, cfg.overlap_threshold)
    useful = [ep.steps[i].action.extra.get("useful") for i in search_steps(ep)]
    if any(u is not None for u in useful):
        return [int(bool(n) and (u is None or int(u) != 0)) for n, u in zip(nov, useful)], "step"
    return nov, "novelty"


# ------------------------------------------------------------------------------------------- outcome and format
def final_answer(ep: Episode, cfg: SmartSearchConfig = SmartSearchConfig()) -> str | None:
    """The answer the reward scores: cfg.answer_from "boxed" (released code) or "parsed" (the agent's)."""
    if cfg.answer_from == "parsed" or not tagged(ep):   # the synthetic world's line format has no \\boxed
        return ep.answer
    return code_boxed_answer(transcript(ep))


def answer_score(ep: Episode, cfg: SmartSearchConfig = SmartSearchConfig()) -> float:
    """F1 vs gold (accuracy for multiple choice) of `final_answer`."""
    answer = final_answer(ep, cfg)
    return answer_reward(answer, ep.gold, "auto", ep.choices) if answer is not None else 0.0


def is_correct(ep: Episode, cfg: SmartSearchConfig = SmartSearchConfig()) -> bool:
    return answer_score(ep, cfg) >= cfg.correct_f1


_TAGGED = re.compile(r"<think>|</think>|<search>|</search>|<answer>|</answer>|\\boxed")


def transcript(ep: Episode) -> str:
    """The generated text of the whole trajectory: each step's raw generation, `<result>` blocks after searches."""
    parts = []
    for s in ep.steps:
        parts.append(s.action.raw)
        if s.action.kind == QUERY:
            parts.append("\n<result>\n" + "\n".join(f"({d.doc_id})" for d in s.docs) + "\n</result>\n")
    return "".join(parts)


def tag_format(text: str) -> tuple[bool, str]:
    """The released code's template check (re_call.validate_template_format): paired <think> tags (at least one),
    one <answer>…</answer> holding \\boxed{…}, every <search> followed by </search>, <result>, </result> in order."""
    if text.count("<think>") != text.count("</think>"):
        return False, "<think> </think> unpaired"
    if text.count("<think>") == 0:
        return False, "no <think>"
    if text.count("<answer>") != 1 or text.count("</answer>") != 1:
        return False, "not exactly one <answer> </answer>"
    pos = 0
    while (s := text.find("<search>", pos)) != -1:
        s_end = text.find("</search>", s)
        r = text.find("<result>", s)
        r_end = text.find("</result>", r) if r != -1 else -1
        if -1 in (s_end, r, r_end):
            return False, "search/result incomplete"
        if not s < s_end < r < r_end:
            return False, "search/result out of order"
        pos = r_end
    a, a_end = text.find("<answer>"), text.find("</answer>")
    if a > a_end:
        return False, "</answer> before <answer>"
    body = text[a:a_end]
    if "\\boxed{" not in body or "}" not in body:
        return False, "answer without \\boxed{}"
    return True, "ok"


def tagged(ep: Episode) -> bool:
    """The policy writes SmartSearch's tags (chat mode), not the synthetic world's line format."""
    return any(_TAGGED.search(s.action.raw or "") for s in ep.steps)


def format_check(ep: Episode) -> tuple[bool, str]:
    """r_format: the tag rules on the transcript when the policy writes SmartSearch tags (chat mode); for the line
    format of the synthetic world ("plain"), the trajectory ended in an answer with no Invalid step."""
    if not ep.steps:
        return False, "no steps"
    if tagged(ep):
        return tag_format(transcript(ep))
    if ep.done == "answer" and ep.num_invalid == 0:
        return True, "ok"
    return False, f"ended by {ep.done or 'nothing'} with {ep.num_invalid} invalid step(s)"


# -------------------------------------------------------------------------------------------------------- reward
def composite(correct: bool, n_wrong: int, n_correct: int, cfg: SmartSearchConfig = SmartSearchConfig()) -> float:
    """r_comp (004 Eq. 17): max(1 − γ·n_wrong, φ_min) if correct else min(γ·n_correct, φ_max)."""
    if correct:
        return max(1.0 - cfg.gamma * n_wrong, cfg.phi_min)
    return min(cfg.gamma * n_correct, cfg.phi_max)


def with_format(ep: Episode, r: float, cfg: SmartSearchConfig) -> tuple[float, bool]:
    """(r + λ·r_format, r_format): the format bonus both SmartSearch rewards add; a transcript with the malformed tag
    "</search<" scores 0 (code)."""
    fmt, _ = format_check(ep)
    return (0.0 if "</search<" in transcript(ep) else r + cfg.format_weight * float(fmt)), fmt


def smartsearch_reward(ep: Episode, cfg: SmartSearchConfig = SmartSearchConfig()) -> Reward:
    """r = r_comp + λ·r_format (004 Eq. 16), shaped by `with_format`."""
    labels, source = step_labels(ep, cfg)
    n_wrong = sum(1 for g in labels if not g)
    n_correct = len(labels) - n_wrong
    correct = is_correct(ep, cfg)
    r_comp = composite(correct, n_wrong, n_correct, cfg)
    total, fmt = with_format(ep, r_comp, cfg)
    return Reward(total, {"outcome": float(correct), "f1": answer_score(ep, cfg), "composite": r_comp,
                          "format": float(fmt), "n_wrong": float(n_wrong), "n_correct": float(n_correct),
                          "judged": float(source != "novelty")})


@register("smartsearch")
def _registered_reward(ep: Episode) -> Reward:
    return smartsearch_reward(ep)


def outcome_reward(ep: Episode, cfg: SmartSearchConfig = SmartSearchConfig()) -> Reward:
    """r = r_outcome + λ·r_format (004 Eq. 5: the reward without process rewards, Table 3's "Standard GRPO" and
    "w/o process rewards" rows): r_outcome = 1 iff the answer is correct (code: F1 >= 0.8), the same format bonus
    and malformed-tag rule as smartsearch_reward (`with_format`)."""
    correct = is_correct(ep, cfg)
    total, fmt = with_format(ep, float(correct), cfg)
    return Reward(total, {"outcome": float(correct), "f1": answer_score(ep, cfg), "format": float(fmt)})


@register("smartsearch_parsed")
def _registered_parsed_reward(ep: Episode) -> Reward:
    """The composite reward scoring the agent's parsed answer (an unboxed <answer> text counts) instead of \\boxed."""
    return smartsearch_reward(ep, SmartSearchConfig(answer_from="parsed"))


@register("smartsearch_outcome")
def _registered_outcome_reward(ep: Episode) -> Reward:
    return outcome_reward(ep)


# -------------------------------------------------------------------------------------------------- refinement
@dataclass
class Refinement:
    episodes: list[Episode]  # regenerated trajectories, metadata["smartsearch_refined"] says where they branch
    failures: list[dict]  # {"qid", "step", "failure"} for every bad step the refiner could not rewrite
    requests: int = 0


def refine(episodes: Sequence[Episode], refiner: Judge, policy, retriever, agent, rollout_cfg=None, *,
           credits: Sequence[Sequence[StepCredit]] | None = None, summarizer=None,
           keep_per_episode: int | None = None, stats: dict | None = None) -> Refinement:
    """For every search step with S_t = 0: rewrite its query (ONE batched refiner call for all steps of all episodes),
    retrieve for every refined query (one batched search), and let the agent regenerate each trajectory from its
    refined step on (ONE `rollout` call over the partial Episodes). Steps before the refined one are kept as they
    were; the refined step keeps the original's reasoning (`<think>`), as the released code replaces only the text
    inside the last <search> tag. Credits default to each episode's `metadata["smartsearch_credit"]`.
    keep_per_episode: regenerate only the first N successful refinements of each episode, earliest step first (the
    stage-3 rollout: the released generate_new_prompts.py rewrites every bad query, then keeps the first usable
    prefix); None = all. stats: the regeneration rollout's phase seconds (jaxrag.env.rollout.rollout's)."""
    cfg = rollout_cfg or RolloutConfig()
    reqs, where = [], []
    for e, ep in enumerate(episodes):
        cr = credits[e] if credits is not None else credits_of(ep)
        if cr is None:
            raise ValueError(f"refine: episode {ep.qid!r} has no credit (run assess() first or pass credits=)")
        for c in cr:
            if not c.good:
                reqs.append(JudgeRequest("refine", ep.state(c.step + 1), [ep.steps[c.step].action],
                                         explanation=c.explanation,
                                         metadata={**_judge_metadata(ep), "qid": ep.qid, "step": c.step}))
                where.append((e, c))
    if not reqs:
        return Refinement([], [], 0)
    results = refiner.judge(reqs)
    if len(results) != len(reqs):
        raise ValueError(f"refiner returned {len(results)} results for {len(reqs)} requests")
    failures, states, steps, partials = [], [], [], []
    kept: dict[int, int] = {}
    for (e, c), res in zip(where, results):
        ep = episodes[e]
        if keep_per_episode is not None and kept.get(e, 0) >= keep_per_episode:
            continue
        text = (res.texts[0] if res.ok and res.texts else "") or ""
        text = text.strip()
        if not text:
            failures.append({"qid": ep.qid, "step": c.step,
                             "failure": res.failure or ("empty refined query" if res.ok else "refiner failed")})
            continue
        orig = ep.steps[c.step].action
        if text == orig.text.strip():  # nothing to regenerate from: the refiner kept the query (not a refinement)
            failures.append({"qid": ep.qid, "step": c.step, "failure": "refined query equals the original"})
            continue
        extra = {k: v for k, v in orig.extra.items() if k not in ("useful",)}
        action = Action(QUERY, text, "", extra)
        action = dataclasses.replace(action, raw=agent.format(action),
                                     extra={**extra, "refined": True, "original_query": orig.text})
        state = ep.state(c.step)
        step = Step(action=action, prompt=agent.render(state), timing={"generate_s": 0.0})
        meta = {k: v for k, v in ep.metadata.items() if k not in (CREDIT_KEY, REFINED_KEY)}
        meta[REFINED_KEY] = {"step": c.step, "original_query": orig.text, "refined_query": text,
                             "explanation": c.explanation}
        partials.append(Episode(ep.qid, ep.question, list(ep.gold), agent=ep.agent, choices=list(ep.choices),
                                references=list(ep.references), steps=copy.deepcopy(ep.steps[: c.step]) + [step],
                                metadata=meta))
        states.append(state)
        steps.append(step)
        kept[e] = kept.get(e, 0) + 1
    if steps:
        execute(states, steps, retriever, agent, cfg.k, summarizer if summarizer is not None else policy,
                summary_max_new_tokens=cfg.summary_max_new_tokens, summary_temperature=cfg.summary_temperature,
                seed=cfg.seed)
    out = rollout(policy, retriever, agent, partials, cfg, summarizer=summarizer, stats=stats) if partials else []
    return Refinement(out, failures, len(reqs))


# ---------------------------------------------------------------------------------------------- curriculum data
def sft_filter(episodes: Sequence[Episode], cfg: SmartSearchConfig = SmartSearchConfig()) -> list[Episode]:
    """Stage 1: trajectories with a correct answer, the proper format, and every S_t = 1 (004 §4.4; code
    transfer_sft.py: format == 1, every redundancy ≤ 1, every judge score "1", F1 ≥ 0.8)."""
    out = []
    for ep in episodes:
        if not is_correct(ep, cfg) or not format_check(ep)[0]:
            continue
        credits = credits_of(ep)
        if credits is None:
            if cfg.require_judged:
                continue
            if all(step_labels(ep, cfg)[0]):
                out.append(ep)
            continue
        if all(c.good for c in credits) and (not cfg.require_judged or all(c.useful == 1 for c in credits)):
            out.append(ep)
    return out


def preference_key(ep: Episode, cfg: SmartSearchConfig = SmartSearchConfig()) -> tuple[int, int]:
    """Stage-2 order (004 §4.4): correct ≻ incorrect; among correct fewer S_t = 0; among incorrect more S_t = 1."""
    labels, _ = step_labels(ep, cfg)
    if is_correct(ep, cfg):
        return 1, -sum(1 for g in labels if not g)
    return 0, sum(1 for g in labels if g)


def trajectory_text(ep: Episode, agent) -> str:
    """Everything the agent wrote after the first prompt, as the agent renders it (results included), plus the final
    answer: the DPO target of a whole trajectory."""
    first = agent.render(ep.state(0))
    full = agent.render(ep.state())
    last = ep.steps[-1].action if ep.steps else None
    if full.startswith(first):
        body = full[len(first):]
        if last is not None and last.kind != QUERY:
            body += agent.format(last)
        return body
    return "\n".join(agent.format(s.action) for s in ep.steps)


def dpo_pairs(episodes: Sequence[Episode], agent, cfg: SmartSearchConfig = SmartSearchConfig()) -> list[Pair]:
    """Stage 2: preference pairs among each question's trajectories (original and refined, grouped by qid).

    pairs="paper": one pair per question, the best ≻ the worst by `preference_key` (first in input order on ties);
    pairs="all": every strictly ordered combination. margin = r_comp(chosen) − r_comp(rejected)."""
    cfg.validate()
    groups: "OrderedDict[str, list[Episode]]" = OrderedDict()
    for ep in episodes:
        groups.setdefault(ep.qid, []).append(ep)
    out = []
    for qid, group in groups.items():
        keyed = [(preference_key(ep, cfg), ep) for ep in group]
        if cfg.pairs == "paper":
            best = max(keyed, key=lambda x: x[0])  # max/min keep the first of equal keys
            worst = min(keyed, key=lambda x: x[0])
            combos = [(best, worst)] if best[0] > worst[0] else []
        else:
            combos = [(a, b) for a in keyed for b in keyed if a[0] > b[0]]
        prompt = agent.render(group[0].state(0))
        for (ka, a), (kb, b) in combos:
            ta, tb = trajectory_text(a, agent), trajectory_text(b, agent)
            if ta.strip() == tb.strip():
                continue
            out.append(Pair(prompt, ta, tb, _r_comp(a, cfg) - _r_comp(b, cfg), "smartsearch", qid, 0))
    return out


def _r_comp(ep: Episode, cfg: SmartSearchConfig) -> float:
    labels, _ = step_labels(ep, cfg)
    bad = sum(1 for g in labels if not g)
    return composite(is_correct(ep, cfg), bad, len(labels) - bad, cfg)


def credit_records(episodes: Sequence[Episode], agent) -> list[ProcessRecord]:
    """One ProcessRecord per judged search step (source "smartsearch", score = S_t, rationale = T_t)."""
    out = []
    for ep in episodes:
        for c in credits_of(ep) or []:
            step = ep.steps[c.step]
            state = ep.state(c.step)
            cand = ScoredCandidate(step.action.raw or agent.format(step.action), step.action, float(c.good),
                                   rationale=c.explanation, failure=c.failure, token_ids=list(step.token_ids),
                                   logprobs=list(step.logprobs),
                                   extra={"overlap": c.overlap, "novel": c.novel, "useful": c.useful})
            out.append(ProcessRecord(ep.qid, ep.question, list(ep.gold), agent.name, state.history,
                                     agent.render(state), [cand], "smartsearch", step=c.step))
    return out


def search_quality(episodes: Sequence[Episode], cfg: SmartSearchConfig = SmartSearchConfig()) -> dict:
    """Perfect / Partial / SQ (004 §5.1) over episodes, with S_t from `step_labels` (jaxrag.metrics.search_quality)."""
    return metrics.search_quality([is_correct(ep, cfg) for ep in episodes],
                                  [[bool(g) for g in step_labels(ep, cfg)[0]] for ep in episodes])
