"""ARENA adaptive reward (003 §3.3; METHODS.md §5), registered as reward "arena".

  format    ∈ {0, 1}: <relevance>, <analysis>, <answer> all present, closed and in this order
  accuracy  ∈ {0, 1}: normalized exact match of the <answer> text against the gold answers
  relevance ∈ {0, 0.5, 1}: 1 if the cited reference ids equal the gold supporting ids, 0.5 if they overlap, else 0
  bonus     = 10 if all three are 1, else 0
  total     = format + accuracy + relevance + bonus (all weights 1; code configs/grpo.yaml reward_weights)

The scoring rules are jaxrag.metrics' (`arena_reward`, shared with the ARENA evaluation metrics). The text scored is
the episode's last generation (ARENA answers in one step); the cited ids are the agent's parse of <relevance>
(`action.extra["relevance"]`); the gold ids are `episode.metadata["gold_ref_ids"]` (1-based positions of the
supporting paragraphs among the references, set by the rollout engine from the dataset's supporting titles).

`strict_format` is the released code's stricter check (src/evaluate.py format_score): the reply starts with the three
sections, separated only by whitespace, with no '<' inside any of them, </answer> ending a line.

The ablations of 003 §5.3 (Fig. 3; configs/arena/fig3.py) register their own rewards:
  "arena_nobonus"  w/o bonus reward: format + accuracy + relevance (App. I)
  "arena_f1acc"    F1 accuracy: the accuracy term is the answer's token F1 (max over the gold answers) instead of EM;
                   the bonus still needs all three terms at 1
  "arena_naive"    Naive-GRPO (§4.3: "format and accuracy rewards", for the agent "arena_naive"): format = the
                   original recipe's check (open-r1 format_reward: the reply is <think>…</think>, whitespace,
                   <answer>…</answer> ending a line) + EM accuracy of the <answer>
  "arena_ljacc"    LJ accuracy: the accuracy term is an LLM judge's verdict on the <answer> text with ARENA's LJ
                   prompt (jaxrag.judge.LJ_PROMPT; the released src/rewards.py accuracy_reward, commented out there:
                   an empty answer scores 0 without a call, "yes" 1, "no" 0, a reply that says neither 0.5). Here a
                   judge that fails after its retries also scores 0.5, and the component lj_failed counts it. A
                   judged reward (rewards.register_judged): the RL stage's answer_judge section names the endpoint;
                   `prepare` asks about a batch's answers `workers` at a time.
"""

from __future__ import annotations

import re
from typing import Callable, Sequence

from jaxrag import metrics
from jaxrag.env.mdp import ANSWER, Episode
from jaxrag.judge import verdict_record
from jaxrag.supervision.rewards import Reward, register, register_judged

BONUS = 10.0
ACCURACY = {"em": metrics.exact_match, "f1": metrics.f1_score}
_THINK_ANSWER = re.compile(r"^<think>.*?</think>\s*<answer>.*?</answer>$", re.S | re.M)   # open-r1 format_reward
_STRICT = re.compile(r"<relevance>[^<]*</relevance>\s*<analysis>[^<]*</analysis>\s*<answer>[^<]*</answer>$", re.M)


def strict_format_score(text: str) -> float:
    """1 if the reply starts with <relevance>…</relevance> <analysis>…</analysis> <answer>…</answer> (whitespace
    between, no '<' inside) and </answer> ends a line: the code's anchored, multiline regex."""
    return float(bool(_STRICT.match(text or "")))


def arena_episode_reward(ep: Episode, *, bonus: float = BONUS, strict_format: bool = False,
                         accuracy: str | Callable = "em") -> Reward:
    """The adaptive reward of one ARENA episode; components: format, accuracy, relevance, bonus. accuracy: "em"
    (the paper's), "f1" (Fig. 3's F1-accuracy ablation) or a function (answer, golds) -> score."""
    if not callable(accuracy) and accuracy not in ACCURACY:
        raise ValueError(f"arena reward: accuracy must be one of {sorted(ACCURACY)} or a function, got {accuracy!r}")
    text, answer = _reply(ep)
    cited = list(ep.steps[-1].action.extra.get("relevance", [])) if ep.steps else []
    parts = metrics.arena_reward(text, answer, ep.gold, cited, list(ep.metadata.get("gold_ref_ids", [])),
                                 bonus=bonus, accuracy=accuracy if callable(accuracy) else ACCURACY[accuracy],
                                 format_score=strict_format_score if strict_format else None)
    return Reward(float(parts["total"]), {k: float(parts[k]) for k in ("format", "accuracy", "relevance", "bonus")})


def _reply(ep: Episode) -> tuple[str, str | None]:
    """(the last generation's text, the episode's answer): ARENA answers in one step."""
    last = ep.steps[-1] if ep.steps else None
    text = last.action.raw if last is not None else ""
    answer = ep.answer if ep.answer is not None else (last.action.text if last and last.action.kind == ANSWER else None)
    return text or "", answer


def naive_format_score(text: str) -> float:
    """1 if the reply is <think>…</think>, whitespace, then <answer>…</answer> ending a line (open-r1's
    format_reward: re.match with DOTALL | MULTILINE, so text on later lines still passes)."""
    return float(bool(_THINK_ANSWER.match(text or "")))


@register("arena")
def arena_reward(ep: Episode) -> Reward:
    return arena_episode_reward(ep)


@register("arena_nobonus")
def arena_nobonus_reward(ep: Episode) -> Reward:
    return arena_episode_reward(ep, bonus=0.0)


@register("arena_f1acc")
def arena_f1acc_reward(ep: Episode) -> Reward:
    return arena_episode_reward(ep, accuracy="f1")


@register("arena_naive")
def arena_naive_reward(ep: Episode) -> Reward:
    """Naive-GRPO: format (the <think>/<answer> check) + EM accuracy."""
    text, answer = _reply(ep)
    fmt, acc = naive_format_score(text), metrics.exact_match(answer, ep.gold)
    return Reward(fmt + acc, {"format": fmt, "accuracy": acc})


LJ_UNDECIDED = 0.5   # the released get_score's value for a reply that is neither yes nor no


@register_judged("arena_ljacc")
def arena_ljacc_reward(judge):
    """LJ accuracy (Fig. 3): ARENA's reward with the judge's verdict as the accuracy term (see the module doc).
    Each episode keeps its verdict record in metadata["lj"], as the eval's LJ does."""
    def prepare(episodes: Sequence[Episode]) -> None:
        todo = [ep for ep in episodes if "lj" not in ep.metadata]
        for ep, (verdict, r) in zip(todo, judge.judge_answers([(ep.gold, _reply(ep)[1]) for ep in todo])):
            ep.metadata["lj"] = verdict_record(verdict, r)

    def fn(ep: Episode) -> Reward:
        if "lj" not in ep.metadata:
            prepare([ep])
        verdict = ep.metadata["lj"]["verdict"]
        acc = LJ_UNDECIDED if verdict is None else float(verdict)
        r = arena_episode_reward(ep, accuracy=lambda answer, golds: acc)
        return Reward(r.total, {**r.components, "lj_failed": float(verdict is None)})

    fn.prepare = prepare
    return fn
