"""The synthetic pipeline's tiny preset on 2 CPU processes x 2 fake devices each (launch/local.py), every trainer (SFT,
DPO, critic, outcome SFT, GRPO) on an FSDP 2 x tensor 2 mesh over the 4 devices, against one process holding the
same 4 devices: every stage finishes, writes one copy of each output, host-side stages run on process 0 alone, and
the results equal the one-process run's except where they legitimately differ (docs/multihost.md):
- trained models: equal up to float rounding (cross-process reductions sum in another order);
- GRPO's episodes: each process samples its share of a step's groups with seed + p * 1000003 (T > 0), so process
  0's groups equal the one-process run's and process 1's do not."""

import json
from pathlib import Path

import pytest

from test_multihost import ROOT, assert_same_model, rows, run_multi, run_single

CONFIG = ROOT / "configs" / "synthetic" / "pipeline.py"
TRAINERS = ("sft", "dpo", "critic", "outcome", "grpo")
LEAD_ONLY = ("world", "index", "teacher", "tokenizer", "supervision", "agreement", "bestofn", "eval", "report")
MESH = [f"--config.{s}.train.mesh=(1, 2, 2)" for s in TRAINERS]
# SFT's 300 steps are most of a 2-process run's time (a step's collectives cross processes); 100 leave a policy that
# still yields supervision pairs, and the checks compare the two runs, not how well the policy learned
SFT_STEPS = 100
ARGS = [*MESH, f"--config.sft.train.steps={SFT_STEPS}"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("mh_synthetic")
    log = run_multi(f"{CONFIG}:tiny", tmp / "multi", *ARGS, timeout=1800)
    run_single(f"{CONFIG}:tiny", tmp / "single", *ARGS, timeout=1800)
    return tmp / "multi", tmp / "single", log


def tiny_config():
    import importlib.util

    spec = importlib.util.spec_from_file_location("synthetic_pipeline_config", CONFIG)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    config = mod.get_config("tiny")
    config.sft.train.steps = SFT_STEPS
    return config


def provenance(workdir: Path, stage: str) -> dict:
    return json.loads((workdir / stage / "DONE").read_text())["provenance"]


def token_ids(path: Path) -> list:
    """Each episode's question and sampled token ids per step (not its log-probs or timings, which are floats)."""
    return [(e["qid"], [s["token_ids"] for s in e["steps"]]) for e in rows(path)]


def check_once(multi: Path, log: str) -> None:
    config = tiny_config()
    for stage in config.stages:
        assert (multi / stage / "DONE").is_file(), stage
    assert not list(multi.rglob("*.tmp")), list(multi.rglob("*.tmp"))
    steps = {s: config[s].train.steps if s != "grpo" else config.grpo.rl.steps for s in TRAINERS}
    for stage, n in steps.items():  # process 0 alone writes metrics: each step once
        train = [r["step"] for r in rows(multi / stage / "metrics.jsonl") if r["kind"] == "train"]
        assert train == list(range(1, n + 1)), stage
    for stage in LEAD_ONLY:  # host-side work done once, by process 0 (launch/local.py prefixes [i])
        assert f"[0] [{stage}] " in log, stage
        assert f"[1] [{stage}] " not in log, stage
    assert len(rows(multi / "grpo" / "episodes.jsonl")) == (
        config.grpo.rl.steps * config.grpo.rl.questions_per_step * config.grpo.rl.group_size)


def check_equal(multi: Path, single: Path) -> None:
    for stage in ("world", "index", "teacher", "tokenizer"):  # host-side and seeded: bit-equal
        assert provenance(multi, stage)["sha256"] == provenance(single, stage)["sha256"], stage
    for stage in TRAINERS:  # float rounding only: the two runs reduce in another order. Adam divides each update by
        # the root of the gradient's second moment, so an embedding row seen in few tokens moves by about the learning
        # rate whatever its tiny gradient's last bits (outcome: 1 of 32,768 entries 1.0e-4 apart); a wrong layout or a
        # double-counted batch moves every entry by far more
        assert_same_model(multi / stage / "model", single / stage / "model", rtol=2e-5, atol=5e-4)
    # sampled on process 0 with the one-process run's seeds (greedy and T > 0 alike): the same tokens
    files = ["supervision/episodes.jsonl", "outcome/episodes.jsonl"] + [
        str(p.relative_to(multi)) for p in sorted((multi / "eval").glob("episodes_*.jsonl"))]
    assert len(files) > 2
    for f in files:
        assert token_ids(multi / f) == token_ids(single / f), f
    for f in ("supervision/pairs.jsonl", "bestofn/bestofn.json"):
        stage, name = f.split("/")
        assert provenance(multi, stage)["files"][name] == provenance(single, stage)["files"][name], f
    # GRPO: each step's groups in group order, process 0's share (the first half) sampled as on one process
    g = tiny_config().grpo.rl
    per_step, a, b = g.questions_per_step * g.group_size, token_ids(multi / "grpo" / "episodes.jsonl"), \
        token_ids(single / "grpo" / "episodes.jsonl")
    assert [q for q, _ in a] == [q for q, _ in b]
    for step in range(g.steps):
        first = slice(step * per_step, step * per_step + per_step // 2)
        assert a[first] == b[first], step


@pytest.mark.slow
def test_synthetic_pipeline_on_two_processes(runs):
    multi, single, log = runs
    check_once(multi, log)
    check_equal(multi, single)
