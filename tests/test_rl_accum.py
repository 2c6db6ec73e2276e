"""Trainer pieces of online RL: gradient accumulation equals the full batch for the token-mean modes (whole-batch
aggregation weights), and the value head reads the state before each token."""

import jax
import jax.numpy as jnp
import numpy as np

from jaxrag.env.mdp import Action, Episode, Step
from jaxrag.models import ModelConfig, forward, init_params
from jaxrag.rl import rows as R
from jaxrag.train import config as tconfig
from jaxrag.train.objectives import make_score_fn
from jaxrag.train.steps import make_grad_fn

CFG = ModelConfig(model_type="llama", vocab_size=64, d_model=32, n_layers=2, n_heads=2, n_kv_heads=1, head_dim=16,
                  d_ff=64)


def hand_rows():
    """6 episodes (3 questions x 2) of 1-3 actions of different lengths; old/ref log-probs perturbed so that the
    ratio clips and the KL is non-zero."""
    rng = np.random.default_rng(0)
    eps = []
    for e in range(6):
        steps = []
        for _ in range(int(rng.integers(1, 4))):
            n = int(rng.integers(1, 7))
            steps.append(Step(action=Action("query", "q"), prompt_ids=list(rng.integers(1, 64, rng.integers(2, 9))),
                              token_ids=list(rng.integers(1, 64, n)), logprobs=list(rng.normal(-3.0, 0.5, n))))
        eps.append(Episode(qid=f"q{e // 2}", question="", gold=[], steps=steps))
    return R.action_rows(eps), R.group_advantages(eps, list(rng.normal(size=6)), 2)


def hand_batch(aggregation: str):
    rows, adv = hand_rows()
    return R.grpo_batch(rows, adv, aggregation, 16, (16,), row_multiple=4)


def grads_fn(accum: int, aggregation: str = "token_mean"):
    tc = tconfig.resolve({"loss": "grpo", "grad_accum": accum, "batch_size": 8, "sampling_temperature": 0.9,
                          "grpo": {"group_size": 2, "aggregation": aggregation, "beta": 0.04, "clip_eps": 0.2}})
    return jax.jit(make_grad_fn(CFG, tc))


def test_gradient_accumulation_equals_the_full_batch():
    """grads with 4 microbatches == grads of the full batch (1e-5), for token_mean and seq_mean_token_mean weights
    (with token_weight in the batch the compiled step is the same for every aggregation: Σ w·objective)."""
    params = init_params(CFG, jax.random.PRNGKey(0), std=0.3)
    args = ({"model": params}, {"ref": jax.tree.map(lambda x: x * 1.05, params)})
    full_fn, micro_fn = grads_fn(1), grads_fn(4)
    for aggregation in ("token_mean", "seq_mean_token_mean"):
        batch = hand_batch(aggregation)
        full, m = full_fn(*args, batch, jax.random.PRNGKey(0))
        assert float(m["clip_fraction"]) > 0 and float(m["kl/k2"]) > 0  # every term of the loss is in play
        acc, _ = micro_fn(*args, batch, jax.random.PRNGKey(0))
        for x, y in zip(jax.tree.leaves(full), jax.tree.leaves(acc)):
            np.testing.assert_allclose(x, y, atol=1e-5, rtol=1e-4)
    # the weights matter: normalizing token_mean inside each microbatch (rows i, i+4, ...: what a per-microbatch
    # loss does) gives a different gradient; same compiled function, only the weights differ
    batch = hand_batch("token_mean")
    mb = np.arange(batch["tokens"].shape[0]) % 4
    per_mb = np.asarray([batch["loss_mask"][mb == i].sum() for i in range(4)])
    local = dict(batch, token_weight=(batch["loss_mask"] / (4 * per_mb[mb])[:, None]).astype(np.float32))
    full, _ = full_fn(*args, batch, jax.random.PRNGKey(0))
    acc, _ = micro_fn(*args, local, jax.random.PRNGKey(0))
    assert max(float(jnp.max(jnp.abs(x - y))) for x, y in zip(jax.tree.leaves(full), jax.tree.leaves(acc))) > 1e-4


