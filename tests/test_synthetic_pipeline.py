"""End to end: the synthetic pipeline's tiny preset (CI), run once per test session and read by every test here.
Asserts that outputs exist and agree with each other (not a score threshold)."""

import collections
import csv
import json
import os

import pytest

from jaxrag import main as jmain
from jaxrag.jsonl import read_jsonl
from jaxrag.machine import cpu
from jaxrag.env.mdp import read_episodes
from jaxrag.metrics import exact_match
from jaxrag.pipelines.synthetic.taxonomy import KINDS, error_kind


def config_module(name: str):
    """configs/synthetic/<name>.py as a module (config files are not a package)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "configs" / "synthetic" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"{name}_config", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def run(synthetic_run):
    return synthetic_run


def test_every_stage_ran_and_reruns_skip(run):
    config, workdir, ran = run
    assert ran == list(config.stages)
    for name in config.stages:
        assert os.path.exists(os.path.join(workdir, name, "DONE")), name
    assert jmain.run(config, workdir) == []


def test_world_teacher_and_model_outputs_agree(run):
    config, workdir, _ = run
    stats = json.load(open(os.path.join(workdir, "world", "stats.json")))
    corpus = read_jsonl(os.path.join(workdir, "world", "corpus.jsonl"))
    assert len(corpus) == stats["passages"]
    for split in ("train", "dev", "test", "heldout"):
        qs = read_jsonl(os.path.join(workdir, "world", f"questions_{split}.jsonl"))
        assert sum(v for k, v in stats["questions"].items() if k.startswith(split + "/")) == len(qs)
        teacher = os.path.join(workdir, "teacher", f"episodes_{split}.jsonl")
        assert os.path.exists(teacher) == (split in config.teacher.splits)
        assert split != "test" or not os.path.exists(teacher)  # never the test split
        if os.path.exists(teacher):
            assert [e.qid for e in read_episodes(teacher)] == [q["id"] for q in qs]
    assert os.path.exists(os.path.join(workdir, "tokenizer", "spm.model"))
    for stage in ("sft", "sft_re2search"):
        summary = json.load(open(os.path.join(workdir, stage, "summary.json")))
        rows = read_jsonl(os.path.join(workdir, stage, "metrics.jsonl"))
        assert [r["step"] for r in rows if r["kind"] == "train"] == list(range(1, config[stage].train.steps + 1))
        assert summary["agent"] == config[stage].agent and summary["steps"] >= 1
        evals = [r for r in rows if r["kind"] == "eval"]
        assert {r["split"] for r in evals} == {"dev", "heldout"}
        assert all(0.0 <= r["all_actions_right"] <= 1.0 and 0.0 <= r["action_token_acc"] <= 1.0 for r in evals)
        assert max(r["step"] for r in rows) == summary["steps"]
        assert os.path.getsize(os.path.join(workdir, stage, "model", "model.safetensors")) > 0
        assert os.path.exists(os.path.join(workdir, stage, "model", "tokenizer.model"))


def test_later_stages_sample_only_questions_sft_never_trained_on(run):
    """The unseen pool (config.unseen_questions): the seeded head of the train order, kept out of SFT; the
    supervision, outcome, GRPO, MCTS and SmartSearch stages sample only from it."""
    from jaxrag.supervision.mcts import read_trees
    from jaxrag.supervision.records import read_records

    config, workdir, _ = run
    pool = {q["id"] for q in read_jsonl(os.path.join(workdir, "sft", "pool_questions.jsonl"))}
    train = {q["id"] for q in read_jsonl(os.path.join(workdir, "world", "questions_train.jsonl"))}
    assert len(pool) == config.unseen_questions and pool < train
    assert json.load(open(os.path.join(workdir, "sft", "summary.json")))["unseen_kept_out"] == len(pool)
    sampled = {
        "supervision": {r.qid for r in read_records(os.path.join(workdir, "supervision", "records_oracle.jsonl"))}
        | {e.qid for e in read_episodes(os.path.join(workdir, "supervision", "episodes.jsonl"))},
        "outcome": {e.qid for e in read_episodes(os.path.join(workdir, "outcome", "episodes.jsonl"))},
        "grpo": {e.qid for e in read_episodes(os.path.join(workdir, "grpo", "episodes.jsonl"))},
        "mcts": {t.qid for t in read_trees(os.path.join(workdir, "mcts", "trees.jsonl"))},
    }
    for stage, qids in sampled.items():
        assert qids and qids <= pool, (stage, sorted(qids - pool)[:3])


def test_a_sampling_stage_beyond_the_unseen_pool_is_refused_before_any_stage(tmp_path):
    c = config_module("pipeline").get_config("tiny")
    c.outcome.max_questions = c.unseen_questions + 1
    with pytest.raises(jmain.StageError, match=rf"outcome\.max_questions: {c.unseen_questions + 1} would sample train "
                       "questions SFT trained on"):
        jmain.run(c, tmp_path)
    assert not os.listdir(tmp_path) or not os.path.exists(tmp_path / "world" / "DONE")


def test_eval_only_runs_the_named_systems_and_refuses_an_unknown_one(tmp_path):
    from jaxrag.pipelines.synthetic.evaluate import selected_systems

    c = config_module("pipeline").get_config("tiny")
    assert [s["name"] for s in selected_systems(c.eval)] == [s["name"] for s in c.eval.systems]
    c.eval.only = "dpo, sft_react"
    assert [s["name"] for s in selected_systems(c.eval)] == ["sft_react", "dpo"]   # the section's order
    c.eval.only = "sft_react,dpo_kto"
    with pytest.raises(jmain.StageError, match=r"eval\.only: 'dpo_kto' is not one of the systems"):
        jmain.run(c, tmp_path)


def test_anchor_level_pool_keeps_whole_anchors_out(tmp_path):
    """unseen_by_anchor: no anchor of the pool anchors a question SFT trains on (the question-level pool leaks them);
    the sampling stages draw the head of the pool."""
    from jaxrag.pipelines.synthetic.world import sampling_questions, unseen_pool

    c = config_module("pipeline").get_config("tiny")
    jmain.run(c, tmp_path, only=["world"])
    train = read_jsonl(tmp_path / "world" / "questions_train.jsonl")

    def leaked_anchors(pool):
        ids = {q["id"] for q in pool}
        return {q["metadata"]["anchor"] for q in pool} & {q["metadata"]["anchor"] for q in train if q["id"] not in ids}

    by_question = unseen_pool(c, tmp_path)
    assert len(by_question) == c.unseen_questions and leaked_anchors(by_question)
    c.unseen_by_anchor = True
    by_anchor = unseen_pool(c, tmp_path)
    assert len(by_anchor) >= c.unseen_questions and not leaked_anchors(by_anchor)
    assert [q["id"] for q in unseen_pool(c, tmp_path)] == [q["id"] for q in by_anchor]  # seeded
    assert sampling_questions(c, tmp_path, 5) == by_anchor[:5]
    with pytest.raises(ValueError, match="raise unseen_questions"):
        sampling_questions(c, tmp_path, len(by_anchor) + 1)


def test_eval_results_match_episode_files(run):
    config, workdir, _ = run
    s = config.eval
    results = json.load(open(os.path.join(workdir, "eval", "results.json")))
    assert results["seed"] == config.seed
    for system in s.systems:
        name, agent, model = system["name"], system["agent"], system["model"]
        assert results["systems"][name]["agent"] == agent and results["systems"][name]["model"] == model
        for split in s.splits:
            r = results["systems"][name]["splits"][split]
            qs = read_jsonl(os.path.join(workdir, "world", f"questions_{split}.jsonl"))
            types = collections.Counter(q["metadata"]["type"] for q in qs)
            per_type = -(-s.max_questions // len(types))  # evaluation is stratified by question type
            eps = read_episodes(os.path.join(workdir, "eval", f"episodes_{name}_{split}.jsonl"))
            assert r["all"]["n"] == len(eps) == sum(min(n, per_type) for n in types.values())
            assert {t: g["n"] for t, g in r["by_type"].items()} == {t: min(n, per_type) for t, n in types.items()}
            assert sum(g["n"] for g in r["by_type"].values()) == len(eps) == sum(g["n"] for g in r["by_hops"].values())
            assert r["all"]["em"] == pytest.approx(sum(exact_match(e.answer, e.gold) for e in eps) / len(eps))
            errors = r["errors"]["all"]   # every episode has one kind; "correct" is EM
            by_q = {q["id"]: q for q in qs}
            assert errors["counts"] == {k: sum(error_kind(e, by_q[e.qid]) == k for e in eps) for k in KINDS}
            assert errors["shares"]["correct"] == pytest.approx(r["all"]["em"])
            assert 0.0 <= r["all"]["invalid_rate"] <= 1.0
            assert all(len(e.steps) <= s.max_steps for e in eps)
            if agent == "direct":
                assert r["all"]["searches_max"] == 0
            if agent == "rag":
                assert r["all"]["searches_min"] == r["all"]["searches_max"] == 1


def test_report_files(run):
    config, workdir, _ = run
    results = json.load(open(os.path.join(workdir, "eval", "results.json")))
    out = os.path.join(workdir, "report")
    rows = list(csv.DictReader(open(os.path.join(out, "results.csv"))))
    expected = sum(1 + len(sp["by_type"]) for sysr in results["systems"].values() for sp in sysr["splits"].values())
    assert len(rows) == expected and len(results["systems"]) == len(config.eval.systems)
    sections = open(os.path.join(out, "results.md")).read().split("\n## ")
    summary = next(s for s in sections if s.startswith("Summary"))
    assert summary.count("\n|") == len(results["systems"]) + 2  # header, separator, one row per system
    for name, r in results["systems"].items():  # the summary's numbers are the eval stage's
        test = r["splits"]["test"]["all"]
        assert f"| {name} | {test['em']:.3f} / {test['f1']:.3f} |" in summary
    full = next(s for s in sections if s.startswith("Every system"))
    assert full.count("\n|") == expected + 2  # header, separator, rows
    machine = next(s for s in sections if s.startswith("Machine"))   # the CPU the numbers were made on
    assert f"Made on {cpu()['model']} (vector extensions: " in machine
    # the suite runs with jaxrag's portable XLA:CPU settings, and the report says so
    assert "xla_cpu_enable_platform_dependent_math=false" in machine
    assert "the portable settings: two runs on one machine give the same bytes" in machine
    assert "not the portable settings" not in machine
    failures = next(s for s in sections if s.startswith("Where the failures come from"))
    for name, r in results["systems"].items():   # one row per system x split, with its EM
        for split, sp in r["splits"].items():
            assert f"| {name} {split} | {sp['all']['n']} | {sp['all']['em']:.3f} |" in failures
    sig = next(s for s in sections if s.startswith("Did each method have signal?"))
    dpo = json.load(open(os.path.join(workdir, "dpo", "summary.json")))
    assert f"| dpo | {dpo['pairs']} pairs | {dpo['steps']} |" in sig and "| sft | - |" in sig
    # dpo and critic train on the same pairs from the same policy: one pair-targets reading, two shares in [0, 1]
    cells = {line.split(" | ")[0][2:]: line.split(" | ")[5] for line in sig.split("How far each system moved")[0]
             .splitlines() if line.startswith("| dpo |") or line.startswith("| critic |")}
    rejected, chosen = (float(x) for x in cells["dpo"].split(" / "))
    assert cells["dpo"] == cells["critic"] and 0 <= rejected <= 1 and 0 <= chosen <= 1
    moved = [line.split(" | ")[0][2:] for line in sig.split("How far each system moved")[1].splitlines()
             if line.startswith("| ") and not line.startswith("| system")]
    assert moved == [name for name in results["systems"] if name != "sft_react"]
    for png in ("training_curves.png", "accuracy_by_hops.png"):
        with open(os.path.join(out, png), "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_report_lists_every_stages_content_hash(run):
    from jaxrag.provenance import stage_hash

    config, workdir, _ = run
    out = os.path.join(workdir, "report")
    prov = next(s for s in open(os.path.join(out, "results.md")).read().split("\n## ") if s.startswith("Provenance"))
    recorded = json.load(open(os.path.join(out, "provenance.json")))
    stages = list(config.stages)   # the findings config runs more stages after the report
    assert list(recorded) == stages[:stages.index("report")]  # every stage before the report itself
    for name, rec in recorded.items():
        assert rec == json.load(open(os.path.join(workdir, name, "DONE")))["provenance"]
        assert rec == stage_hash(os.path.join(workdir, name)), f"{name}: its outputs changed after its DONE"
        assert f"| {name} | `{rec['sha256'][:16]}` |" in prov
    assert "sft" in recorded and any(f.endswith(".safetensors") for f in recorded["sft"]["files"])


def test_supervision_records_pairs_and_budget_agree(run):
    from jaxrag.supervision.records import read_pairs, read_records

    config, workdir, _ = run
    sup = os.path.join(workdir, "supervision")
    stats = json.load(open(os.path.join(sup, "stats.json")))
    records = read_records(os.path.join(sup, "records_oracle.jsonl"))
    pairs = read_pairs(os.path.join(sup, "pairs.jsonl"))
    eps = {e.qid: e for e in read_episodes(os.path.join(sup, "episodes.jsonl"))}
    assert stats["pairs"] == len(pairs) and stats["records_kept"] == len(records)
    assert stats["sampled_actions_all"] == stats["states"] * config.supervision.n_candidates
    for r in records:  # only states of correct trajectories; the oracle's 0/1 scores; the prompt the policy saw
        assert eps[r.qid].metadata["kept"] and len(r.candidates) == config.supervision.n_candidates
        assert all(c.score in (0.0, 1.0) for c in r.candidates)
        assert r.prompt == eps[r.qid].steps[r.step].prompt
    by_state = {(r.qid, r.step): r for r in records}
    for p in pairs:
        cands = {c.raw: c.score for c in by_state[(p.qid, p.step)].candidates}
        assert cands[p.chosen] > 0.75 and cands[p.rejected] < 0.5 and p.prompt == by_state[(p.qid, p.step)].prompt
    agree = os.path.join(sup, "agreement")
    oracle = read_records(os.path.join(agree, "records_oracle.jsonl"))
    rollout = read_records(os.path.join(agree, "records_rollout.jsonl"))
    assert [(r.qid, r.step) for r in oracle] == [(r.qid, r.step) for r in rollout]
    assert all(c.score is not None and 0.0 <= c.score <= 1.0 for r in rollout for c in r.candidates)


def test_preference_stages_trained_from_sft(run):
    from jaxrag.train.metrics_log import read_metrics

    config, workdir, _ = run
    for stage, loss in (("dpo", "dpo"), ("critic", "bt")):
        rows = read_metrics(os.path.join(workdir, stage, "metrics.jsonl"))
        assert sorted(rows) == list(range(1, config[stage].train.steps + 1))
        key = "dpo/accuracy" if loss == "dpo" else "bt/accuracy"
        assert all(0.0 <= r[key] <= 1.0 for r in rows.values())
        assert json.load(open(os.path.join(workdir, stage, "train_config.json")))["loss"] == loss
    assert os.path.exists(os.path.join(workdir, "critic", "model", "head.npz"))
    assert not os.path.exists(os.path.join(workdir, "dpo", "model", "head.npz"))


def test_outcome_baseline_sampled_the_same_budget(run):
    config, workdir, _ = run
    budget = json.load(open(os.path.join(workdir, "supervision", "stats.json")))["sampled_actions_all"]
    summary = json.load(open(os.path.join(workdir, "outcome", "summary.json")))
    eps = read_episodes(os.path.join(workdir, "outcome", "episodes.jsonl"))
    assert summary["budget_actions"] == budget and summary["sampled_actions"] == sum(len(e.steps) for e in eps)
    assert budget <= summary["sampled_actions"] < budget + config.outcome.max_steps
    from jaxrag.metrics import f1_score

    assert summary["correct"] == sum(f1_score(e.answer, e.gold) >= config.outcome.keep_f1 for e in eps)


def test_agreement_and_bestofn_outputs(run):
    config, workdir, _ = run
    rows = json.load(open(os.path.join(workdir, "agreement", "agreement.json")))
    assert {r["source"] for r in rows} >= {"rollout", "critic"}
    assert all(r["pairs"] >= 0 and (r["agreement"] is None or 0.0 <= r["agreement"] <= 1.0) for r in rows)
    b = json.load(open(os.path.join(workdir, "bestofn", "bestofn.json")))
    assert [(r["n"], r["selector"]) for r in b["rows"]] == [(1, "critic")] + [
        (n, s) for n in config.bestofn.ns[1:] for s in ("critic", "first_valid")]
    # the paired comparisons are paired_components of the episodes the stage wrote, question by question
    from jaxrag.env.mdp import read_episodes
    from jaxrag.evaluate import paired_components
    from jaxrag.metrics import exact_match

    def em(n, sel):
        return [float(exact_match(e.answer, e.gold))
                for e in read_episodes(os.path.join(workdir, "bestofn", f"episodes_n{n}_{sel}.jsonl"))]

    n = config.bestofn.ns[1]
    names = [(c["a"], c["b"]) for c in b["comparisons"]]
    assert names[:3] == [(f"bo{n}_critic", f"bo{n}_first_valid"), (f"bo{n}_critic", "greedy"),
                         (f"bo{n}_first_valid", "greedy")]
    want = paired_components(em(n, "critic"), em(n, "first_valid"))
    assert {k: b["comparisons"][0][k] for k in ("diff", "se", "mde", "disagree")} == \
        {k: want[k] for k in ("diff", "se", "mde", "disagree")}
    with open(os.path.join(workdir, "report", "bestofn.png"), "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert "Annotator agreement" in open(os.path.join(workdir, "report", "results.md")).read()


# ------------------------------------------------------------------------------ the findings (configs/synthetic/findings.py)
def test_findings_config_reuses_the_demo_stages():
    """Every main-job stage has the same settings (so the same fingerprint) under findings.py as under pipeline.py,
    for both presets: running the findings in the demo's workdir reuses the demo's outputs."""
    from jaxrag.workdir import stage_settings

    mod = config_module("findings")
    for preset in ("demo", "tiny"):
        demo, findings = mod.pipeline.get_config(preset), mod.get_config(preset)
        assert list(findings.stages[: len(demo.stages)]) == list(demo.stages)
        for stage in demo.stages:
            assert stage_settings(findings, stage) == stage_settings(demo, stage), (preset, stage)
        assert findings.grpo_k3.train.grpo.kl_estimator == "k3" and findings.grpo.train.grpo.kl_estimator == "k2"
        assert findings.grpo_k3.rl.to_dict() == findings.grpo.rl.to_dict()
        findings.index.k = 7  # the k3 run's k still references the one home
        assert findings.grpo_k3.rl.k == findings.grpo.rl.k == 7


def test_f1_penalty_baseline_trains_on_its_reward_at_the_em_grpo_budget(run):
    """grpo_f1_penalty (Search-R1++'s outcome reward) is the grpo stage with another reward: the same steps x
    questions x G, every sampled episode rewarded max(0, F1 - 0.05 x searches), evaluated like every system."""
    from jaxrag.metrics import f1_score

    config, workdir, _ = run
    assert config.grpo_f1_penalty.reward == "f1_search_penalty(0.05)" and config.grpo.reward == "em"
    assert config.grpo_f1_penalty.rl.to_dict() == config.grpo.rl.to_dict()
    eps = {g: read_episodes(os.path.join(workdir, g, "episodes.jsonl")) for g in ("grpo", "grpo_f1_penalty")}
    rl = config.grpo.rl
    assert len(eps["grpo_f1_penalty"]) == len(eps["grpo"]) == rl.steps * rl.questions_per_step * rl.group_size
    for ep in eps["grpo_f1_penalty"]:
        assert ep.reward == pytest.approx(max(0.0, f1_score(ep.answer, ep.gold) - 0.05 * ep.num_searches))
    results = json.load(open(os.path.join(workdir, "eval", "results.json")))
    assert set(results["systems"]["grpo_f1_penalty"]["splits"]) == set(config.eval.splits)
    assert "| grpo_f1_penalty |" in open(os.path.join(workdir, "report", "results.md")).read()


def test_tiny_shape_floors_reach_every_sampling_policy_and_leave_the_demo_alone():
    """The tiny preset's sampler floors (few compiled programs) reach the synthetic stages' policies (config.sampler)
    and every GRPO stage's own policy section, findings' too; the demo has none, so its programs, results and stage
    fingerprints do not change."""
    mod = config_module("findings")
    demo, tiny = mod.get_config("demo"), mod.get_config("tiny")
    assert "sampler" not in demo and all(k not in demo[g].policy for g in ("grpo", "grpo_k3", "ss_grpo")
                                         for k in ("min_rows", "min_prompt"))
    floors = tiny.sampler.to_dict()
    assert floors == {"min_rows": 64, "min_prompt": 256}
    for g in ("grpo", "grpo_k3", "ss_grpo"):
        assert {k: tiny[g].policy[k] for k in floors} == floors, g
    assert tuple(tiny.dpo.train.seq_buckets) == tuple(tiny.critic.train.seq_buckets) == (320,)


@pytest.mark.parametrize("which,new_grpo", [("g", "grpo_t07_g8_60"), ("h", "grpo_t07_g8_30")])
def test_dev_trials_g_h_reuse_the_demo_stages_and_sample_the_pool(which, new_grpo):
    """dev_tuning.py:g and :h (GRPO from a demo) run in a copy of a demo workdir: the demo's stages keep their
    settings (so their outputs are reused) except `sft` and `grpo`, which are the demo's from before trials i and h
    (the workdirs the trials ran in); every stage passes main's static checks, and the trial's GRPO samples the
    pool. Trial h's grpo_t07_g8_30 is what the demo adopted: the same settings as the demo's grpo."""
    from jaxrag.main import plan
    from jaxrag.workdir import stage_settings

    mod = config_module("dev_tuning")
    demo, trial = mod.pl.get_config("demo"), mod.get_config(which)
    assert list(trial.stages[: len(demo.stages)]) == list(demo.stages)
    for stage in demo.stages:
        if stage not in ("sft", "grpo"):
            assert stage_settings(trial, stage) == stage_settings(demo, stage), stage
    old = trial.grpo
    assert (old.rl.temperature, old.rl.questions_per_step, old.rl.group_size, old.train.optimizer.lr) == (
        1.0, 8, 4, 5e-5)
    assert (trial.sft.train.steps, trial.sft.train.optimizer.schedule, trial.sft.eval_every) == (900, "cosine", 150)
    assert [name for name, _ in plan(trial)] == list(trial.stages)
    assert trial[new_grpo].questions.path == demo.grpo.questions.path == "sft/pool_questions.jsonl"
    assert (trial[new_grpo].rl.group_size, trial[new_grpo].rl.temperature) == (8, 0.7)
    if which == "h":
        assert trial[new_grpo].to_dict() == demo.grpo.to_dict()


def test_dev_trial_i_is_the_demo_sft_at_two_budgets():
    """dev_tuning.py:i trains the demo's SFT (warmup-stable-decay) at 720 and 600 steps beside the old 900-step
    cosine `sft`; the 720-step one is what the demo adopted (eval cadence aside)."""
    from jaxrag.main import plan

    mod = config_module("dev_tuning")
    demo, trial = mod.pl.get_config("demo"), mod.get_config("i")
    assert [name for name, _ in plan(trial)] == list(trial.stages)
    assert trial.stages[-3:] == ["sft_wsd720", "sft_wsd600", "eval_dev_i"]
    want = demo.sft.to_dict()
    for stage, steps in (("sft_wsd720", 720), ("sft_wsd600", 600)):
        got = trial[stage].to_dict()
        assert got["train"]["steps"] == steps and got["eval_every"] == 60
        assert {**got, "eval_every": want["eval_every"], "train": {**got["train"], "steps": 720}} == want
    for bad in ("", "f", "ab"):   # an unknown trial is named, not an error deep in the file
        with pytest.raises(ValueError, match=rf"dev_tuning.py: unknown trial {bad!r} \(one of a, b, c, d, e, g"):
            mod.get_config(bad)


def test_mcts_pairs_at_the_ranking_budget(run):
    from jaxrag.supervision.mcts import read_trees, tree_pairs
    from jaxrag.supervision.records import read_pairs, read_records

    config, workdir, _ = run
    st = json.load(open(os.path.join(workdir, "mcts", "stats.json")))
    budget = json.load(open(os.path.join(workdir, "supervision", "stats.json")))["sampled_actions_all"]
    assert st["budget_actions"] == budget and st["sampled_actions_all"] == sum(st["sampled"].values())
    if st["trees"] < config.mcts.max_questions:  # stopped by the budget, within one round of it
        assert st["sampled_actions_all"] >= budget
    trees = read_trees(os.path.join(workdir, "mcts", "trees.jsonl"))
    pairs = read_pairs(os.path.join(workdir, "mcts", "pairs.jsonl"))
    records = read_records(os.path.join(workdir, "mcts", "records_mcts.jsonl"))
    assert len(trees) == st["trees"] and len(pairs) == st["pairs"] and len(records) == st["states"]
    assert [(p.chosen, p.rejected) for p in pairs] == [
        (p.chosen, p.rejected) for t in trees for p in tree_pairs(t, config.mcts.mcts.min_margin)]
    for p in pairs:
        assert p.margin >= config.mcts.mcts.min_margin - 1e-9 and p.chosen != p.rejected and p.source == "mcts"
    alpha = config.mcts.mcts.alpha
    for t in trees:  # exact leaves: Q = v · α^depth
        for n in t.nodes:
            if n.stage == "Terminal" and n.value is not None and n.visits and not n.children:
                assert n.own_q == pytest.approx(n.value * alpha ** n.depth)


def test_findings_stages_and_report(run):
    from jaxrag.train.metrics_log import read_metrics

    config, workdir, _ = run
    dpo_mcts = json.load(open(os.path.join(workdir, "dpo_mcts", "summary.json")))
    assert dpo_mcts["pairs"] == json.load(open(os.path.join(workdir, "mcts", "stats.json")))["pairs"]
    assert sorted(read_metrics(os.path.join(workdir, "dpo_mcts", "metrics.jsonl"))) == list(
        range(1, config.dpo_mcts.train.steps + 1))
    k2 = json.load(open(os.path.join(workdir, "grpo", "summary.json")))
    k3 = json.load(open(os.path.join(workdir, "grpo_k3", "summary.json")))
    assert k2["rl_steps"] == k3["rl_steps"] == config.grpo.rl.steps
    assert json.load(open(os.path.join(workdir, "grpo_k3", "train_config.json")))["grpo"]["kl_estimator"] == "k3"
    b = json.load(open(os.path.join(workdir, "bestofn_transfer", "bestofn.json")))
    assert [r["n"] for r in b["rows"] if r["selector"] == "critic"] == list(config.bestofn_transfer.ns)
    res = json.load(open(os.path.join(workdir, "eval_findings", "results.json")))
    assert set(res["systems"]) == {s["name"] for s in config.eval_findings.systems} >= {"dpo_mcts", "grpo_k3"}
    md = open(os.path.join(workdir, "findings", "findings.md")).read()
    for system in ("| sft_react |", "| dpo |", "| dpo_mcts |", "| grpo |", "| grpo_k3 |", "Re²Search (transfer)"):
        assert system in md
    test_em = res["systems"]["dpo_mcts"]["splits"]["test"]["all"]["em"]
    assert "| dpo_mcts | mcts | " in md and f"{test_em:.3f} /" in md
    with open(os.path.join(workdir, "findings", "grpo_curves.png"), "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_big_supervision_study_feeds_its_own_critic_and_dpo(run):
    """findings' supervision_big: 4x the demo's unseen questions (within the pool), its pairs train dpo_big and
    critic_big, whose agreement row (on the demo supervision's dev states) is the one findings.md shows."""
    from jaxrag.supervision.records import read_pairs

    config, workdir, _ = run
    stats = json.load(open(os.path.join(workdir, "supervision_big", "stats.json")))
    assert stats["questions"] == 4 * config.supervision.max_questions <= config.unseen_questions
    pairs = read_pairs(os.path.join(workdir, "supervision_big", "pairs.jsonl"))
    for stage in ("dpo_big", "critic_big"):
        assert json.load(open(os.path.join(workdir, stage, "summary.json")))["pairs"] == len(pairs) == stats["pairs"]
    assert os.path.exists(os.path.join(workdir, "critic_big", "model", "head.npz"))
    big = [r for r in json.load(open(os.path.join(workdir, "agreement_big", "agreement.json"))) if r["source"] == "critic"]
    demo = [r for r in json.load(open(os.path.join(workdir, "agreement", "agreement.json"))) if r["source"] == "critic"]
    assert big[0]["pairs"] == demo[0]["pairs"]  # the same dev states, another critic
    md = open(os.path.join(workdir, "findings", "findings.md")).read()
    cell = "–" if big[0]["agreement"] is None else f"{big[0]['agreement']:.3f}"
    assert f"| critic_big ({stats['questions']} questions' pairs) | {cell} | {big[0]['pairs']} |" in md
    assert "| dpo_big | supervision_big |" in md and "ReAct, critic on 4x the questions" in md


def test_smartsearch_curriculum_stages(run):
    """The curriculum's data agree with SmartSearch's rules, and each stage starts from the one before."""
    from jaxrag.supervision import smartsearch as SS
    from jaxrag.supervision.records import read_pairs

    config, workdir, _ = run
    d = os.path.join(workdir, "ss_data")
    st = json.load(open(os.path.join(d, "stats.json")))
    cfg = SS.SmartSearchConfig(**config.ss_data.smartsearch.to_dict())
    every = read_episodes(os.path.join(d, "episodes.jsonl"))
    assert len(every) == st["sampled"] + st["refined"] == config.ss_data.max_questions * config.ss_data.samples + \
        st["refined"]
    refined = [e for e in every if SS.REFINED_KEY in e.metadata]
    assert len(refined) == st["refined"] and all(SS.credits_of(e) is not None for e in every)
    for e in refined:  # the refined query replaced a search the credit marked bad, and the trajectory went on
        r = e.metadata[SS.REFINED_KEY]
        assert e.steps[r["step"]].action.text == r["refined_query"] != r["original_query"]
    kept = read_episodes(os.path.join(d, "sft_episodes.jsonl"))
    assert len(kept) == st["sft_episodes"] == len(SS.sft_filter(every, cfg))
    for e in kept:
        assert SS.is_correct(e, cfg) and all(c.good for c in SS.credits_of(e))
    pairs = read_pairs(os.path.join(d, "pairs.jsonl"))
    assert len(pairs) == st["pairs"] and all(p.chosen != p.rejected and p.source == "smartsearch" for p in pairs)
    sft = json.load(open(os.path.join(workdir, "ss_sft", "summary.json")))
    assert sft["episodes"] == len(kept)
    assert json.load(open(os.path.join(workdir, "ss_dpo", "summary.json")))["pairs"] == len(pairs)
    rows = read_jsonl(os.path.join(workdir, "ss_grpo", "metrics.jsonl"))
    assert len(rows) == config.ss_grpo.rl.steps and all("reward/composite" in r for r in rows)
    md = open(os.path.join(workdir, "findings", "findings.md")).read()
    section = md.split("## The SmartSearch curriculum")[1]
    for name in config.findings.smartsearch.systems:
        assert f"| {name} |" in section
