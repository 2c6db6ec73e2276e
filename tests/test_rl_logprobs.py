"""Sampler vs trainer: the trainer's log-probs equal the sampler's for the same ids (T 0.7 over multi-turn rollouts,
T 1.0 over a batched generate call), and the importance ratio is 1 on the first inner step and leaves 1 after it."""

import jax
import numpy as np
import pytest
from rl_world import QUESTIONS, world

from jaxrag.env.rollout import RolloutConfig, rollout
from jaxrag.rl import rows as R
from jaxrag.train import config as tconfig
from jaxrag.train.learner import build
from jaxrag.train.state import init_state, put
from jaxrag.train.objectives import make_score_fn

BUCKETS = (256,)
T_LOW = 0.7


@pytest.fixture(scope="module")
def multi_turn():
    """Episodes of the tiny world sampled at T = 0.7, two actions at most (the second prompt holds the docs)."""
    policy, retriever, agent = world(seed=1)
    items = [q for q in QUESTIONS[:3] for _ in range(2)]
    eps = rollout(policy, retriever, agent, items, RolloutConfig(temperature=T_LOW, max_new_tokens=6, max_steps=2,
                                                                  k=1, batch_size=len(items), seed=3))
    rows = R.action_rows(eps)
    assert len(rows) > len(eps)  # some episodes took two actions
    assert any("doc:" in ep.steps[1].prompt for ep in eps if len(ep.steps) > 1)
    return policy, eps, rows


def scored(policy, rows, temperature):
    batch = R.pack(rows, BUCKETS)
    tc = tconfig.resolve({"loss": "grpo", "sampling_temperature": temperature})
    logp, values = jax.jit(make_score_fn(policy.cfg, tc))({"model": policy.params}, {}, batch)
    assert values is None
    mask = batch["loss_mask"] > 0
    assert mask.sum() == sum(len(r.completion) for r in rows)
    return np.asarray(logp)[mask], batch["old_logp"][mask]


def test_trainer_logprobs_equal_the_samplers_at_temperature_07(multi_turn):
    policy, _, rows = multi_turn
    trainer, sampler = scored(policy, rows, T_LOW)
    np.testing.assert_allclose(trainer, sampler, atol=2e-4)
    # the sampler recorded log_softmax(logits / 0.7): scored at T = 1 the values are different
    at_one, _ = scored(policy, rows, 1.0)
    assert np.max(np.abs(at_one - sampler)) > 0.05


def test_trainer_logprobs_equal_the_samplers_at_temperature_1():
    policy, _, _ = world(seed=2)
    prompts = [f"question: who is number {i}?\n" for i in range(4)]
    outs = policy.generate(prompts, n=2, temperature=1.0, max_new_tokens=8, seed=5)
    rows = [R.Row(i, j, c.prompt_ids, c.token_ids, c.logprobs) for i, out in enumerate(outs) for j, c in enumerate(out)]
    assert all(r.prompt == policy.encode_prompt(prompts[r.episode], 8) for r in rows)
    trainer, sampler = scored(policy, rows, 1.0)
    np.testing.assert_allclose(trainer, sampler, atol=2e-4)


def test_ratio_is_one_on_the_first_inner_step_only(multi_turn):
    policy, eps, rows = multi_turn
    tc = tconfig.resolve({"loss": "grpo", "sampling_temperature": T_LOW, "seq_buckets": BUCKETS, "batch_size": 6,
                          "grpo": {"group_size": 2, "aggregation": "token_mean"}, "optimizer": {"lr": 1e-2},
                          "progress": False})
    tr = build(policy.cfg, policy.params, tc)
    state = init_state(put(tr.trainable, tr.state_sh["trainable"]), tr.tx, 0, tr.state_sh)
    frozen = put(tr.frozen, tr.frozen_sh)
    adv = R.group_advantages(eps, [float(len(e.steps)) + 0.1 * i for i, e in enumerate(eps)], 2)
    batch = R.grpo_batch(rows, adv, "token_mean", 0, BUCKETS)
    state, m1 = tr.step_fn(state, frozen, batch)
    state, m2 = tr.step_fn(state, frozen, batch)
    assert float(m1["ratio_max_dev"]) < 1e-3  # the trainer sees what the sampler saw
    assert float(m1["kl/k2"]) < 1e-9  # policy == reference before the first update
    assert float(m2["ratio_max_dev"]) > 1e-2  # after one update the importance ratio is live
    assert float(m2["kl/k2"]) > 0 and float(m2["kl/k3"]) > 0
