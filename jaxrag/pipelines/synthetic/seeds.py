"""The seeds study: the demo's systems over several seeds on one fixed world, reported as mean +/- SE over seeds and,
for the comparisons the papers make, the paired difference over questions and seeds: its variance-components
interval, minimal detectable effect and disagreement rate, and the two-way bootstrap interval beside it.

seed_runs_stage, config[name]: config (a pipeline config file with its preset, "path.py:preset"), seeds (the values
of `seed`: the SFT init, every trainer's data order and every sampling stream; `world_seed` stays fixed), stages
(the pipeline stages to run, empty = all), flags (more command-line flags for every seed's run, one string:
"--config.world_seed=1 --config.eval.max_questions=400"). Each seed is an
ordinary run of jaxrag.main in a subprocess (a stage never imports jaxrag.main) into <workdir>/seed_<s>/, so a
finished seed is skipped stage by stage like any run, and one seed can be inspected or rerun on its own.
Output: <workdir>/<name>/runs.json (per seed: the stages run, their wall seconds, the seed's total).

seeds_study_stage, config[name]: runs (the seed_runs stage), eval (the per-seed eval stage, or several
comma-separated: "eval,eval_findings", their systems together; a system in two is an error), bestofn (the per-seed
best-of-N stage, "" = none), comparisons (a list of {a, b, label}: system names of the eval stage, or
"bo<N>_<selector>" for the best-of-N stage's runs, e.g. "bo4_critic", "bo4_first_valid", "bo1_critic"; the seeds'
own `study_pairs`, a variant's pairing, join them), metrics (what the comparisons difference: "em", "f1",
"vague"; default em), n_boot, level. Outputs under <workdir>/<name>/: results.md, results.json, seeds.png.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

import jaxrag
from jaxrag.env.mdp import read_episodes
from jaxrag.evaluate import describe_difference, mean_se, paired_bootstrap, paired_components
from jaxrag.jsonl import read_jsonl
from jaxrag.metrics import exact_match, f1_score
from jaxrag.pipelines.common import config_fail, log, stage_dir, write_json
from jaxrag.pipelines.synthetic.report import plt, save_figure
from jaxrag.pipelines.synthetic.taxonomy import vague
from jaxrag.train.distributed import lead_only
from jaxrag.workdir import read_done


def seed_dir(workdir, seed: int) -> Path:
    return Path(workdir) / f"seed_{seed}"


def seed_command(s, seed: int, workdir) -> list[str]:
    """The jaxrag.main command line of one seed's run."""
    cmd = [sys.executable, "-m", "jaxrag.main", f"--config={s.config}", f"--workdir={seed_dir(workdir, seed)}",
           f"--config.seed={seed}"]
    cmd += shlex.split(s.get("flags") or "")
    if s.get("stages"):
        cmd.append("--stages=" + ",".join(s.stages))
    return cmd


def launch(name: str, label: str, cmd: list[str], run_dir: Path, stages=()) -> dict:
    """Run one pipeline command line (a jaxrag.main subprocess, the same jaxrag as this process) and return its
    record: wall seconds here and the seconds of each planned stage read off its DONE records."""
    root = Path(jaxrag.__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root)] + [p for p in [os.environ.get("PYTHONPATH")] if p])}
    log(name, f"{label}: {' '.join(cmd[1:])}")
    t0 = time.perf_counter()
    rc = subprocess.run(cmd, cwd=root, env=env).returncode
    wall = round(time.perf_counter() - t0, 1)
    if rc != 0:
        raise RuntimeError(f"{name}: {label}'s run failed (exit {rc}); its log: {run_dir / 'log.txt'} (rerun this "
                           "study to resume it)")
    done = {p.parent.name: read_done(p) or {} for p in sorted(run_dir.glob("*/DONE"))
            if not stages or p.parent.name in stages}  # the planned stages only
    stage_seconds = {k: v.get("seconds") for k, v in done.items()}
    record = {"workdir": str(run_dir), "wall_seconds": wall, "stage_seconds": stage_seconds,
              "stage_seconds_total": round(sum(v for v in stage_seconds.values() if v), 1)}
    log(name, f"{label}: {wall:.0f} s here; its stages took {record['stage_seconds_total']:.0f} s")
    return record


@lead_only  # host-side: process 0 launches the seeds' runs (docs/multihost.md)
def seed_runs_stage(config, workdir, name) -> None:
    s = config[name]
    runs = [{"seed": seed, **launch(name, f"seed {seed}", seed_command(s, seed, workdir), seed_dir(workdir, seed),
                                    s.get("stages") or ())} for seed in s.seeds]
    write_json(stage_dir(workdir, name) / "runs.json", {"config": s.config, "runs": runs})


