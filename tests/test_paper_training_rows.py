"""The training rows of ReasonRAG Table 3 and SmartSearch Table 3, run end to end by their smoke variants (issue 13:
every config's smoke runs in CI, so none rots). One run of each config, shared by the tests of it: every stage runs,
each training stage trains for its configured steps on its own data, each tuned row's eval reads its own stage's
model, and the evals name the published rows."""

import json
from pathlib import Path

import jax
import numpy as np
import pytest

from jaxrag.main import run
from jaxrag.models import load_hf
from test_paper_configs import _eval_methods, _published, load


def _rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def _weights(model_dir: Path) -> np.ndarray:
    _, params = load_hf(model_dir)
    return np.concatenate([np.asarray(x, np.float32).ravel() for x in jax.tree.leaves(params)])


@pytest.fixture(scope="module")
def reasonrag(tmp_path_factory):
    wd = tmp_path_factory.mktemp("reasonrag_t3")
    c = load("reasonrag/table3", "smoke")
    return c, run(c, wd), wd


@pytest.fixture(scope="module")
def smartsearch(tmp_path_factory):
    wd = tmp_path_factory.mktemp("smartsearch_t3")
    c = load("smartsearch/table3", "smoke")
    return c, run(c, wd), wd


def _check_trained(c, wd: Path, stage: str) -> None:
    """A train stage (SFT/DPO) ran its steps with a finite loss; an RL stage its RL steps over G episodes a question."""
    summary = json.loads((wd / stage / "summary.json").read_text())
    if "rl_steps" in summary:
        rl = c[stage].rl
        assert summary["rl_steps"] == rl.steps and summary["loss"] == c[stage].train.loss
        assert len(_rows(wd / stage / "episodes.jsonl")) == rl.steps * rl.questions_per_step * rl.group_size
    else:
        assert summary["step"] == c[stage].train.steps and np.isfinite(summary["metrics"]["loss"])
    assert (wd / stage / "DONE").is_file()


def _check_rows(c, wd: Path, paper: str) -> dict[str, np.ndarray]:
    """Each eval wrote its published row, from the model its policy names; returns that model's weights by stage."""
    evals = [s for s in c.stages if c[s].fn.endswith(":eval_stage")]
    methods = {row["method"] for s in evals for row in _rows(wd / s / "metrics.jsonl")}
    assert methods == _eval_methods(c) == _published(paper, "table3")
    weights = {}
    for s in evals:
        path = c[s].policy.path
        src = path.split(":", 1)[1] if path.startswith("stage:") else "setup"
        weights.setdefault(src, _weights(wd / src / "model"))
    return weights


def _no_signal(wd: Path, stage: str) -> bool:
    """Every GRPO step of the stage had only groups whose rewards were all equal."""
    return all(m["reward/groups_without_signal"] == 1.0 for m in _rows(wd / stage / "metrics.jsonl"))


def test_reasonrag_table3_trains_every_row(reasonrag):
    """MCTS pairs -> DPO, its SFT rows -> SFT, outcome GRPO on the MCTS questions -> ORL; five rows evaluated. The
    tiny random policy never answers right, so ORL's groups carry no signal: GRPO then leaves the weights exactly as
    they were (a zero advantage has no gradient; the KL to the reference is 0 at the reference)."""
    c, ran, wd = reasonrag
    assert ran == list(c.stages)
    stats = json.loads((wd / "mcts" / "stats.json").read_text())
    assert stats["pairs"] == len(_rows(wd / "mcts" / "dpo.jsonl")) >= 1
    assert stats["sft_rows"] == len(_rows(wd / "mcts" / "sft.jsonl")) >= 1
    for stage in ("dpo", "sft", "orl_5k", "orl_10k"):
        _check_trained(c, wd, stage)
    w = _check_rows(c, wd, "reasonrag")
    assert set(w) == {"setup", "dpo", "sft", "orl_5k", "orl_10k"}
    assert not np.array_equal(w["dpo"], w["setup"]) and not np.array_equal(w["sft"], w["setup"])
    assert not np.array_equal(w["dpo"], w["sft"])
    for stage in ("orl_5k", "orl_10k"):
        assert _no_signal(wd, stage) and np.array_equal(w[stage], w["setup"]), stage


def test_smartsearch_table3_trains_the_curriculum_and_its_ablations(smartsearch):
    """SFT -> DPO -> GRPO and the ablations' own data (outcome-only, no refinement); stage 3 with the refinement
    rollout and the composite reward, its 'standard' ablation with neither."""
    c, ran, wd = smartsearch
    assert ran == list(c.stages)
    for stage in ("s1_sft", "s1_sft_npr", "s2_dpo", "s2_dpo_npr", "s2_dpo_nor", "s3", "s3_npr", "s3_nor", "s3_std"):
        _check_trained(c, wd, stage)
    w = _check_rows(c, wd, "smartsearch")
    for a, b in (("s2_dpo", "s2_dpo_npr"), ("s2_dpo", "s2_dpo_nor"), ("s2_dpo_npr", "s2_dpo_nor")):
        assert not np.array_equal(w[a], w[b]), (a, b)   # each ablation's pairs train weights of their own
    # the smoke's stage 1 keeps the same one trajectory with process rewards as without: the same weights
    assert (wd / "s1_data" / "sft.jsonl").read_text() == (wd / "s1_data" / "sft_outcome.jsonl").read_text()
    assert np.array_equal(w["s1_sft"], w["s1_sft_npr"])
    steps = {s: _rows(wd / s / "metrics.jsonl") for s in ("s3", "s3_npr", "s3_nor", "s3_std")}
    for s in ("s3", "s3_npr"):   # the refinement rollout (its counters), the others sample independently
        assert all("refine/refine_requests" in m for m in steps[s])
    for s in ("s3_nor", "s3_std"):
        assert not any(k.startswith("refine/") for m in steps[s] for k in m)
    assert "reward/composite" in steps["s3"][0] and "reward/composite" not in steps["s3_std"][0]
