"""The seeds study end to end (configs/synthetic/seeds.py): seed 0 is the test session's tiny run (the
synthetic_run fixture, linked in as seed_0, so its stages are skipped), seed 1 one more tiny run in a subprocess."""

import json
import os

import numpy as np
import pytest

from jaxrag import main as jmain
from jaxrag.env.mdp import read_episodes
from jaxrag.evaluate import mean_se
from jaxrag.metrics import exact_match

from test_synthetic_pipeline import config_module


@pytest.fixture(scope="module")
def study(synthetic_run, tmp_path_factory):
    fixture_config, fixture_workdir, _ = synthetic_run
    c = config_module("seeds").get_config("tiny")
    # the fixture's config (findings.py:tiny at seed 0), its pipeline stages only
    findings = config_module("findings")
    c.seed_runs.config = f"{findings.__file__}:tiny"
    c.seed_runs.stages = tuple(config_module("pipeline").get_config("tiny").stages)
    c.seed_runs.seeds = (0, 1)
    workdir = tmp_path_factory.mktemp("seeds")
    os.symlink(fixture_workdir, workdir / "seed_0")
    assert jmain.run(c, workdir) == ["seed_runs", "seeds"]
    return c, workdir, json.loads((workdir / "seeds" / "results.json").read_text())


def test_seeds_vary_the_training_and_not_the_world(study):
    _, workdir, res = study
    s0, s1 = workdir / "seed_0", workdir / "seed_1"
    for f in ("world/corpus.jsonl", "world/questions_test.jsonl", "teacher/episodes_train.jsonl"):
        assert (s0 / f).read_bytes() == (s1 / f).read_bytes(), f
    assert (s0 / "sft/model/model.safetensors").read_bytes() != (s1 / "sft/model/model.safetensors").read_bytes()
    runs = {r["seed"]: r for r in res["runs"]}
    assert set(runs) == {0, 1} and runs[1]["stage_seconds_total"] > 0 and runs[1]["stage_seconds"]["sft"] > 0


def test_table_is_the_mean_and_se_of_each_seeds_eval(study):
    _, workdir, res = study
    rows = {(r["system"], r["split"]): r for r in res["table"]}
    for seed in (0, 1):
        results = json.loads((workdir / f"seed_{seed}" / "eval" / "results.json").read_text())
        for system, r in results["systems"].items():
            for split, m in r["splits"].items():
                assert rows[(system, split)]["em_per_seed"][seed] == pytest.approx(m["all"]["em"]), (system, split)
    for row in rows.values():
        mean, se = mean_se(row["em_per_seed"])
        assert row["em_mean"] == pytest.approx(mean) and row["em_se"] == pytest.approx(se)
    n = max(c_n for c_n in _config_ns())
    assert {"grpo_f1_penalty", "bo1_critic", f"bo{n}_critic", f"bo{n}_first_valid"} <= {s for s, _ in rows}


def _config_ns():
    return config_module("pipeline").get_config("tiny").bestofn.ns


def test_comparisons_are_paired_differences_with_intervals(study):
    c, workdir, res = study
    got = {(d["a"], d["b"], d["split"]): d for d in res["comparisons"]}
    n = max(_config_ns())
    assert {("dpo", "outcome_rs", "test"), ("grpo_f1_penalty", "grpo", "heldout"),
            (f"bo{n}_critic", f"bo{n}_first_valid", "test"), (f"bo{n}_critic", "bo1_critic", "test")} <= set(got)
    d = got[("dpo", "sft_react", "test")]
    diff = []
    for seed in (0, 1):
        per = {}
        for system in ("dpo", "sft_react"):
            eps = read_episodes(workdir / f"seed_{seed}" / "eval" / f"episodes_{system}_test.jsonl")
            per[system] = {e.qid: exact_match(e.answer, e.gold) for e in eps}
        diff += [per["dpo"][q] - per["sft_react"][q] for q in per["dpo"]]
    assert d["diff"] == pytest.approx(np.mean(diff)) and d["lo"] <= d["diff"] <= d["hi"]
    assert d["n_seeds"] == 2 and d["n_questions"] == len(diff) // 2
    assert d["disagree"] == pytest.approx(np.mean(np.array(diff) != 0)) and d["boot_lo"] <= d["diff"] <= d["boot_hi"]
    from jaxrag.evaluate import paired_components
    assert d["se"] == pytest.approx(paired_components(np.reshape(diff, (2, -1)), np.zeros((2, len(diff) // 2)))["se"])
    # per question type: the same interval on that type's questions alone
    from jaxrag.pipelines.synthetic.seeds import question_types

    types = question_types(workdir / "seed_0", ["test"])
    by_seed = []
    for seed in (0, 1):
        em = {system: {e.qid: exact_match(e.answer, e.gold) for e in read_episodes(
            workdir / f"seed_{seed}" / "eval" / f"episodes_{system}_test.jsonl")} for system in ("dpo", "sft_react")}
        by_seed.append(em)
    t = sorted({types[q] for q in by_seed[0]["dpo"]})[0]
    qs = sorted(q for q in by_seed[0]["dpo"] if types[q] == t)
    a = np.array([[em["dpo"][q] for q in qs] for em in by_seed], float)
    b = np.array([[em["sft_react"][q] for q in qs] for em in by_seed], float)
    want = paired_components(a, b)
    got_t = d["by_type"][t]
    assert (got_t["diff"], got_t["mde"], got_t["n_questions"]) == (pytest.approx(want["diff"]),
                                                                   pytest.approx(want["mde"]), len(qs))
    md = (workdir / "seeds" / "results.md").read_text()
    assert all(x["text"] in md for x in res["comparisons"]) and "## By question type" in md
    assert os.path.getsize(workdir / "seeds" / "seeds.png") > 0


def test_several_eval_stages_give_one_table_of_systems(synthetic_run):
    """seeds.py:findings reads eval and eval_findings together; a system in both is refused, not overwritten."""
    from pathlib import Path

    from jaxrag.pipelines.synthetic.seeds import seed_scores

    run = Path(synthetic_run[1])
    one = seed_scores(run, "eval", "")
    both = seed_scores(run, "eval, eval_findings", "")
    findings = json.loads((run / "eval_findings" / "results.json").read_text())["systems"]
    assert set(one) < set(both) and {s for s, _ in both} == {s for s, _ in one} | set(findings)
    with pytest.raises(ValueError, match="is in two of the eval stages"):
        seed_scores(run, "eval,eval", "")


def test_the_findings_preset_reuses_the_demo_seed_runs():
    """seeds.py:findings runs findings.py:paired per seed: its demo stages have the demo's settings (so the seed runs
    of a demo study in the same workdir are reused, stage by stage), and each paired comparison names a system its
    eval_findings stage evaluates."""
    from jaxrag.workdir import stage_settings

    c = config_module("seeds").get_config("findings")
    assert c.seed_runs.config.endswith("findings.py:paired") and c.seeds.eval == "eval,eval_findings"
    paired, demo = config_module("findings").get_config("paired"), config_module("pipeline").get_config("demo")
    for stage in demo.stages:
        assert stage_settings(paired, stage) == stage_settings(demo, stage), stage
    evaluated = {s["name"] for s in paired.eval_findings.systems} | {s["name"] for s in demo.eval.systems}
    for comp in c.seeds.comparisons:
        assert {comp["a"], comp["b"]} <= evaluated or comp["a"].startswith("bo"), comp
    assert set(paired.stages) - set(demo.stages) == set(config_module("findings").PAIRED)