def check_seed_runs(config, name: str) -> None:
    s = config[name]
    seeds = list(s.seeds)
    if len(seeds) < 2:
        config_fail(f"{name}.seeds", f"{seeds}: a spread over seeds needs at least 2 (3 or more to read it)")
    if len(set(seeds)) != len(seeds):
        config_fail(f"{name}.seeds", f"{seeds} repeats a seed")
    path = str(s.config).split(":")[0]
    if not Path(path).exists():
        config_fail(f"{name}.config", f"{path}: no such config file")


seed_runs_stage.check_config = check_seed_runs


# ------------------------------------------------------------------------------------------------ the study
# the per-question scores a study reads, in per_question_scores' order
METRICS = ("em", "f1", "vague")


def per_question_scores(path: Path) -> dict[str, tuple[float, float, float]]:
    """qid -> (EM, F1, vague) of every episode in an episodes JSONL; vague: 1 where the episode issued a vague query
    (jaxrag.pipelines.synthetic.taxonomy.vague, the positive control's planted flaw)."""
    return {ep.qid: (float(exact_match(ep.answer, ep.gold)), float(f1_score(ep.answer, ep.gold)), float(vague(ep)))
            for ep in read_episodes(path)}


def seed_scores(run_dir: Path, eval_stage: str, bestofn_stage: str) -> dict[tuple[str, str], dict]:
    """(system, split) -> {qid: (EM, F1, vague)} of one seed's run: the eval stages' systems (eval_stage: one stage or
    several comma-separated) and, as "bo<N>_<selector>", the best-of-N stage's runs."""
    out = {}
    for stage in [x.strip() for x in eval_stage.split(",") if x.strip()]:
        results = json.loads((run_dir / stage / "results.json").read_text())
        for system, r in results["systems"].items():
            for split in r["splits"]:
                if (system, split) in out:
                    raise ValueError(f"{run_dir}: system {system!r} ({split}) is in two of the eval stages "
                                     f"{eval_stage!r}: name it once")
                out[(system, split)] = per_question_scores(run_dir / stage / f"episodes_{system}_{split}.jsonl")
    if bestofn_stage:
        b = json.loads((run_dir / bestofn_stage / "bestofn.json").read_text())
        for row in b["rows"]:
            p = run_dir / bestofn_stage / f"episodes_n{row['n']}_{row['selector']}.jsonl"
            if p.exists():
                out[(f"bo{row['n']}_{row['selector']}", b["split"])] = per_question_scores(p)
    return out


def score_matrix(per_seed: list[dict], key: tuple[str, str], metric: int = 0) -> tuple[np.ndarray, list[str]]:
    """[seeds, questions] of one (system, split), columns in one question order shared by every seed (the world is
    fixed, so every seed evaluates the same questions; a mismatch is an error, not a silent subset)."""
    qids = sorted(per_seed[0][key])
    for i, scores in enumerate(per_seed):
        if sorted(scores[key]) != qids:
            raise ValueError(f"{key}: seed run {i} scored other questions than seed run 0 (is the world fixed? "
                             "world_seed must be the same in every seed's run)")
    return np.array([[scores[key][q][metric] for q in qids] for scores in per_seed]), qids


def study(per_seed: list[dict], comparisons, n_boot: int, level: float, metrics=("em",),
          types: dict[str, str] | None = None) -> dict:
    """The table (mean +/- SE over seeds of EM, F1 and the vague-query share, per system and split) and the
    comparisons' intervals, one per comparison, split and metric (names of METRICS). types (qid -> question type):
    each comparison also per type (`by_type`: the same variance-components interval on that type's questions), so
    an effect can be read where it lives and types that carry no signal on their own."""
    keys = [k for k in per_seed[0] if all(k in s for s in per_seed)]
    table = []
    for system, split in keys:
        em, _ = score_matrix(per_seed, (system, split), 0)
        row = {"system": system, "split": split, "n_questions": em.shape[1]}
        for metric in METRICS:
            m, _ = score_matrix(per_seed, (system, split), METRICS.index(metric))
            row[f"{metric}_mean"], row[f"{metric}_se"] = mean_se(m.mean(axis=1))
        table.append({**row, "em_per_seed": em.mean(axis=1).tolist()})
    diffs = []
    splits = sorted({k[1] for k in keys}, key=lambda s: (s != "test", s))
    for metric in metrics:
        for c in comparisons:
            for split in splits:
                if (c["a"], split) not in keys or (c["b"], split) not in keys:
                    continue
                a, qa = score_matrix(per_seed, (c["a"], split), METRICS.index(metric))
                b, qb = score_matrix(per_seed, (c["b"], split), METRICS.index(metric))
                if qa != qb:
                    raise ValueError(f"{c['a']} and {c['b']} ({split}) were scored on other questions: no pairing")
                r = paired_components(a, b, level=level)
                boot = paired_bootstrap(a, b, n_boot=n_boot, level=level)
                diffs.append({**r, "boot_lo": boot["lo"], "boot_hi": boot["hi"], "a": c["a"], "b": c["b"],
                              "label": c["label"], "split": split, "metric": metric,
                              "text": describe_difference(c["a"], c["b"], r)})
                if types:
                    diffs[-1]["by_type"] = by_type(a, b, qa, types, level)
    return {"seeds": len(per_seed), "table": table, "comparisons": diffs}


