"""The dose-response study: the positive control's planted flaw (each hop's first query vague with probability p,
`teacher.p_vague_first`) at several doses, and per dose what each method does to it against SFT, with intervals.

dose_runs_stage, config[name]: config (a pipeline config with its preset, "path.py:preset"), knob (the dotted
config key the dose sets: teacher.p_vague_first, or teacher.p_premature_last), doses (its values), seeds, stages (the pipeline stages each run needs, empty = all), eval_only (the eval
stage's systems, "" = all), flags (more flags for every run). Each (dose, seed) is an ordinary run of jaxrag.main
into <workdir>/p<dose>_seed<seed>/, so a finished run is skipped stage by stage and one can be rerun on its own.
Output: <workdir>/<name>/runs.json.

dose_study_stage, config[name]: runs (the dose_runs stage), eval (its eval stage), comparisons ({a, b, label}: a - b
is reported), metrics (names of seeds.METRICS: "vague", "em", "f1"), level. Per dose, split and system each metric's
mean and SE (jaxrag.evaluate.paired_components against 0: over seeds and questions); per comparison the paired
difference with its interval, MDE and disagreement rate. Outputs under <workdir>/<name>/: results.md, results.json,
dose.png (per metric: the systems' means against p, and each comparison's effect against p, with intervals).
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import numpy as np

from jaxrag.evaluate import describe_difference, paired_components
from jaxrag.pipelines.common import config_fail, log, stage_dir, write_json
from jaxrag.pipelines.synthetic.report import plt, save_figure
from jaxrag.pipelines.synthetic.seeds import METRICS, check_study, launch, score_matrix, seed_scores
from jaxrag.train.distributed import lead_only


KNOBS = ("teacher.p_vague_first", "teacher.p_premature_last")   # the teacher's planted flaws


def run_dir(workdir, dose: float, seed: int) -> Path:
    return Path(workdir) / f"p{float(dose):g}_seed{seed}"


def run_command(s, dose: float, seed: int, workdir) -> list[str]:
    """The jaxrag.main command line of one (dose, seed) run."""
    cmd = [sys.executable, "-m", "jaxrag.main", f"--config={s.config}", f"--workdir={run_dir(workdir, dose, seed)}",
           f"--config.seed={seed}", f"--config.{s.get('knob', 'teacher.p_vague_first')}={float(dose):g}"]
    if s.get("eval_only"):
        cmd.append(f"--config.eval.only={s.eval_only}")
    cmd += shlex.split(s.get("flags") or "")
    if s.get("stages"):
        cmd.append("--stages=" + ",".join(s.stages))
    return cmd


@lead_only  # host-side: process 0 launches the runs (docs/multihost.md)
def dose_runs_stage(config, workdir, name) -> None:
    s = config[name]
    runs = [{"dose": float(dose), "seed": seed,
             **launch(name, f"p {float(dose):g} seed {seed}", run_command(s, dose, seed, workdir),
                      run_dir(workdir, dose, seed), s.get("stages") or ())}
            for dose in s.doses for seed in s.seeds]
    write_json(stage_dir(workdir, name) / "runs.json",
               {"config": s.config, "knob": s.get("knob", "teacher.p_vague_first"), "runs": runs})


def check_dose_runs(config, name: str) -> None:
    s = config[name]
    doses = [float(d) for d in s.doses]
    if not doses or len(set(doses)) != len(doses) or not all(0.0 <= d <= 1.0 for d in doses):
        config_fail(f"{name}.doses", f"{list(s.doses)}: distinct probabilities in [0, 1]")
    if not s.seeds or len(set(s.seeds)) != len(s.seeds):
        config_fail(f"{name}.seeds", f"{list(s.seeds)}: at least one seed, none repeated")
    path = str(s.config).split(":")[0]
    if not Path(path).exists():
        config_fail(f"{name}.config", f"{path}: no such config file")
    if s.get("knob", "teacher.p_vague_first") not in KNOBS:
        config_fail(f"{name}.knob", f"{s.knob!r}: one of {', '.join(KNOBS)}")


dose_runs_stage.check_config = check_dose_runs


# ------------------------------------------------------------------------------------------------ the study
def study(by_dose: dict[float, list[dict]], comparisons, metrics, level: float) -> dict:
    """by_dose: dose -> the per-seed scores of its runs (seeds.seed_scores). Returns {"rows": per dose, split, system
    and metric the mean and SE; "comparisons": per dose, split, metric and comparison the paired difference}."""
    rows, diffs = [], []
    for dose, per_seed in sorted(by_dose.items()):
        keys = [k for k in per_seed[0] if all(k in s for s in per_seed)]
        for system, split in keys:
            for metric in metrics:
                m, _ = score_matrix(per_seed, (system, split), METRICS.index(metric))
                r = paired_components(m, np.zeros_like(m), level=level)
                rows.append({"dose": dose, "system": system, "split": split, "metric": metric, "mean": r["diff"],
                             "se": r["se"], "lo": r["lo"], "hi": r["hi"], "n_seeds": r["n_seeds"],
                             "n_questions": r["n_questions"]})
        for metric in metrics:
            for c in comparisons:
                for split in sorted({k[1] for k in keys}, key=lambda s: (s != "test", s)):
                    if (c["a"], split) not in keys or (c["b"], split) not in keys:
                        continue
                    a, qa = score_matrix(per_seed, (c["a"], split), METRICS.index(metric))
                    b, qb = score_matrix(per_seed, (c["b"], split), METRICS.index(metric))
                    if qa != qb:
                        raise ValueError(f"p {dose:g}: {c['a']} and {c['b']} ({split}) were scored on other "
                                         "questions: no pairing")
                    r = paired_components(a, b, level=level)
                    diffs.append({**r, "dose": dose, "a": c["a"], "b": c["b"], "label": c["label"], "split": split,
                                  "metric": metric, "text": describe_difference(c["a"], c["b"], r)})
    return {"doses": sorted(by_dose), "rows": rows, "comparisons": diffs}


def markdown(res: dict, runs: list[dict], level: float) -> str:
    seeds = sorted({r["seed"] for r in runs})
    lines = [f"# Dose-response: {res['knob']} = {', '.join(f'{d:g}' for d in res['doses'])}",
             "", f"Each dose is a full run of the control pipeline per seed ({', '.join(map(str, seeds))}); the world "
             "and its questions are the same in all, the teacher's episodes differ only in the planted flaw "
             f"({res['knob']}). "
             "vague: the share of episodes that issued a vague query (lower is better); em: exact match. Means "
             f"with their SE and {level:.0%} interval over seeds and questions.", "",
             "## Per dose and system", "", "| p | split | system | metric | mean +/- SE | interval |",
             "|---|---|---|---|---|---|"]
    for r in res["rows"]:
        lines.append(f"| {r['dose']:g} | {r['split']} | {r['system']} | {r['metric']} | {r['mean']:.3f} +/- "
                     f"{r['se']:.3f} | [{r['lo']:.3f}, {r['hi']:.3f}] |")
    lines += ["", "## Effects against p (paired, a - b)", "",
              "A difference is claimed only where the interval excludes 0. MDE: the smallest true difference this "
              "design detects with 80 % power; disagree: the share of cells where the two systems' score differs.",
              "", "| p | comparison | split | metric | a - b [interval] | MDE | disagree | reading |",
              "|---|---|---|---|---|---|---|---|"]
    for d in res["comparisons"]:
        lines.append(f"| {d['dose']:g} | {d['label']} | {d['split']} | {d['metric']} | {d['diff']:+.3f} "
                     f"[{d['lo']:+.3f}, {d['hi']:+.3f}] | {d['mde']:.3f} | {d['disagree']:.3f} | {d['text']} |")
    lines += ["", "## Runtime", "", "| p | seed | wall s (this study) | stage s (sum of DONE records) |",
              "|---|---|---|---|"]
    lines += [f"| {r['dose']:g} | {r['seed']} | {r['wall_seconds']:.0f} | {r['stage_seconds_total']:.0f} |"
              for r in runs]
    return "\n".join(lines) + "\n"


def plot(res: dict, path, split: str = "test") -> None:
    knob = res["knob"].split(".")[-1]
    """Per metric two panels: each system's mean against p, and each comparison's effect against p (intervals as
    error bars, 0 marked)."""
    metrics = list(dict.fromkeys(r["metric"] for r in res["rows"]))
    color = {system: f"C{i}" for i, system in enumerate(dict.fromkeys(r["system"] for r in res["rows"]))}
    fig, axes = plt.subplots(len(metrics), 2, figsize=(12, 4 * len(metrics)), squeeze=False)
    for (left, right), metric in zip(axes, metrics):
        rows = [r for r in res["rows"] if r["metric"] == metric and r["split"] == split]
        for system in dict.fromkeys(r["system"] for r in rows):
            rs = [r for r in rows if r["system"] == system]
            left.errorbar([r["dose"] for r in rs], [r["mean"] for r in rs],
                          yerr=[[r["mean"] - r["lo"] for r in rs], [r["hi"] - r["mean"] for r in rs]],
                          fmt="o-", capsize=3, label=system, color=color[system])
        left.set(xlabel=f"p ({knob})", ylabel=metric, title=f"{metric} per system ({split})")
        ds = [d for d in res["comparisons"] if d["metric"] == metric and d["split"] == split]
        for label in dict.fromkeys(f"{d['a']} - {d['b']}" for d in ds):   # in the color of its system a
            dd = [d for d in ds if f"{d['a']} - {d['b']}" == label]
            right.errorbar([d["dose"] for d in dd], [d["diff"] for d in dd],
                           yerr=[[d["diff"] - d["lo"] for d in dd], [d["hi"] - d["diff"] for d in dd]],
                           fmt="o-", capsize=3, label=label, color=color.get(dd[0]["a"], "k"))
        right.axhline(0, color="k", lw=0.8)
        right.set(xlabel=f"p ({knob})", ylabel=f"{metric} difference",
                  title=f"paired effect on {metric} ({split}), variance-components interval")
    save_figure(fig, axes.ravel().tolist(), path)


@lead_only  # host-side: process 0 alone (docs/multihost.md)
def dose_study_stage(config, workdir, name) -> None:
    s = config[name]
    recorded = json.loads((Path(workdir) / s.runs / "runs.json").read_text())
    runs = recorded["runs"]
    by_dose: dict[float, list[dict]] = {}
    for r in runs:
        by_dose.setdefault(float(r["dose"]), []).append(seed_scores(Path(r["workdir"]), s.eval, ""))
    res = study(by_dose, [dict(c) for c in s.comparisons], tuple(s.metrics), float(s.level))
    res["runs"], res["knob"] = runs, recorded.get("knob", "teacher.p_vague_first")
    out = stage_dir(workdir, name)
    write_json(out / "results.json", res)
    (out / "results.md").write_text(markdown(res, runs, float(s.level)))
    plot(res, out / "dose.png")
    for d in res["comparisons"]:
        if d["split"] == "test":
            log(name, f"p {d['dose']:g}, {d['metric']}: {d['text']}")


dose_study_stage.check_config = check_study   # the seeds study's: runs, comparisons, metrics, level
