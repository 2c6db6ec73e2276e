"""ARENA adaptive reward (003 §3.3; METHODS.md §5), registered as reward "arena".

  format    ∈ {0, 1}: the reply is the <relevance>, <analysis>, <answer> sections
  accuracy  ∈ {0, 1}: exact match of the <answer> text against the gold answers
  relevance ∈ {0, 0.5, 1}: 1 if the cited reference ids equal the gold supporting ids, 0.5 if they overlap, else 0
  bonus     = 10 if all three are 1, else 0
  total     = format + accuracy + relevance + bonus (all weights 1; code configs/grpo.yaml reward_weights)

Two readings of these rules, chosen by `format`:
  "strict" (default; every registered ARENA reward but "arena_lenient"): the released code's (src/evaluate.py
      get_all_scores; jaxrag.metrics.arena_code_reward), scored from the reply text alone: the reply must start with
      the three sections, only whitespace between, no '<' inside one, `</answer>` ending a line; the answer is the
      first closed <answer> ("" without one); the ids are the first <relevance> read as a JSON list ("1, 3" cites
      nothing); EM under ARENA's normalization (jaxrag.metrics.arena_normalize: punctuation -> spaces, so "U.S." is
      not "US", while "Harry’s Bar" and "New_York" match). Conformance: tests/conformance/test_conformance_arena.py.
  "lenient" (reward "arena_lenient"): jaxrag's first reading of the paper: the sections in order anywhere in the
      text, the agent's parse of the answer (the last <answer>, an unclosed one accepted) and of the ids (any digits),
      the official SQuAD normalization, and an empty citation never counts as relevant.

The text scored is the episode's last generation (ARENA answers in one step); the gold ids are
`episode.metadata["gold_ref_ids"]` (1-based positions of the supporting paragraphs among the references, set by the
rollout engine from the dataset's supporting titles).

The ablations of 003 §5.3 (Fig. 3; configs/arena/fig3.py) register their own rewards (all "strict"):
  "arena_nobonus"  w/o bonus reward: format + accuracy + relevance (App. I)
  "arena_f1acc"    F1 accuracy: the accuracy term is the answer's token F1 (max over the gold answers; the released
                   evaluate.py f1_score: ARENA's normalization, no yes/no rule) instead of EM; the bonus still needs
                   all three terms at 1
  "arena_naive"    Naive-GRPO (§4.3: "format and accuracy rewards", for the agent "arena_naive"): format = the
                   original recipe's check (open-r1 format_reward: the reply is <think>…</think>, whitespace,
                   <answer>…</answer> ending a line) + EM accuracy of the first closed <answer>
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