def by_type(a: np.ndarray, b: np.ndarray, qids: list[str], types: dict[str, str], level: float) -> dict:
    """{type: paired_components' diff, lo, hi, mde, disagree and n_questions on that type's columns} (types with
    at least two questions)."""
    out = {}
    for t in sorted({types[q] for q in qids}):
        cols = [i for i, q in enumerate(qids) if types[q] == t]
        if len(cols) >= 2:
            r = paired_components(a[:, cols], b[:, cols], level=level)
            out[t] = {k: r[k] for k in ("diff", "lo", "hi", "mde", "disagree", "n_questions")}
    return out


def question_types(run_dir: Path, splits) -> dict[str, str]:
    """qid -> question type over the given splits of a run's world (the same world in every seed's run)."""
    out = {}
    for split in sorted(set(splits)):
        out.update({q["id"]: q["metadata"]["type"] for q in read_jsonl(Path(run_dir) / "world" /
                                                                       f"questions_{split}.jsonl")})
    return out


def markdown(res: dict, runs: list[dict], level: float) -> str:
    seeds = [r["seed"] for r in runs]
    lines = [f"# Seeds study: {len(seeds)} seeds ({', '.join(map(str, seeds))}), one world", "",
             "Each seed is a full run of the pipeline (SFT init and data order, every sampling stream); the world, its "
             "questions and the teacher's episodes are the same in all. Mean over seeds +/- the standard error of "
             "that mean (sample SD / sqrt(seeds)); per seed, the share of the split's questions answered exactly.",
             "", "## Per system and split", "",
             "| system | split | questions | EM mean +/- SE | F1 mean +/- SE | vague-query share +/- SE | EM per seed |",
             "|---|---|---|---|---|---|---|"]
    for r in res["table"]:
        lines.append(f"| {r['system']} | {r['split']} | {r['n_questions']} | {r['em_mean']:.3f} +/- {r['em_se']:.3f} "
                     f"| {r['f1_mean']:.3f} +/- {r['f1_se']:.3f} | {r['vague_mean']:.3f} +/- {r['vague_se']:.3f} | "
                     + ", ".join(f"{v:.3f}" for v in r["em_per_seed"]) + " |")
    lines += ["", f"## Paired differences ({level:.0%} intervals over seeds and questions)", "",
              "The interval is the paired variance components' (seed, question, residual; a t interval with "
              "Satterthwaite's degrees of freedom: jaxrag.evaluate.paired_components); the two-way bootstrap's, "
              "which counts the residual twice and is wider, beside it. A difference is claimed only where the "
              "interval excludes 0. MDE: the smallest true difference this design detects with 80 % power; "
              "disagree: the share of seed x question cells where the two systems' score differs (0: they answer "
              "alike, and no method effect can show). Metric em: exact match; vague: whether an episode issued a "
              "vague query (the positive control's planted flaw; lower is better).", "",
              "| comparison | split | metric | a - b [interval] | SE | MDE | disagree | bootstrap interval | reading |",
              "|---|---|---|---|---|---|---|---|---|"]
    for d in res["comparisons"]:
        lines.append(f"| {d['label']} | {d['split']} | {d['metric']} | {d['diff']:+.3f} [{d['lo']:+.3f}, {d['hi']:+.3f}] | "
                     f"{d['se']:.3f} | {d['mde']:.3f} | {d['disagree']:.3f} | [{d['boot_lo']:+.3f}, "
                     f"{d['boot_hi']:+.3f}] | {d['text']} |")
    typed = [d for d in res["comparisons"] if d.get("by_type")]
    if typed:
        kinds = sorted({t for d in typed for t in d["by_type"]})
        lines += ["", "## By question type", "", "Each comparison on each question type's questions alone: a - b "
                  "[interval] (disagree). A type where the two systems never disagree carries no signal; its "
                  "questions dilute the overall difference.", "",
                  "| comparison | split | metric | " + " | ".join(kinds) + " |", "|---|---|---|" + "---|" * len(kinds)]
        for d in typed:
            cells = [f"{x['diff']:+.3f} [{x['lo']:+.3f}, {x['hi']:+.3f}] ({x['disagree']:.2f})" if x else ""
                     for x in (d["by_type"].get(t) for t in kinds)]
            lines.append(f"| {d['label']} | {d['split']} | {d['metric']} | " + " | ".join(cells) + " |")
    lines += ["", "## Runtime", "", "| seed | wall s (this study) | stage s (sum of DONE records) |", "|---|---|---|"]
    lines += [f"| {r['seed']} | {r['wall_seconds']:.0f} | {r['stage_seconds_total']:.0f} |" for r in runs]
    return "\n".join(lines) + "\n"


