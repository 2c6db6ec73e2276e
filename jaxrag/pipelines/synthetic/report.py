"""Evaluation results -> markdown/CSV tables and PNG plots (matplotlib, Agg backend).

`results` is the eval stage's results.json: {"seed", "k", "systems": {name: {"agent", "model", "splits":
{split: {"all"|by_type[t]|by_hops[h]: jaxrag.evaluate.episode_metrics}}}}}.
`curves` maps a training stage name to its metrics.jsonl rows ({"kind": "train"|"eval", "step", "loss", ...}).
"""

from __future__ import annotations

import csv
import os
import shutil

import matplotlib

from jaxrag.cpu_numerics import PORTABLE
from jaxrag.env.agents import get_agent
from jaxrag.env.mdp import read_episodes
from jaxrag.evaluate import binomial_se
from jaxrag.jsonl import iter_jsonl
from jaxrag.machine import cpu
from jaxrag.pipelines.common import log, read_json, stage_dir, write_json
from jaxrag.pipelines.synthetic import checks
from jaxrag.pipelines.synthetic import diagnostics as D
from jaxrag.pipelines.synthetic.taxonomy import taxonomy_table
from jaxrag.pipelines.synthetic.world import load_tokenizer, stage_policy
from jaxrag.provenance import collect, short
from jaxrag.supervision.records import read_pairs
from jaxrag.train.distributed import lead_only

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLUMNS = (
    "system",
    "split",
    "type",
    "n",
    "em",
    "f1",
    "se",
    "searches_min",
    "searches_mean",
    "searches_max",
    "invalid_rate",
)


def save_figure(fig, axes, path, legend_size: int = 8) -> None:
    """Grid and legend on every axis, tight layout, PNG at 110 dpi, figure closed."""
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=legend_size)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def table_rows(results: dict) -> list[dict]:
    rows = []
    for sysname, sysres in results["systems"].items():
        for split, r in sysres["splits"].items():
            groups = [("all", r["all"])] + sorted(r["by_type"].items())
            for qtype, g in groups:
                rows.append(
                    {
                        "system": sysname,
                        "split": split,
                        "type": qtype,
                        "n": g["n"],
                        "em": g["em"],
                        "f1": g["f1"],
                        "se": g["se"],
                        "searches_min": g["searches_min"],
                        "searches_mean": g["searches_mean"],
                        "searches_max": g["searches_max"],
                        "invalid_rate": g["invalid_rate"],
                    }
                )
    return rows


def summary_table(results: dict) -> str:
    """One line per system: EM / F1 per split (all question types), searches and invalid rate on the first split,
    EM by question type on the first split (the compact table the README shows)."""
    systems = results["systems"]
    splits = sorted({s for r in systems.values() for s in r["splits"]}, key=lambda s: (s != "test", s))
    first = splits[0]
    types = sorted({t for r in systems.values() for t in r["splits"].get(first, {}).get("by_type", {})},
                   key=_type_order)
    head = ["system"] + [f"{s} EM / F1" for s in splits] + [f"{first} searches", f"{first} invalid"] + [
        f"{first} {t} EM" for t in types]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, r in systems.items():
        sp = r["splits"]
        cells = [name] + [f"{sp[s]['all']['em']:.3f} / {sp[s]['all']['f1']:.3f}" if s in sp else "–" for s in splits]
        a = sp.get(first, {}).get("all")
        cells += [f"{a['searches_mean']:.2f}", f"{a['invalid_rate']:.3f}"] if a else ["–", "–"]
        cells += [f"{sp[first]['by_type'][t]['em']:.3f}" if t in sp.get(first, {}).get("by_type", {}) else "–"
                  for t in types]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def markdown_table(rows: list[dict]) -> str:
    fmt = lambda v: f"{v:.3f}" if isinstance(v, float) else str(v)
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(fmt(r[c]) for c in COLUMNS) + " |" for r in rows]
    return "\n".join(lines)


def write_csv(rows: list[dict], path: str) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows(rows)


def binomial_bars(shares, ns):
    """Binomial standard errors of shares measured on ns items (0 where n is unknown)."""
    return [binomial_se(p, n) if n else 0.0 for p, n in zip(shares, ns)]


