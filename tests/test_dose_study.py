"""The dose-response study end to end (configs/synthetic/dose.py): p = 0 is the test session's tiny run (the
synthetic_run fixture, linked in, so its stages are skipped), p = 1 one more tiny run in a subprocess."""

import json
import os

import numpy as np
import pytest

from jaxrag import main as jmain
from jaxrag.env.mdp import read_episodes
from jaxrag.metrics import exact_match
from jaxrag.pipelines.synthetic.taxonomy import vague

from test_synthetic_pipeline import config_module


@pytest.fixture(scope="module")
def dose(synthetic_run, tmp_path_factory):
    _, fixture_workdir, _ = synthetic_run
    c = config_module("dose").get_config("tiny")
    # the fixture's config (findings.py:tiny), its pipeline stages, every eval system: its outputs stay as they are
    c.dose_runs.config = f"{config_module('findings').__file__}:tiny"
    c.dose_runs.stages = tuple(config_module("pipeline").get_config("tiny").stages)
    c.dose_runs.eval_only = ""
    workdir = tmp_path_factory.mktemp("dose")
    os.symlink(fixture_workdir, workdir / "p0_seed0")
    assert jmain.run(c, workdir) == ["dose_runs", "dose"]
    return c, workdir, json.loads((workdir / "dose" / "results.json").read_text())


def test_the_dose_plants_vague_first_queries_in_the_teacher_and_nothing_else(dose):
    _, workdir, res = dose
    p0, p1 = workdir / "p0_seed0", workdir / "p1_seed0"
    for f in ("world/corpus.jsonl", "world/questions_test.jsonl"):
        assert (p0 / f).read_bytes() == (p1 / f).read_bytes(), f
    share = {p: np.mean([vague(e) for e in read_episodes(d / "teacher" / "episodes_train.jsonl") if e.steps])
             for p, d in ((0, p0), (1, p1))}
    assert share[1] > 0.95 and share[0] < 0.5, share   # p = 1: every hop's first query vague
    assert res["doses"] == [0.0, 1.0] and {r["dose"] for r in res["runs"]} == {0.0, 1.0}


def test_rows_and_effects_are_the_eval_episodes_means_and_paired_differences(dose):
    c, workdir, res = dose
    for p in (0, 1):
        per = {}
        for system in ("dpo", "sft_react"):
            eps = read_episodes(workdir / f"p{p}_seed0" / "eval" / f"episodes_{system}_test.jsonl")
            per[system] = {e.qid: (float(exact_match(e.answer, e.gold)), float(vague(e))) for e in eps}
        rows = {(r["system"], r["metric"]): r for r in res["rows"] if r["dose"] == p and r["split"] == "test"}
        got = {d["metric"]: d for d in res["comparisons"]
               if d["dose"] == p and d["split"] == "test" and (d["a"], d["b"]) == ("dpo", "sft_react")}
        for i, metric in enumerate(("em", "vague")):
            assert rows[("sft_react", metric)]["mean"] == pytest.approx(np.mean([v[i] for v in per["sft_react"].values()]))
            diff = [per["dpo"][q][i] - per["sft_react"][q][i] for q in per["dpo"]]
            d = got[metric]
            assert d["diff"] == pytest.approx(np.mean(diff)) and d["lo"] <= d["diff"] <= d["hi"]
            assert d["disagree"] == pytest.approx(np.mean(np.array(diff) != 0)) and d["n_seeds"] == 1
    md = (workdir / "dose" / "results.md").read_text()
    assert all(d["text"] in md for d in res["comparisons"])
    assert os.path.getsize(workdir / "dose" / "dose.png") > 0


@pytest.mark.parametrize("key, value, message", [
    ("doses", (0.0, 1.5), r"dose_runs\.doses: \[0\.0, 1\.5\]: distinct probabilities in \[0, 1\]"),
    ("seeds", (0, 0), r"dose_runs\.seeds: \[0, 0\]: at least one seed, none repeated"),
    ("knob", "teacher.p_vague", r"dose_runs\.knob: 'teacher\.p_vague': one of teacher\.p_vague_first, "),
])
def test_bad_doses_and_seeds_are_refused_before_any_run(tmp_path, key, value, message):
    c = config_module("dose").get_config("tiny")
    c.dose_runs[key] = value
    with pytest.raises(jmain.StageError, match=message):
        jmain.run(c, tmp_path)
    assert not (tmp_path / "p0_seed0").exists()
