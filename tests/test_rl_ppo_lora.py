"""train_rl with PPO (value head, trajectory GAE; reachable with loss = "ppo") and with LoRA (the sampler gets base +
adapters merged after every update; the reference is the base with adapters off)."""

import jax
import numpy as np
from rl_world import QUESTIONS, world

from jaxrag.models import critic_init
from jaxrag.models.lora import merge
from jaxrag.rl import RLConfig, train_rl

RC = RLConfig(steps=2, questions_per_step=2, group_size=4, temperature=1.0, max_new_tokens=4, max_steps=2, k=1, seed=4)
TC = {"seq_buckets": (256,), "optimizer": {"lr": 1e-2}, "progress": False}


def test_ppo_trains_the_policy_and_its_value_head():
    policy, retriever, agent = world(seed=3)
    init = jax.tree.map(np.array, policy.params)
    res = train_rl(policy, retriever, agent, QUESTIONS, "test_ascii", RC, {**TC, "loss": "ppo"})
    head0 = critic_init(policy.cfg, jax.random.split(jax.random.PRNGKey(0))[1])  # split_params' head key
    assert res.head is not None and not np.allclose(res.head["w"], head0["w"])
    assert not np.allclose(res.params["lm_head"], init["lm_head"])
    for m in res.history:
        assert m["ppo/vf_loss"] > 0 and np.isfinite(m["ppo/pg_loss"]) and m["time/scoring_s"] > 0
        assert m["ratio_max_dev"] < 1e-3  # old log-probs are the sampler's, scored by the same params
    assert "adv/abs_mean" not in res.history[0]  # GRPO's group advantages are not used


def test_lora_sampler_gets_the_merged_adapters_every_step():
    policy, retriever, agent = world(seed=3)
    base = jax.tree.map(np.array, policy.params)
    lora = {"enabled": True, "rank": 4, "alpha": 8.0, "targets": ("q", "v")}
    res = train_rl(policy, retriever, agent, QUESTIONS, "test_ascii", RC, {**TC, "loss": "grpo", "lora": lora})
    assert all(m["sync/lora_merge"] == 1.0 for m in res.history)
    assert res.history[0]["kl/k2"] < 1e-9  # adapters start at zero: policy == reference (base, adapters off)
    assert res.history[0]["grad_norm"] > 0 and res.history[1]["kl/k2"] > 0
    want = merge(base, res.adapters, 8.0 / 4)
    sampler = policy.params
    for x, y in zip(jax.tree.leaves(sampler), jax.tree.leaves(want)):
        np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-7)
    assert not np.allclose(sampler["layers"]["wq"], base["layers"]["wq"])
    np.testing.assert_array_equal(sampler["layers"]["wk"], base["layers"]["wk"])  # not a LoRA target