def plot_training_curves(curves: dict[str, list[dict]], path: str, sizes: dict | None = None) -> None:
    """Three panels: the supervised stages' training loss; their teacher-forced action-token accuracy on the eval
    splits (what SFT learns: the share of action tokens predicted right), with the share of sequences whose every
    action is right as a dashed line with binomial SE bars (n = sizes[stage]: the stage's eval_max_sequences); the
    RL stages' mean reward per step (not their loss, which sits near 0 by construction of group-normalized
    advantages), +/- reward/std / sqrt(n) with n = sizes[stage], the step's episodes (no bars where unknown)."""
    sizes = sizes or {}
    fig, (a, b, c) = plt.subplots(1, 3, figsize=(16, 4))
    for stage, rows in curves.items():
        tr = [r for r in rows if r.get("kind") == "train"]
        if any("reward/mean" in r for r in rows):
            rl = [r for r in rows if "reward/mean" in r]
            k = sizes.get(stage, 0)
            err = [r.get("reward/std", 0.0) / k ** 0.5 if k else 0.0 for r in rl]
            c.errorbar([r["step"] for r in rl], [r["reward/mean"] for r in rl], yerr=err, marker="o", ms=3,
                       capsize=2, label=stage)
            continue
        a.plot([r["step"] for r in tr], [r["loss"] for r in tr], label=stage)
        for split in sorted({r["split"] for r in rows if r.get("kind") == "eval"}):
            ev = [r for r in rows if r.get("kind") == "eval" and r["split"] == split and "action_token_acc" in r]
            line, = b.plot([r["step"] for r in ev], [r["action_token_acc"] for r in ev], marker="o", ms=3,
                           label=f"{stage} / {split}: action tokens")
            right = [r["all_actions_right"] for r in ev]
            b.errorbar([r["step"] for r in ev], right, yerr=binomial_bars(right, [sizes.get(stage, 0)] * len(ev)),
                       ls="--", color=line.get_color(), capsize=2, label=f"{stage} / {split}: every action right")
    a.set(xlabel="step", ylabel="loss", yscale="log", title="training loss (supervised stages)")
    b.set(xlabel="step", ylabel="accuracy", ylim=(0, 1), title="teacher-forced accuracy on held-out sequences")
    c.set(xlabel="step", ylabel="mean reward", title="RL: mean episode reward per step (+/- SE)")
    save_figure(fig, (a, b, c), path, legend_size=6)


def _type_order(t: str):
    return (0, int(t[0])) if t[:1].isdigit() else (1, t)  # "1hop", "2hop", "3hop", then "comparison"


def plot_accuracy_by_hops(results: dict, path: str) -> None:
    """EM per question type (1/2/3 hops, comparison), one panel per split, one bar group per type; the bars' error
    bars are binomial SEs over the type's questions (one seed).

    Comparison questions also take two hops, but mixing them into the 2-hop bar would hide both numbers."""
    systems = list(results["systems"])
    splits = sorted({s for r in results["systems"].values() for s in r["splits"]})
    fig, axes = plt.subplots(1, max(1, len(splits)), figsize=(5.5 * max(1, len(splits)), 4), squeeze=False)
    width = 0.8 / max(1, len(systems))
    for ax, split in zip(axes[0], splits):
        types = sorted(
            {t for r in results["systems"].values() for t in r["splits"].get(split, {}).get("by_type", {})},
            key=_type_order,
        )
        for i, sysname in enumerate(systems):
            by = results["systems"][sysname]["splits"].get(split, {}).get("by_type", {})
            em = [by.get(t, {}).get("em", 0.0) for t in types]
            ax.bar([j + i * width for j in range(len(types))], em, width, label=sysname,
                   yerr=binomial_bars(em, [by.get(t, {}).get("n", 0) for t in types]), capsize=2,
                   error_kw={"elinewidth": 0.8})
        labels = [t.replace("hop", " hop") for t in types]
        ax.set_xticks([j + width * (len(systems) - 1) / 2 for j in range(len(types))], labels)
        ax.set(ylim=(0, 1), ylabel="EM", title=f"EM by hop count and type ({split})")
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(results: dict, curves: dict[str, list[dict]], out_dir: str, title: str = "Results",
                 sizes: dict | None = None) -> list[str]:
    """results.md (the summary table, then every row), results.csv, training_curves.png, accuracy_by_hops.png under
    out_dir; returns the paths."""
    os.makedirs(out_dir, exist_ok=True)
    rows = table_rows(results)
    paths = [
        os.path.join(out_dir, n) for n in ("results.md", "results.csv", "training_curves.png", "accuracy_by_hops.png")
    ]
    with open(paths[0], "w") as f:
        f.write(
            f"# {title}\n\nk = {results.get('k')} retrieved passages per search; EM/F1 against the gold answer; SE = "
            f"mean F1 / searches; invalid = share of actions that did not parse.\n\n## Summary\n\n"
            f"{summary_table(results)}\n\n## Every system x split x question type\n\n{markdown_table(rows)}\n"
        )
    write_csv(rows, paths[1])
    plot_training_curves(curves, paths[2], sizes)
    plot_accuracy_by_hops(results, paths[3])
    return paths


