"""Evaluation: agent x dataset -> episodes JSONL + metrics + a RAG-Gym-Table-2-style markdown/CSV table.

`evaluate(policy, retriever, agent, examples, ...) -> (episodes, metrics)`; `episode_metrics`; `results_table`.
The stage that runs it from a config is jaxrag.pipelines.eval:eval_stage.
"""
from __future__ import annotations

import csv
import io
import logging
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from jaxrag import metrics as M
from jaxrag.env.mdp import Episode, write_episodes
from jaxrag.env.rollout import RolloutConfig, rollout

log = logging.getLogger(__name__)


def episode_metrics(episodes: Sequence[Episode], judge=None) -> dict:
    """Aggregate metrics (fractions in [0, 1]) over finished episodes."""
    n = len(episodes)
    if n == 0:
        return {"n": 0}
    mc = any(ep.choices for ep in episodes)
    em = [M.exact_match(ep.answer, ep.gold) for ep in episodes]
    f1 = [M.f1_score(ep.answer, ep.gold) for ep in episodes]
    out: dict[str, Any] = {
        "n": n,
        "em": float(np.mean(em)), "f1": float(np.mean(f1)),
        "cem": float(np.mean([M.cover_exact_match(ep.answer, ep.gold) for ep in episodes])),
        "answered": float(np.mean([ep.answer is not None for ep in episodes])),
        "invalid_rate": M.invalid_rate([ep.num_invalid for ep in episodes], [len(ep.steps) for ep in episodes]),
        "episodes_with_invalid": float(np.mean([ep.num_invalid > 0 for ep in episodes])),
        "steps_mean": float(np.mean([len(ep.steps) for ep in episodes])),
        "return_mean": float(np.mean([ep.ret for ep in episodes])),
        "se": M.search_efficiency(f1, [ep.num_searches for ep in episodes]),
    }
    if mc:
        out["acc"] = float(np.mean([M.choice_accuracy(ep.answer, ep.gold, ep.choices) for ep in episodes]))
    out.update({f"searches_{k}": v for k, v in M.search_count_stats(ep.num_searches for ep in episodes).items()})
    for reason in ("answer", "max_steps", "invalid"):
        out[f"done_{reason}"] = float(np.mean([ep.done == reason for ep in episodes]))
    if any(ep.agent == "arena" for ep in episodes):
        fmt, rel = [], []
        for ep in episodes:
            raw = ep.steps[-1].action.raw if ep.steps else ""
            fmt.append(M.arena_format_score(raw))
            pred = ep.steps[-1].action.extra.get("relevance", []) if ep.steps else []
            rel.append(M.arena_relevance_score(pred, ep.metadata.get("gold_ref_ids", [])))
        out["arena_format"], out["arena_relevance"] = float(np.mean(fmt)), float(np.mean(rel))
    if judge is not None:
        out.update(judge_episodes(episodes, judge))
    return out


def failure_kind(failure: str) -> str:
    """'HTTP 429 (Retry-After 2s)' -> 'HTTP 429'; 'unparseable reply: ...' -> 'unparseable reply'."""
    head = failure.split(":", 1)[0].split(" (", 1)[0].strip()
    return " ".join(head.split()[:2]) if head.startswith(("HTTP", "timeout")) else head


def judge_episodes(episodes: Sequence[Episode], judge) -> dict:
    """LJ (judge: jaxrag.judge.OpenAIJudge) over the episodes the judge could judge, with the counts that say how far to trust it: lj_judged,
    lj_failed and lj_failures ({kind: count}). Each episode keeps its own record in metadata["lj"] (verdict, or
    the failure with attempts and seconds), so the episodes file says which items were not judged and why."""
    verdicts, kinds = [], {}
    for ep in episodes:
        verdict, r = judge.judge_answer_result(ep.gold, ep.answer)  # r None: no answer to judge (verdict False)
        rec: dict[str, Any] = {"verdict": verdict}
        if r is not None:
            rec.update(attempts=r.attempts, seconds=round(r.seconds, 3))
        if verdict is None:
            rec["failure"] = r.failure
            kind = failure_kind(rec["failure"])
            kinds[kind] = kinds.get(kind, 0) + 1
        ep.metadata["lj"] = rec
        verdicts.append(verdict)
    ok = [v for v in verdicts if v is not None]
    if kinds:
        log.warning("LJ judge failed on %d of %d answers (%s)", len(verdicts) - len(ok), len(verdicts),
                    ", ".join(f"{k}: {n}" for k, n in sorted(kinds.items())))
    return {"lj": float(np.mean(ok)) if ok else float("nan"), "lj_judged": len(ok),
            "lj_failed": len(verdicts) - len(ok), "lj_failures": kinds}


