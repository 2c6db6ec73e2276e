"""docs/ablations.md's recipe, executed: its SimPO and KTO blocks, written to files outside the package, are losses
that `train.loss = "my_losses:simpo"` / `"my_kto:kto"` selects; each equals its formula, trains alike on flat pairs
and on their prefix tree, and runs as configs/train_dpo.py's DPO stage with one config line. Bad names fail in one
line."""

import os
import re
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrag.env.mdp import ANSWER, QUERY, Action, Doc, Step
from jaxrag.models import ModelConfig, init_params
from jaxrag.models import transformer as tf
from jaxrag.train import config as tconfig
from jaxrag.train import objectives
from jaxrag.train import prefix_tree as PT
from jaxrag.train.batching import PreferencePair, pair_batch
from jaxrag.train.steps import make_grad_fn

ROOT = Path(__file__).resolve().parents[1]
CFG = ModelConfig(model_type="llama", vocab_size=64, d_model=32, n_layers=2, n_heads=2, n_kv_heads=1, head_dim=16,
                  d_ff=64)


def recipe(which: int = 0) -> str:
    """The doc's python blocks: 0 the SimPO loss (my_losses.py), 1 the KTO loss on pairs (my_kto.py), 2 the variant
    config (my_ablation.py), 3 KTO on labelled completions (my_kto_unpaired.py), 4 a KL estimator (my_kl.py), 5 an
    agent design (my_agents.py)."""
    text = (ROOT / "docs" / "ablations.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(blocks) == 6
    return blocks[which]


MODULES = ("my_losses", "my_kto", "my_kto_unpaired", "my_kl", "my_agents")


@pytest.fixture
def my_losses(tmp_path, monkeypatch):
    (tmp_path / "my_losses.py").write_text(recipe(0))
    (tmp_path / "my_kto.py").write_text(recipe(1))
    (tmp_path / "my_kto_unpaired.py").write_text(recipe(3))
    (tmp_path / "my_kl.py").write_text(recipe(4))
    (tmp_path / "my_agents.py").write_text(recipe(5))
    monkeypatch.syspath_prepend(str(tmp_path))
    for m in MODULES:
        sys.modules.pop(m, None)
    yield tmp_path
    for m in MODULES:
        sys.modules.pop(m, None)


def pairs(rng):
    out = []
    for _ in range(3):
        prompt = list(rng.integers(3, 64, 10))
        for _ in range(2):
            head = list(rng.integers(3, 64, 2))
            out.append(PreferencePair(prompt, head + list(rng.integers(3, 64, 3)),
                                      head + list(rng.integers(3, 64, int(rng.integers(1, 6))))))
    return out


def test_simpo_is_its_formula_and_its_options_are_checked(my_losses):
    tc = tconfig.resolve({"loss": "my_losses:simpo", "batch_size": 6, "loss_opts": {"gamma": 0.5}})
    assert objectives.loss_options(tc) == {"beta": 2.0, "gamma": 0.5}
    assert not objectives.objective(tc).needs_ref(tc) and objectives.objective(tc).layout == "pairs"
    params = init_params(CFG, jax.random.PRNGKey(0), std=0.3)
    ps = pairs(np.random.default_rng(0))
    batch = pair_batch(ps, (32,))
    loss, m = objectives.make_loss_fn(CFG, tc)({"model": params}, {}, batch, jax.random.PRNGKey(0))
    # by hand: each completion's token log-probs from the model's logits, averaged, then the SimPO margin
    want = []
    for p in ps:
        avg = []
        for c in (p.chosen, p.rejected):
            tokens = jnp.asarray([p.prompt + c])
            logits = tf.forward(CFG, params, tokens)[0]
            logp = jax.nn.log_softmax(logits[:-1].astype(jnp.float32), axis=-1)
            picked = logp[jnp.arange(len(p.prompt) + len(c) - 1), tokens[0, 1:]][len(p.prompt) - 1:]
            avg.append(float(picked.mean()))
        margin = 2.0 * (avg[0] - avg[1]) - 0.5
        want.append(-np.log(1 / (1 + np.exp(-margin))))
    np.testing.assert_allclose(float(loss), np.mean(want), rtol=1e-4)
    assert float(m["simpo/accuracy"]) == pytest.approx(np.mean(np.array(want) < np.log(2)))
    with pytest.raises(ValueError, match=r"train config: loss_opts.gama: not a setting of loss 'my_losses:simpo' "
                                         r"\(its settings: beta, gamma\)"):
        tconfig.resolve({"loss": "my_losses:simpo", "loss_opts": {"gama": 0.5}})


def test_simpo_trains_alike_on_flat_pairs_and_their_prefix_tree(my_losses):
    ps = pairs(np.random.default_rng(5))
    params = {"model": init_params(CFG, jax.random.PRNGKey(0), std=0.3)}
    grads = {}
    for accum in (1, 2):
        tc = tconfig.resolve({"loss": "my_losses:simpo", "batch_size": 6, "grad_accum": accum})
        grads[accum] = jax.jit(make_grad_fn(CFG, tc))
    g_r, m_r = grads[1](params, {}, pair_batch(ps, (32,)), jax.random.PRNGKey(0))
    for accum, length, multiple in ((1, 128, 1), (2, 32, 2)):
        b = PT.pair_batch_auto(ps, (length,), CFG, "tree", pack_multiple=multiple)
        g_t, m_t = grads[accum](params, {}, b, jax.random.PRNGKey(0))
        for k in ("loss", "simpo/margin", "simpo/accuracy"):
            np.testing.assert_allclose(float(m_t[k]), float(m_r[k]), rtol=1e-5, atol=1e-6)
        for x, y in zip(jax.tree.leaves(g_t), jax.tree.leaves(g_r)):
            np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-4, atol=1e-5)