def curve_size(section) -> int:
    """How many items one point of a stage's curve averages: an RL stage's episodes per step, a supervised stage's
    eval sequences (eval_max_sequences; 0 = unknown)."""
    if "rl" in section:
        return int(section.rl.questions_per_step) * int(section.rl.group_size)
    return int(section.get("eval_max_sequences", 0) or 0)


@lead_only  # host-side: process 0 alone (docs/multihost.md)
def report_stage(config, workdir, name) -> None:
    """results.md/csv + plots of every system, the training curves of every stage, and (when those stages ran) the
    annotator-agreement table and the best-of-N curve."""
    wd = str(workdir)
    results = read_json(os.path.join(wd, "eval", "results.json"))
    curves = {}
    for stage in config.stages:
        p = os.path.join(wd, stage, "metrics.jsonl")
        if os.path.exists(p) and stage != "eval":
            curves[stage] = [r for _, r in iter_jsonl(p)
                             if "loss" in r or "reward/mean" in r or r.get("kind") == "eval"]
    out = str(stage_dir(workdir, name))
    files = write_report(results, curves, out, title=f"Synthetic multi-hop world (seed {config.seed})",
                         sizes={st: curve_size(config[st]) for st in curves})
    extra = []
    errors = {f"{system} {split}": sc["errors"]["all"] for system, r in results["systems"].items()
              for split, sc in r["splits"].items() if "errors" in sc}
    if errors:
        extra.append("## Where the failures come from\n\nShare of all episodes per kind (jaxrag/pipelines/synthetic/"
                     "taxonomy.py): a hop is resolved once its gold passage was retrieved; *misnamed / missed*: the "
                     "missed hops whose queries never wrote the entity's name exactly.\n\n"
                     + taxonomy_table(errors) + "\n")
    extra.append(method_signal_section(config, workdir, results))
    agreement = os.path.join(wd, "agreement", "agreement.md")
    if os.path.exists(agreement):
        extra.append("## Annotator agreement with the oracle (dev states)\n\n" + open(agreement).read())
    bestofn = os.path.join(wd, "bestofn", "bestofn.json")
    if os.path.exists(bestofn):
        b = read_json(bestofn)
        lines = ["| N | selector | EM +/- SE | F1 |", "|---|---|---|---|"]
        lines += [f"| {r['n']} | {r['selector']} | {r['em']:.3f} +/- "
                  f"{binomial_bars([r['em']], [r['n_questions']])[0]:.3f} | {r['f1']:.3f} |" for r in b["rows"]]
        extra.append(f"## PRM-guided best-of-N ({b['split']}, T = {b['temperature']})\n\n" + "\n".join(lines) + "\n")
        shutil.copy(os.path.join(wd, "bestofn", "bestofn.png"), os.path.join(out, "bestofn.png"))
        files.append(os.path.join(out, "bestofn.png"))
    extra.append(provenance_section(config, workdir, out))
    files.append(os.path.join(out, "provenance.json"))
    host = cpu()
    xla = ", ".join(f"{k}={v}" for k, v in host["xla_cpu"].items())
    pinned = host["xla_cpu"] == PORTABLE
    verdict = ("the portable settings: two runs on one machine give the same bytes; another CPU kind may still give "
               "other numbers (compare the stage hashes above)." if pinned
               else "not the portable settings, so another CPU kind may give other numbers.")
    extra.append(f"## Machine\n\nMade on {host['model']} (vector extensions: {', '.join(host['vector']) or 'none'}), "
                 f"XLA:CPU {xla}: {verdict} (jaxrag/cpu_numerics.py, docs/reproducibility.md)\n")
    with open(files[0], "a") as f:
        f.write("\n" + "\n".join(extra))
    log(name, ", ".join(files))


