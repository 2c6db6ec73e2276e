"""The synthetic configs are checked before any stage runs: typos in stage references, agents, splits and eval
systems fail at once with the key named (jaxrag/pipelines/synthetic/checks.py via jaxrag.main.plan)."""

import importlib.util
from pathlib import Path

import pytest

from jaxrag.main import StageError, plan, run

ROOT = Path(__file__).resolve().parents[1]


def load(preset="demo"):
    spec = importlib.util.spec_from_file_location("findings_cfg", ROOT / "configs" / "synthetic" / "findings.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.get_config(preset)


@pytest.mark.parametrize("preset", ["demo", "tiny"])
def test_shipped_configs_pass(preset):
    c = load(preset)
    assert [n for n, _ in plan(c)] == list(c.stages)


def test_agent_aliases_that_get_agent_takes_pass():
    c = load("tiny")
    c.eval_findings.systems[0]["agent"] = "Re²Search"  # get_agent's alias of re2search
    c.sft_re2search.agent = "re2-search"
    assert [n for n, _ in plan(c)] == list(c.stages)


@pytest.mark.parametrize("edit, message", [
    (lambda c: c.eval.systems[2].update(dict(agent="reactt")),
     r"config.eval.systems\[2\].agent: unknown agent 'reactt' \(known: .*react"),
    (lambda c: c.eval.systems[3].update(dict(model="outcom")),
     r"config.eval.systems\[3\].model: 'outcom' is not a stage of this config"),
    (lambda c: c.eval.systems[5].update(dict(n=0)), r"config.eval.systems\[5\].n: a critic system needs n >= 1"),
    (lambda c: c.eval.systems[1].update(dict(name="no_retrieval")),
     r"config.eval.systems\[1\]: duplicate system name 'no_retrieval'"),
    (lambda c: c.eval.update(dict(splits=("test", "heldot"))), r"config.eval.splits\[1\]: unknown split 'heldot'"),
    (lambda c: c.dpo.update(dict(init="sftt")), r"config.dpo.init: 'sftt' is not a stage"),
    (lambda c: c.supervision.update(dict(policy="grpo")),
     r"config.supervision.policy: stage 'grpo' runs after 'supervision'"),
    (lambda c: c.sft.update(dict(agent="re2serch")), r"config.sft.agent: unknown agent 're2serch'"),
    (lambda c: c.bestofn_transfer.update(dict(critic="critc")), r"config.bestofn_transfer.critic: 'critc' is not"),
    (lambda c: c.sampler.update(dict(min_row=8)), r"config.sampler.min_row: unknown key \(known: min_rows, min_prompt"),
    (lambda c: c.sampler.update(dict(min_prompt=0)), r"config.sampler.min_prompt: 0 must be an integer >= 1"),
])
def test_typos_fail_before_compute_naming_the_key(tmp_path, edit, message):
    c = load("tiny")
    edit(c)
    with pytest.raises(StageError, match=message):
        run(c, tmp_path)
    assert not (tmp_path / "world").exists()  # nothing ran