def seq_logps(params, p):
    """(chosen, rejected) completion log-prob sums of pair p, from the model's logits by hand."""
    out = []
    for c in (p.chosen, p.rejected):
        tokens = jnp.asarray([p.prompt + c])
        logp = jax.nn.log_softmax(tf.forward(CFG, params, tokens)[0][:-1].astype(jnp.float32), axis=-1)
        out.append(float(logp[jnp.arange(tokens.shape[1] - 1), tokens[0, 1:]][len(p.prompt) - 1:].sum()))
    return out


def test_kto_is_its_formula_with_the_batch_reference_point(my_losses):
    tc = tconfig.resolve({"loss": "my_kto:kto", "batch_size": 6, "loss_opts": {"beta": 0.5, "undesirable_weight": 2.0}})
    assert objectives.objective(tc).needs_ref(tc) and objectives.objective(tc).layout == "pairs"
    policy, ref = (init_params(CFG, jax.random.PRNGKey(i), std=0.3) for i in (0, 1))
    ps = pairs(np.random.default_rng(1))
    loss, m = objectives.make_loss_fn(CFG, tc)({"model": policy}, {"ref": ref}, pair_batch(ps, (32,)),
                                               jax.random.PRNGKey(0))
    r = np.array([seq_logps(policy, p) for p in ps]) - np.array([seq_logps(ref, p) for p in ps])
    z = max(0.0, r.mean())
    sig = lambda x: 1 / (1 + np.exp(-x))
    want = np.mean((1 - sig(0.5 * (r[:, 0] - z)) + 2.0 * (1 - sig(0.5 * (z - r[:, 1])))) / 2)
    np.testing.assert_allclose(float(loss), want, rtol=1e-4)
    np.testing.assert_allclose(float(m["kto/z"]), z, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(float(m["kto/chosen_reward"]), r[:, 0].mean(), rtol=1e-4, atol=1e-5)


def test_kto_trains_alike_on_flat_pairs_and_their_prefix_tree(my_losses):
    ps = pairs(np.random.default_rng(6))
    params = {"model": init_params(CFG, jax.random.PRNGKey(0), std=0.3)}
    frozen = {"ref": init_params(CFG, jax.random.PRNGKey(1), std=0.3)}
    grad = jax.jit(make_grad_fn(CFG, tconfig.resolve({"loss": "my_kto:kto", "batch_size": 6})))
    g_r, m_r = grad(params, frozen, pair_batch(ps, (32,)), jax.random.PRNGKey(0))
    g_t, m_t = grad(params, frozen, PT.pair_batch_auto(ps, (128,), CFG, "tree"), jax.random.PRNGKey(0))
    for k in ("loss", "kto/z", "kto/chosen_reward", "kto/rejected_reward"):
        np.testing.assert_allclose(float(m_t[k]), float(m_r[k]), rtol=1e-5, atol=1e-6)
    for x, y in zip(jax.tree.leaves(g_t), jax.tree.leaves(g_r)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-4, atol=1e-5)


def test_unpaired_kto_is_its_formula_on_labelled_rows(my_losses):
    """The labeled layout: rows of unequal length with a label each; the loss is KTO's per-row formula with the
    batch's mean implied reward as the reference point, from the model's logits by hand; its gradients equal those
    of two microbatches (grad_accum 2) only up to z, so the check is on one batch."""
    from jaxrag.train.batching import LabeledExample, labeled_batch

    tc = tconfig.resolve({"loss": "my_kto_unpaired:kto", "batch_size": 5,
                          "loss_opts": {"beta": 0.5, "desirable_weight": 1.5}})
    obj = objectives.objective(tc)
    assert obj.needs_ref(tc) and obj.layout == "labeled"
    rng = np.random.default_rng(2)
    rows = [LabeledExample(list(rng.integers(3, 64, 8)), list(rng.integers(3, 64, int(rng.integers(1, 7)))), lab)
            for lab in (1.0, 0.0, 1.0, 1.0, 0.0)]
    policy, ref = (init_params(CFG, jax.random.PRNGKey(i), std=0.3) for i in (0, 1))
    batch = labeled_batch(rows, (32,))
    assert batch["labels"].tolist() == [1.0, 0.0, 1.0, 1.0, 0.0] and batch["tokens"].shape == (5, 32)
    loss, m = objectives.make_loss_fn(CFG, tc)({"model": policy}, {"ref": ref}, batch, jax.random.PRNGKey(0))

    def logp(params, e):
        tokens = jnp.asarray([e.prompt + e.completion])
        lp = jax.nn.log_softmax(tf.forward(CFG, params, tokens)[0][:-1].astype(jnp.float32), axis=-1)
        return float(lp[jnp.arange(tokens.shape[1] - 1), tokens[0, 1:]][len(e.prompt) - 1:].sum())

    r = np.array([logp(policy, e) - logp(ref, e) for e in rows])
    z = max(0.0, r.mean())
    sig = lambda x: 1 / (1 + np.exp(-x))
    lab = np.array([e.label for e in rows])
    want = np.mean(lab * 1.5 * (1 - sig(0.5 * (r - z))) + (1 - lab) * (1 - sig(0.5 * (z - r))))
    np.testing.assert_allclose(float(loss), want, rtol=1e-4)
    np.testing.assert_allclose(float(m["kto/z"]), z, rtol=1e-4, atol=1e-6)
    assert float(m["kto/desirable_share"]) == pytest.approx(0.6)


def test_labeled_records_are_read_and_bad_labels_named(tmp_path):
    from jaxrag.pipelines.train import DataError, load_examples

    f = tmp_path / "l.jsonl"
    f.write_text('{"prompt_ids": [1, 5], "completion_ids": [7], "label": true}\n'
                 '{"prompt_ids": [1, 6], "completion_ids": [8, 9], "label": 0}\n')
    ex = load_examples("labeled", f)
    assert [(e.prompt, e.completion, e.label) for e in ex] == [([1, 5], [7], 1.0), ([1, 6], [8, 9], 0.0)]
    f.write_text('{"prompt_ids": [1, 5], "completion_ids": [7], "label": "good"}\n')
    with pytest.raises(DataError, match=r"l.jsonl:1: 'label' must be true / false \(or 1 / 0\), got 'good'"):
        load_examples("labeled", f)


def test_a_kl_estimator_of_ones_own_is_named_by_module_and_function(my_losses):
    from jaxrag import losses

    logp, ref = jnp.asarray([[-1.0, -2.0, -0.5]]), jnp.asarray([[-1.5, 0.5, -0.5]])
    d = np.asarray(ref - logp)
    np.testing.assert_allclose(np.asarray(losses.kl_penalty(logp, ref, "my_kl:k3_capped")),
                               np.minimum(np.exp(d) - d - 1.0, 10.0), rtol=1e-6)
    assert tconfig.resolve({"loss": "grpo", "grpo": {"kl_estimator": "my_kl:k3_capped"}}).grpo.kl_estimator == \
        "my_kl:k3_capped"
    with pytest.raises(ValueError, match=r"train config: grpo.kl_estimator: module 'my_kl' has no KL estimator "
                                         r"function 'k4'"):
        tconfig.resolve({"loss": "grpo", "grpo": {"kl_estimator": "my_kl:k4"}})
    with pytest.raises(ValueError, match=r"train config: grpo.kl_estimator: 'k5' is not one of"):
        tconfig.resolve({"loss": "grpo", "grpo": {"kl_estimator": "k5"}})


def test_an_agent_design_of_ones_own_renders_the_sft_data(my_losses):
    """The doc's agent, named "module:Class": the synthetic SFT data is rendered its way (only the latest search's
    documents in each prompt), the config checks accept it, and a wrong name fails in one line."""
    from jaxrag.data.synthetic.sft_data import step_pairs
    from jaxrag.env.agents import agent_module, get_agent
    from jaxrag.env.mdp import Episode

    agent = get_agent("my_agents:LastDocsReAct", mode="plain")
    plain = get_agent("react", mode="plain")
    steps = [Step(Action(QUERY, f"q{i}", f"search: q{i}"), docs=[Doc(f"d{i}", f"Title{i}", f"text{i}")])
             for i in range(2)] + [Step(Action(ANSWER, "x", "answer: x"))]
    ep = Episode(qid="e", question="who?", gold=["x"], steps=steps)
    mine, base = step_pairs(ep, agent), step_pairs(ep, plain)
    assert [t for _, t in mine] == [t for _, t in base]
    assert "text0" in base[2][0] and "text0" not in mine[2][0] and "text1" in mine[2][0] and "q0" in mine[2][0]
    assert mine[:2] == base[:2]   # one search or none: nothing to drop
    assert agent_module("my_agents:LastDocsReAct") == "my_agents:LastDocsReAct"
    with pytest.raises(KeyError, match=r"module 'my_agents' has no Agent class 'Nope'"):
        agent_module("my_agents:Nope")


def test_bad_loss_names_are_one_line():
    with pytest.raises(ValueError, match=r"train config: loss: 'dpoo' is not one of \('sft', 'dpo', 'bt', 'grpo', "
                                         r"'ppo'\) or 'module.path:attribute'"):
        tconfig.resolve({"loss": "dpoo"})
    with pytest.raises(ValueError, match="cannot import module 'no_such_module'"):
        tconfig.resolve({"loss": "no_such_module:simpo"})
    with pytest.raises(ValueError, match="module 'jaxrag.losses' has no Objective 'dpo_loss'"):
        tconfig.resolve({"loss": "jaxrag.losses:dpo_loss"})


@pytest.mark.parametrize("loss,metric,flags", [("my_losses:simpo", "simpo/margin", []), ("my_kto:kto", "kto/z", []),
                                               ("my_kto_unpaired:kto", "kto/desirable_share",
                                                ["--config.dpo.data=data/labeled.jsonl"])])
def test_one_config_line_trains_it_in_train_dpo(my_losses, tmp_path, loss, metric, flags):
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": os.pathsep.join([str(ROOT), str(my_losses)])}
    wd = tmp_path / "wd"
    r = subprocess.run([sys.executable, "-m", "jaxrag.main", "--config=configs/train_dpo.py", f"--workdir={wd}",
                        f"--config.dpo.train.loss={loss}", *flags], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    from jaxrag.train.metrics_log import read_metrics

    rows = read_metrics(wd / "dpo" / "metrics.jsonl")
    assert len(rows) == 10 and all(metric in m and "dpo/reward_margin" not in m for m in rows.values())
    assert (wd / "dpo" / "DONE").exists()


def test_the_variant_block_adds_simpo_beside_dpo_as_a_system_and_a_seeds_pair(my_losses):
    """The doc's second block, my_ablation.py, run from the repository root as jaxrag.main runs a config: the demo
    with a `simpo` stage after `dpo`, trained with the SimPO loss, evaluated and paired with `dpo`."""
    (my_losses / "my_ablation.py").write_text(recipe(2))
    code = ("import json, my_ablation; from jaxrag.train import objectives; c = my_ablation.get_config('tiny'); "
            "print(json.dumps({'stages': list(c.stages), 'loss': c.simpo.train.loss, "
            "'layout': objectives.get(c.simpo.train.loss).layout, 'systems': [s['name'] for s in c.eval.systems], "
            "'pairs': [[p['a'], p['b']] for p in c.study_pairs]}))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(my_losses), str(ROOT)])}
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    import json

    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["stages"][got["stages"].index("dpo") + 1] == "simpo"
    assert (got["loss"], got["layout"]) == ("my_losses:simpo", "pairs")
    assert "simpo" in got["systems"] and got["pairs"][-1] == ["simpo", "dpo"]
    assert got["pairs"][:-1] == [["grpo_f1_penalty", "grpo"]]   # the demo's own variant