def method_signal_section(config, workdir, results: dict, base: str = "sft_react") -> str:
    """Did each method have signal, and how far did it move the policy (jaxrag/pipelines/synthetic/diagnostics.py):
    every training stage's data, update budget and end-of-training figures; every system's trajectories and
    answers against `base` (else the first system) on the test split (else the first)."""
    rows = [r for r in (D.training_signal(workdir, st) for st in config.stages) if r is not None]
    targets: dict = {}
    for r in rows:   # a pair-trained stage: is its rejected (chosen) action the initial policy's greedy one?
        s = config[r["stage"]]
        if "pairs" in s and "init" in s and os.path.exists(os.path.join(str(workdir), s.pairs, "pairs.jsonl")):
            if (s.pairs, s.init) not in targets:
                targets[(s.pairs, s.init)] = pair_targets_of(config, workdir, s.pairs, s.init)
            r.update({k: v for k, v in targets[(s.pairs, s.init)].items() if k != "pairs"})
    sft = next((r["lr_sum"] for r in rows if r["stage"] == "sft"), None)
    text = ("## Did each method have signal?\n\nPer training stage: its data, steps, summed learning rate (and its "
            "share of SFT's), the paired losses' accuracy and margin over the last tenth of the steps, the share of "
            "its pairs whose rejected (chosen) action is what the initial policy does greedily there, RL's share of "
            "groups with one reward for every sample (no gradient), mean KL to the reference and the reward of the "
            "first and last tenth of the steps.\n\n" + D.signal_table(rows, sft) + "\n")
    systems = list(results["systems"])
    base = base if base in systems else systems[0]
    splits = list(results["systems"][base]["splits"])
    split = "test" if "test" in splits else splits[0]
    path = lambda name: os.path.join(str(workdir), "eval", f"episodes_{name}_{split}.jsonl")
    base_eps = read_episodes(path(base))
    moved = {name: D.movement(base_eps, read_episodes(path(name))) for name in systems
             if name != base and os.path.exists(path(name))}
    return text + (f"\nHow far each system moved from `{base}` ({split}): questions whose sequence of actions or "
                   "whose answer differs, and those it answers right that the base got wrong (gained) and the "
                   "reverse (lost).\n\n" + D.movement_table(moved, base) + "\n")


def pair_targets_of(config, workdir, pairs_stage: str, init: str) -> dict:
    """diagnostics.pair_targets for one pairs file and the policy a stage starts from (its rollout agent and step
    length are the pairs stage's)."""
    s = config[pairs_stage]
    policy = stage_policy(workdir, init, load_tokenizer(workdir), config.get("sampler"))
    pairs = read_pairs(os.path.join(str(workdir), pairs_stage, "pairs.jsonl"))
    return D.pair_targets(policy, get_agent(s.get("agent", "react"), mode="plain"), pairs,
                          int(s.get("max_new_tokens", 40)))


def provenance_section(config, workdir, out: str) -> str:
    """The content hash of every finished stage (from its DONE record; jaxrag/provenance.py) as a markdown table,
    and all of them (with the per-file hashes) in out/provenance.json: two runs part at the first differing row."""
    stages = collect(workdir, config.stages)
    write_json(os.path.join(out, "provenance.json"), stages)
    lines = ["| stage | content hash | files |", "|---|---|---|"]
    lines += [f"| {n} | `{short(r['sha256'], 16)}` | {len(r['files'])} |" for n, r in stages.items()]
    return ("## Provenance\n\nSHA-256 of what each stage wrote (its result files' content, without timings or logs; "
            "`python -m jaxrag.provenance WORKDIR OTHER` names the first stage where two runs part; "
            "docs/reproducibility_provenance.md).\n\n" + "\n".join(lines) + "\n")


# jaxrag.main checks the config before any stage runs
report_stage.check_config = checks.check_stage
