"""ARENA adaptive reward (003 §3.3; METHODS.md §5), registered as reward "arena".

total = format + accuracy + relevance + bonus (10 when all three are 1), scored by `arena_episode_reward` from the
episode's last generation, in the released code's "strict" reading by default or the "lenient" one
(`arena_lenient`). The ablations of 003 §5.3 (Fig. 3) register their own rewards: "arena_nobonus", "arena_f1acc",
"arena_naive" and the judged "arena_ljacc" (an LLM judge's verdict as the accuracy term).

Details (each term, both readings, the ablations): docs/conformance.md, ARENA, "The reward".
"""

from __future__ import annotations

import re
from typing import Callable, Sequence

from jaxrag import metrics
from jaxrag.env.mdp import ANSWER, Episode
from jaxrag.judge import verdict_record
from jaxrag.supervision.rewards import Reward, register, register_judged

BONUS = 10.0
FORMATS = ("strict", "lenient")
ACCURACY = {"strict": {"em": metrics.arena_exact_match, "f1": metrics.arena_f1},
            "lenient": {"em": metrics.exact_match, "f1": metrics.f1_score}}
_THINK_ANSWER = re.compile(r"^<think>.*?</think>\s*<answer>.*?</answer>$", re.S | re.M)   # open-r1 format_reward


def strict_format_score(text: str) -> float:
    """1 if the reply starts with <relevance>…</relevance> <analysis>…</analysis> <answer>…</answer> (whitespace
    between, no '<' inside) and </answer> ends a line: the code's anchored, multiline regex."""
    return metrics.arena_code_format(text)


def arena_episode_reward(ep: Episode, *, bonus: float = BONUS, format: str = "strict",
                         accuracy: str | Callable = "em") -> Reward:
    """The adaptive reward of one ARENA episode; components: format, accuracy, relevance, bonus. format: "strict"
    (the released code's reading) or "lenient" (see the module doc). accuracy: "em" (the paper's), "f1" (Fig. 3's
    F1-accuracy ablation) or a function (answer, golds) -> score."""
    if format not in FORMATS:
        raise ValueError(f"arena reward: format must be one of {FORMATS}, got {format!r}")
    if not callable(accuracy) and accuracy not in ACCURACY[format]:
        raise ValueError(f"arena reward: accuracy must be one of {sorted(ACCURACY[format])} or a function, "
                         f"got {accuracy!r}")
    acc_fn = accuracy if callable(accuracy) else ACCURACY[format][accuracy]
    text, answer = _reply(ep)
    gold_ids = list(ep.metadata.get("gold_ref_ids", []))
    if format == "strict":
        parts = metrics.arena_code_reward(text, ep.gold, gold_ids, bonus=bonus, accuracy=acc_fn)
    else:
        cited = list(ep.steps[-1].action.extra.get("relevance", [])) if ep.steps else []
        parts = metrics.arena_reward(text, answer, ep.gold, cited, gold_ids, bonus=bonus, accuracy=acc_fn)
    return Reward(float(parts["total"]), {k: float(parts[k]) for k in ("format", "accuracy", "relevance", "bonus")})


def _reply(ep: Episode) -> tuple[str, str | None]:
    """(the last generation's text, the episode's answer): ARENA answers in one step."""
    last = ep.steps[-1] if ep.steps else None
    text = last.action.raw if last is not None else ""
    answer = ep.answer if ep.answer is not None else (last.action.text if last and last.action.kind == ANSWER else None)
    return text or "", answer


def code_answer(ep: Episode) -> str:
    """The answer as the released code reads it: the first closed <answer>'s text of the last generation."""
    return metrics.arena_code_section(_reply(ep)[0], "answer")


def naive_format_score(text: str) -> float:
    """1 if the reply is <think>…</think>, whitespace, then <answer>…</answer> ending a line (open-r1's
    format_reward: re.match with DOTALL | MULTILINE, so text on later lines still passes)."""
    return float(bool(_THINK_ANSWER.match(text or "")))


@register("arena")
def arena_reward(ep: Episode) -> Reward:
    return arena_episode_reward(ep)


@register("arena_lenient")
def arena_lenient_reward(ep: Episode) -> Reward:
    return arena_episode_reward(ep, format="lenient")


@register("arena_nobonus")
def arena_nobonus_reward(ep: Episode) -> Reward:
    return arena_episode_reward(ep, bonus=0.0)


@register("arena_f1acc")
def arena_f1acc_reward(ep: Episode) -> Reward:
    return arena_episode_reward(ep, accuracy="f1")


@register("arena_naive")
def arena_naive_reward(ep: Episode) -> Reward:
    """Naive-GRPO: format (the <think>/<answer> check) + EM accuracy."""
    fmt, acc = naive_format_score(_reply(ep)[0]), metrics.arena_exact_match(code_answer(ep), ep.gold)
    return Reward(fmt + acc, {"format": fmt, "accuracy": acc})


LJ_UNDECIDED = 0.5   # the released get_score's value for a reply that is neither yes nor no


@register_judged("arena_ljacc")
def arena_ljacc_reward(judge):
    """LJ accuracy (Fig. 3): ARENA's reward with the judge's verdict as the accuracy term (see the module doc).
    Each episode keeps its verdict record in metadata["lj"], as the eval's LJ does."""
    def prepare(episodes: Sequence[Episode]) -> None:
        todo = [ep for ep in episodes if "lj" not in ep.metadata]
        for ep, (verdict, r) in zip(todo, judge.judge_answers([(ep.gold, code_answer(ep)) for ep in todo])):
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