def plot(res: dict, path) -> None:
    """Left: EM mean +/- SE over seeds per system, one bar group per split; right: each comparison's difference
    with its interval (0 marked)."""
    table = [r for r in res["table"] if not r["system"].startswith("bo")]
    systems = list(dict.fromkeys(r["system"] for r in table))
    splits = list(dict.fromkeys(r["split"] for r in table))
    fig, (a, b) = plt.subplots(1, 2, figsize=(13, 4.5), gridspec_kw={"width_ratios": [1.2, 1]})
    width = 0.8 / max(1, len(splits))
    for i, split in enumerate(splits):
        rows = {r["system"]: r for r in table if r["split"] == split}
        xs = [j + i * width for j, s in enumerate(systems) if s in rows]
        a.bar(xs, [rows[s]["em_mean"] for s in systems if s in rows], width,
              yerr=[np.nan_to_num(rows[s]["em_se"]) for s in systems if s in rows], capsize=3, label=split)
    a.set_xticks([j + width * (len(splits) - 1) / 2 for j in range(len(systems))], systems, rotation=30, ha="right")
    a.set(ylabel="EM", ylim=(0, 1), title=f"EM, mean +/- SE over {res['seeds']} seeds")
    comps = res["comparisons"]
    ys = list(range(len(comps)))[::-1]
    for y, d in zip(ys, comps):
        b.errorbar([d["diff"]], [y], xerr=[[d["diff"] - d["lo"]], [d["hi"] - d["diff"]]], fmt="o", capsize=3,
                   color="C0" if d["lo"] <= 0 <= d["hi"] else "C3")
    b.axvline(0, color="k", lw=0.8)
    b.set_yticks(ys, [f"{d['a']} - {d['b']} ({d['split']}{'' if d['metric'] == 'em' else ', ' + d['metric']})"
                      for d in comps], fontsize=7)
    b.set(xlabel="difference (EM, or the metric named)", title="paired differences, variance-components interval")
    b.plot([], [], "o", color="C3", label="interval excludes 0")
    b.plot([], [], "o", color="C0", label="no difference detectable")
    save_figure(fig, (a, b), path)


@lead_only  # host-side: process 0 alone (docs/multihost.md)
def seeds_study_stage(config, workdir, name) -> None:
    s = config[name]
    runs = json.loads((Path(workdir) / s.runs / "runs.json").read_text())["runs"]
    per_seed = [seed_scores(Path(r["workdir"]), s.eval, s.get("bestofn", "")) for r in runs]
    res = study(per_seed, comparisons_of(s, runs), int(s.n_boot), float(s.level), tuple(s.get("metrics", ("em",))),
                types=question_types(Path(runs[0]["workdir"]), {split for _, split in per_seed[0]}) if runs else None)
    res["runs"] = runs
    out = stage_dir(workdir, name)
    write_json(out / "results.json", res)
    (out / "results.md").write_text(markdown(res, runs, float(s.level)))
    plot(res, out / "seeds.png")
    for d in res["comparisons"]:
        log(name, f"{d['label']} ({d['split']}, {d['metric']}): {d['text']}")


def comparisons_of(s, runs: list[dict]) -> list[dict]:
    """The study's comparisons and the pairs the seeds' own config registered (its `study_pairs`: a variant's
    system vs its base, configs/common/variant.py), each once."""
    out = [dict(c) for c in s.comparisons]
    cfg = Path(runs[0]["workdir"]) / "config.json" if runs else None
    if cfg is not None and cfg.exists():
        for c in json.loads(cfg.read_text()).get("config", {}).get("study_pairs", []):
            if (c["a"], c["b"]) not in {(d["a"], d["b"]) for d in out}:
                out.append(dict(c))
    return out


def check_study(config, name: str) -> None:
    s = config[name]
    if s.runs not in config.stages or config.stages.index(s.runs) >= config.stages.index(name):
        config_fail(f"{name}.runs", f"{s.runs!r} is not a stage before {name!r}")
    for i, c in enumerate(s.comparisons):
        if set(c) != {"a", "b", "label"}:
            config_fail(f"{name}.comparisons[{i}]", f"{dict(c)}: needs exactly a, b, label")
    if not 0 < float(s.level) < 1:
        config_fail(f"{name}.level", f"{s.level}: a coverage in (0, 1)")
    for m in s.get("metrics", ("em",)):
        if m not in METRICS:
            config_fail(f"{name}.metrics", f"{m!r}: one of {', '.join(METRICS)}")


seeds_study_stage.check_config = check_study
