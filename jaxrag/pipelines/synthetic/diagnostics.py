"""Did a method have anything to learn from, and did it move the policy? Figures read off a finished workdir.

training_signal: per training stage, its data (pairs, trajectories, RL questions), steps, summed learning rate (the
update budget, beside SFT's), the paired losses' accuracy and margin over the last tenth of the steps, and for RL the
share of groups with no reward variance (they carry no gradient), the mean KL to the reference and the reward of the
first and last tenth of the steps.
movement: per evaluated system, against a base system on the same questions, how often its trajectory (the sequence
of actions) and its answer differ, and how many questions it gained and lost (EM).
pair_targets: for preference pairs, how often the initial policy's own greedy action at the pair's state is the
rejected one (the pair pushes down what the policy does) or the chosen one (it reinforces what it already does).
"""

from __future__ import annotations

import os

import numpy as np

from jaxrag.jsonl import read_jsonl
from jaxrag.metrics import exact_match
from jaxrag.pipelines.common import read_json

DATA_KEYS = (("pairs", "pairs"), ("trajectories", "trajectories"), ("questions", "RL questions"),
             ("episodes", "episodes"))


def _tenth(rows, key, last=True):
    vals = [r[key] for r in rows if key in r]
    if not vals:
        return None
    n = max(1, len(vals) // 10)
    return float(np.mean(vals[-n:] if last else vals[:n]))


def training_signal(workdir, stage: str) -> dict | None:
    """The figures of the module doc for one stage's summary.json and metrics.jsonl; None when it has no train
    rows."""
    path = os.path.join(str(workdir), stage, "metrics.jsonl")
    if not os.path.exists(path):
        return None
    rows = [r for r in read_jsonl(path) if r.get("kind", "train") == "train" and "lr" in r]
    if not rows:
        return None
    summary_path = os.path.join(str(workdir), stage, "summary.json")
    summary = read_json(summary_path) if os.path.exists(summary_path) else {}
    data = next(((label, summary[k]) for k, label in DATA_KEYS if k in summary), (None, None))
    out = {"stage": stage, "steps": len(rows), "data": data[1], "data_kind": data[0],
           "lr_sum": float(sum(r["lr"] for r in rows))}
    keys = sorted({k for r in rows for k in r})
    acc = next((k for k in keys if k.endswith("/accuracy")), None)
    margin = next((k for k in keys if k.endswith("/reward_margin") or k.endswith("/margin")), None)
    if acc:
        out["accuracy"] = _tenth(rows, acc)
    if margin:
        out["margin"] = _tenth(rows, margin)
    if "reward/groups_without_signal" in keys:
        out["no_signal"] = float(np.mean([r["reward/groups_without_signal"] for r in rows]))
        kl = next((k for k in ("kl/k1", "kl/k2", "kl/k3") if k in keys), None)
        out["kl"] = float(np.mean([r[kl] for r in rows if kl in r])) if kl else None
        out["reward_first"], out["reward_last"] = _tenth(rows, "reward/mean", False), _tenth(rows, "reward/mean")
    return out


def _actions(ep) -> tuple:
    return tuple((s.action.kind, s.action.text.strip().lower()) for s in ep.steps)


def movement(base_episodes, episodes) -> dict:
    """How a system's episodes differ from a base's on the questions both answered (module doc)."""
    base = {ep.qid: ep for ep in base_episodes}
    pairs = [(base[ep.qid], ep) for ep in episodes if ep.qid in base]
    em = [(exact_match(b.answer, b.gold), exact_match(e.answer, e.gold)) for b, e in pairs]
    n = len(pairs)
    return {"n": n,
            "trajectory_changed": sum(_actions(b) != _actions(e) for b, e in pairs) / n if n else 0.0,
            "answer_changed": sum((b.answer or "").strip().lower() != (e.answer or "").strip().lower()
                                  for b, e in pairs) / n if n else 0.0,
            "gained": sum(1 for b, e in em if e and not b), "lost": sum(1 for b, e in em if b and not e)}


def pair_targets(policy, agent, pairs, max_new_tokens: int = 40) -> dict:
    """Greedy-decode `policy` at every pair's prompt (one batch) and compare its parsed action with the pair's:
    {"pairs", "rejected_is_greedy", "chosen_is_greedy"} (shares of the pairs). A pair whose rejected action the
    greedy policy never takes cannot change its greedy behaviour by pushing that action down."""
    if not pairs:
        return {"pairs": 0, "rejected_is_greedy": None, "chosen_is_greedy": None}
    outs = policy.generate([p.prompt for p in pairs], n=1, temperature=0.0, max_new_tokens=max_new_tokens,
                           stop=list(agent.stop) or None)
    key = lambda text: (lambda a: (a.kind, a.text.strip().lower()))(agent.parse(text))
    greedy = [key(o[0].text) for o in outs]
    n = len(pairs)
    return {"pairs": n, "rejected_is_greedy": sum(g == key(p.rejected) for g, p in zip(greedy, pairs)) / n,
            "chosen_is_greedy": sum(g == key(p.chosen) for g, p in zip(greedy, pairs)) / n}


def signal_table(rows: list[dict], base_lr: float | None) -> str:
    """Markdown of training_signal rows; Σ lr also as a share of `base_lr` (SFT's)."""
    def f(x, fmt="{:.3f}"):
        return "-" if x is None else fmt.format(x)

    lines = ["| stage | data | steps | Σ lr (vs SFT) | accuracy / margin, last tenth | rejected / chosen is the "
             "policy's greedy action | groups without signal | KL | reward first → last tenth |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        share = f" ({r['lr_sum'] / base_lr:.2%})" if base_lr else ""
        data = f"{r['data']} {r['data_kind']}" if r["data"] is not None else "-"
        acc = f"{f(r.get('accuracy'))} / {f(r.get('margin'))}" if "accuracy" in r else "-"
        reward = (f"{f(r['reward_first'])} → {f(r['reward_last'])}" if "reward_first" in r else "-")
        targets = (f"{f(r['rejected_is_greedy'])} / {f(r['chosen_is_greedy'])}" if "rejected_is_greedy" in r
                   else "-")
        lines.append(f"| {r['stage']} | {data} | {r['steps']} | {r['lr_sum']:.3g}{share} | {acc} | {targets} | "
                     f"{f(r.get('no_signal'))} | {f(r.get('kl'), '{:.4f}')} | {reward} |")
    return "\n".join(lines)


def movement_table(rows: dict[str, dict], base: str) -> str:
    lines = [f"| system | n | trajectory differs from {base} | answer differs | EM gained | EM lost |",
             "|---|---|---|---|---|---|"]
    for name, m in rows.items():
        lines.append(f"| {name} | {m['n']} | {m['trajectory_changed']:.3f} | {m['answer_changed']:.3f} | "
                     f"{m['gained']} | {m['lost']} |")
    return "\n".join(lines)