def evaluate(policy, retriever, agent, examples: Sequence, *, cfg: RolloutConfig | None = None, judge=None,
             out_path: str | Path | None = None, select=None, summarizer=None, **overrides) -> tuple[list[Episode], dict]:
    """Roll out `agent` on `examples`; returns (episodes, metrics). `overrides` update the RolloutConfig."""
    cfg = cfg or RolloutConfig()
    if overrides:
        import dataclasses
        cfg = dataclasses.replace(cfg, **overrides)
    stats: dict = {}
    episodes = rollout(policy, retriever, agent, examples, cfg, select=select, summarizer=summarizer, stats=stats)
    m = episode_metrics(episodes, judge=judge)
    m["timing"] = {k: round(v, 4) if isinstance(v, float) else v for k, v in stats.items()}
    if stats.get("total_s"):
        m["episodes_per_s"] = len(episodes) / stats["total_s"]
    if out_path is not None:
        write_episodes(out_path, episodes)
    return episodes, m


# ---- tables ---------------------------------------------------------------------------------------------
def _is_mc(metrics: dict) -> bool:
    return "acc" in metrics


def results_table(results: dict[str, dict[str, dict]], datasets: Sequence[str] | None = None) -> tuple[str, str]:
    """results[method][dataset] = metrics -> (markdown, csv), laid out like RAG-Gym Table 2:
    EM / F1 per open-domain dataset, Acc for multiple choice, then Avg EM / Avg F1 over open-domain ones
    (and Avg over all datasets, counting Acc for MC and F1 otherwise). Values in percent. Where a judge ran, each
    dataset also gets LJ and "judged/n" (LJ averages only the answers the judge could judge)."""
    datasets = list(datasets or dict.fromkeys(d for r in results.values() for d in r))
    mc = {d: any(_is_mc(r.get(d, {})) for r in results.values()) for d in datasets}
    lj = {d: any("lj" in r.get(d, {}) for r in results.values()) for d in datasets}
    header = ["Method"]
    for d in datasets:
        header += [f"{d} Acc"] if mc[d] else [f"{d} EM", f"{d} F1"]
        header += [f"{d} LJ", f"{d} LJ judged/n"] if lj[d] else []
    header += ["Avg EM", "Avg F1"] + (["Avg"] if any(mc.values()) else [])
    rows = []
    for method, per in results.items():
        row: list[Any] = [method]
        ems, f1s, alls = [], [], []
        for d in datasets:
            m = per.get(d)
            if m is None or not m.get("n"):
                row += ([None] if mc[d] else [None, None]) + ([None, None] if lj[d] else [])
                continue
            if mc[d]:
                row.append(100 * m["acc"])
                alls.append(100 * m["acc"])
            else:
                row += [100 * m["em"], 100 * m["f1"]]
                ems.append(100 * m["em"])
                f1s.append(100 * m["f1"])
                alls.append(100 * m["f1"])
            if lj[d]:  # LJ is over the answers the judge could judge: say how many
                judged = m.get("lj_judged")
                row += [100 * m["lj"] if judged else None, f"{judged}/{m['n']}" if "lj" in m else None]
        row += [np.mean(ems) if ems else None, np.mean(f1s) if f1s else None]
        if any(mc.values()):
            row.append(np.mean(alls) if alls else None)
        rows.append(row)
    fmt = lambda v: "-" if v is None else (f"{v:.2f}" if isinstance(v, (float, np.floating)) else str(v))
    md = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    md += ["| " + " | ".join(fmt(v) for v in r) + " |" for r in rows]
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(header)
    for r in rows:
        w.writerow(["" if v is None else (round(float(v), 4) if not isinstance(v, str) else v) for v in r])
    return "\n".join(md) + "\n", buf.getvalue()
