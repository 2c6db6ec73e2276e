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
"""

from __future__ import annotations

import re

from jaxrag import metrics
from jaxrag.env.mdp import ANSWER, Episode
from jaxrag.supervision.rewards import Reward, register

BONUS = 10.0
_STRICT = re.compile(r"<relevance>[^<]*</relevance>\s*<analysis>[^<]*</analysis>\s*<answer>[^<]*</answer>$", re.M)


def strict_format_score(text: str) -> float:
    """1 if the reply starts with <relevance>…</relevance> <analysis>…</analysis> <answer>…</answer> (whitespace
    between, no '<' inside) and </answer> ends a line: the code's anchored, multiline regex."""
    return float(bool(_STRICT.match(text or "")))


def arena_episode_reward(ep: Episode, *, bonus: float = BONUS, strict_format: bool = False) -> Reward:
    """The adaptive reward of one ARENA episode; components: format, accuracy, relevance, bonus."""
    last = ep.steps[-1] if ep.steps else None
    text = last.action.raw if last is not None else ""
    cited = list(last.action.extra.get("relevance", [])) if last is not None else []
    answer = ep.answer if ep.answer is not None else (last.action.text if last and last.action.kind == ANSWER else None)
    gold_ids = list(ep.metadata.get("gold_ref_ids", []))
    parts = metrics.arena_reward(text, answer, ep.gold, cited, gold_ids, bonus=bonus)
    if strict_format:
        fmt = strict_format_score(text)
        full = fmt == 1 and parts["accuracy"] == 1 and parts["relevance"] == 1
        parts = {**parts, "format": fmt, "bonus": bonus if full else 0.0}
        parts["total"] = parts["format"] + parts["accuracy"] + parts["relevance"] + parts["bonus"]
    return Reward(float(parts["total"]), {k: float(parts[k]) for k in ("format", "accuracy", "relevance", "bonus")})


@register("arena")
def arena_reward(ep: Episode) -> Reward:
    return arena_episode_reward(ep)