def test_length_groups_sum_to_the_single_batch_gradient():
    """The RL loop's length groups: rows split by sequence bucket (8 and 16 here), each padded to its own bucket;
    with whole-update weights the groups' gradients sum to the gradient of all rows padded together."""
    params = init_params(CFG, jax.random.PRNGKey(0), std=0.3)
    args = ({"model": params}, {"ref": jax.tree.map(lambda x: x * 1.05, params)})
    rows, adv = hand_rows()
    one = R.grpo_batches(rows, adv, "seq_mean_token_mean", 16, (8, 16), by_length=False)
    groups = R.grpo_batches(rows, adv, "seq_mean_token_mean", 16, (8, 16), by_length=True)
    assert len(one) == 1 and [b["tokens"].shape[1] for b in groups] == [8, 16]
    assert sum(b["tokens"].size for b in groups) < one[0]["tokens"].size  # less padding
    fn = grads_fn(1)
    full, _ = fn(*args, one[0], jax.random.PRNGKey(0))
    parts = [fn(*args, b, jax.random.PRNGKey(0))[0] for b in groups]
    summed = jax.tree.map(lambda *g: sum(g), *parts)
    for x, y in zip(jax.tree.leaves(full), jax.tree.leaves(summed)):
        np.testing.assert_allclose(x, y, atol=1e-5, rtol=1e-4)


def test_merged_turns_give_the_per_action_gradient():
    """GRPO rows with an episode's turns merged (each next prompt continues the ids) give the same gradient as one
    row per action: every generated id is scored under the same context, with the same weight."""
    rng = np.random.default_rng(1)
    eps = []
    for e in range(4):
        ids, steps = list(rng.integers(1, 64, 5)), []
        for _ in range(3):
            gen = list(rng.integers(1, 64, int(rng.integers(1, 5))))
            steps.append(Step(action=Action("query", "q"), prompt_ids=list(ids), token_ids=gen,
                              logprobs=list(rng.normal(-3.0, 0.5, len(gen)))))
            ids = ids + gen + list(rng.integers(1, 64, 3))  # the observation the next prompt adds
        eps.append(Episode(qid=f"q{e // 2}", question="", gold=[], steps=steps))
    adv = R.group_advantages(eps, [1.0, 0.0, 0.5, 2.0], 2)
    per_action = R.action_rows(eps)
    merged = R.merge_turns(per_action)
    assert len(per_action) == 12 and len(merged) == 4
    params = init_params(CFG, jax.random.PRNGKey(0), std=0.3)
    args = ({"model": params}, {"ref": jax.tree.map(lambda x: x * 1.05, params)})
    fn = grads_fn(1, "seq_mean_token_mean")
    g_a, m_a = fn(*args, R.grpo_batch(per_action, adv, "seq_mean_token_mean", 16, (32,)), jax.random.PRNGKey(0))
    g_m, m_m = fn(*args, R.grpo_batch(merged, adv, "seq_mean_token_mean", 16, (32,)), jax.random.PRNGKey(0))
    assert float(m_a["clip_fraction"]) > 0 and float(m_a["kl/k2"]) > 0
    np.testing.assert_allclose(float(m_a["loss"]), float(m_m["loss"]), rtol=1e-5)
    for x, y in zip(jax.tree.leaves(g_a), jax.tree.leaves(g_m)):
        np.testing.assert_allclose(x, y, atol=1e-5, rtol=1e-4)


def test_value_head_reads_the_state_before_each_token():
    params = init_params(CFG, jax.random.PRNGKey(1), std=0.3)
    head = {"w": jax.random.normal(jax.random.PRNGKey(2), (CFG.d_model,)), "b": jnp.asarray(0.5)}
    tok = np.asarray(jax.random.randint(jax.random.PRNGKey(3), (2, 8), 1, 64), np.int32)
    batch = {"tokens": tok, "positions": np.tile(np.arange(8, dtype=np.int32), (2, 1)),
             "segment_ids": np.ones((2, 8), np.int32)}
    tc = tconfig.resolve({"loss": "ppo"})
    _, values = jax.jit(make_score_fn(CFG, tc))({"model": params, "head": head}, {}, batch)
    _, hidden = jax.jit(lambda p, t: forward(CFG, p, t, return_hidden=True))(params, tok)
    want = np.asarray(hidden) @ np.asarray(head["w"]) + 0.5
    np.testing.assert_allclose(np.asarray(values)[:, 1:], want[:, :-1], rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(np.asarray(values)[:, 0], 0.0)
