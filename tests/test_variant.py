"""configs/common/variant.py: an ablation as one line of a config file, a stage copied with overrides, evaluated
and paired with its base in the seeds study."""

import importlib.util
import json
from pathlib import Path
from types import SimpleNamespace

import jax
import numpy as np
import pytest

from jaxrag.workdir import stage_settings

ROOT = Path(__file__).resolve().parents[1]


def _load(path: str, name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


variant = _load("configs/common/variant.py", "configs_common_variant").variant


def _pipeline(preset="tiny"):
    return _load("configs/synthetic/pipeline.py", "synthetic_pipeline_variant").get_config(preset)


def test_a_variant_is_its_base_with_the_overrides_run_evaluated_and_paired():
    c = _pipeline()
    base_settings = {s: stage_settings(c, s) for s in c.stages}
    variant(c, "dpo", "dpo_ipo", **{"train.dpo.loss_type": "ipo", "train.dpo.beta": 0.5})
    assert c.stages[c.stages.index("dpo") + 1] == "dpo_ipo"
    want = c.dpo.to_dict()
    want["train"]["dpo"].update(loss_type="ipo", beta=0.5)
    assert c.dpo_ipo.to_dict() == want
    assert c.eval.systems[-1] == {**[s for s in c.eval.systems if s["name"] == "dpo"][0], "name": "dpo_ipo",
                                  "model": "dpo_ipo"}
    assert c.study_pairs[-1] == {"a": "dpo_ipo", "b": "dpo", "label": "dpo_ipo vs dpo (variant of dpo)"}
    assert [(p["a"], p["b"]) for p in c.study_pairs[:-1]] == [("grpo_f1_penalty", "grpo")]   # the demo's own
    # no other stage's settings move (study_pairs is result-neutral), except the eval stage that now runs it
    changed = [s for s in base_settings if stage_settings(c, s) != base_settings[s]]
    assert changed == ["eval"]
    c.seed = 7   # the base's references are kept: --config.seed reaches the variant
    assert c.dpo_ipo.train.seed == c.dpo.train.seed == 7


def test_an_rl_variant_keeps_the_seed_and_k_references():
    c = _pipeline()
    variant(c, "grpo", "grpo_k3", **{"train.grpo.kl_estimator": "k3"})
    c.index.k, c.seed = 3, 4
    assert (c.grpo_k3.rl.k, c.grpo_k3.rl.seed) == (3, 4) and c.grpo_k3.train.grpo.kl_estimator == "k3"
    assert ("grpo_k3", "grpo") in {(p["a"], p["b"]) for p in c.study_pairs}


def test_a_wrong_base_name_or_key_fails_in_one_line():
    c = _pipeline()
    with pytest.raises(ValueError, match="variant: 'dpoo' is not a stage"):
        variant(c, "dpoo", "x")
    with pytest.raises(ValueError, match="variant 'x': override .*lrr.* is not a key of section 'dpo'"):
        variant(c, "dpo", "x", **{"train.optimizer.lrr": 1.0})
    with pytest.raises(ValueError, match="'critic' is already a key"):
        variant(c, "dpo", "critic")
    assert "x" not in c.stages


def test_the_seeds_study_pairs_a_variant_with_its_base(tmp_path):
    from jaxrag.pipelines.synthetic.seeds import comparisons_of

    c = _pipeline()
    variant(c, "dpo", "dpo_ipo", **{"train.dpo.loss_type": "ipo"})
    run = tmp_path / "seed_0"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"config": c.to_dict()}))
    study = SimpleNamespace(comparisons=[{"a": "dpo", "b": "sft_react", "label": "DPO vs SFT"}])
    got = comparisons_of(study, [{"workdir": str(run)}])
    assert [(x["a"], x["b"]) for x in got] == [("dpo", "sft_react"), ("grpo_f1_penalty", "grpo"), ("dpo_ipo", "dpo")]


def test_a_variant_stage_trains_beside_its_base(synthetic_run, tmp_path):
    """The variant's stage runs on (a copy of) the tiny pipeline's workdir as its base ran: same data, its own loss
    (IPO), its own model."""
    import shutil

    from jaxrag.pipelines.common import load_checkpoint, model_dir
    from jaxrag.pipelines.synthetic.preference import preference_stage

    workdir = tmp_path / "run"
    shutil.copytree(synthetic_run[1], workdir, ignore=shutil.ignore_patterns(".xla_cache"))
    c = _pipeline()
    variant(c, "dpo", "dpo_ipo", **{"train.dpo.loss_type": "ipo"})
    preference_stage(c, workdir, "dpo_ipo")
    ipo = json.loads((Path(workdir) / "dpo_ipo" / "summary.json").read_text())
    base = json.loads((Path(workdir) / "dpo" / "summary.json").read_text())
    assert ipo["steps"] == base["steps"] == c.dpo.train.steps
    assert ipo["final"]["loss"] != base["final"]["loss"]
    _, p_ipo = load_checkpoint(model_dir(workdir, "dpo_ipo"))
    _, p_dpo = load_checkpoint(model_dir(workdir, "dpo"))
    assert any(not np.array_equal(np.asarray(a), np.asarray(b))
               for a, b in zip(jax.tree.leaves(p_ipo), jax.tree.leaves(p_dpo)))


@pytest.mark.parametrize("path,preset", [("configs/synthetic/pipeline.py", "demo"),
                                         ("configs/synthetic/findings.py", "demo"),
                                         ("configs/synthetic/findings.py", "paired")])
def test_every_trainer_of_the_synthetic_configs_follows_the_seed(path, preset):
    """--config.seed reaches every stage's trainer and RL sampler (the seeds study varies it), the findings'
    copied sections included."""
    c = _load(path, "synthetic_seed_refs").get_config(preset)
    c.seed = 5
    trainers = [s for s in c.stages if "train" in c[s] and "seed" in c[s].train]
    assert len(trainers) >= 6
    assert {s: c[s].train.seed for s in trainers} == {s: 5 for s in trainers}
    assert all(c[s].rl.seed == 5 for s in c.stages if "rl" in c[s])
