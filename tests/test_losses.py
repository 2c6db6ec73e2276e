"""Each loss against a direct numpy implementation of its METHODS.md §4 formula on random inputs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrag import losses

RNG = np.random.default_rng(0)


def np_log_sigmoid(x):
    return -np.logaddexp(0.0, -x)


def np_logsoftmax(x):
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def random_mask(b, t, p=0.6, rng=None):
    m = ((rng or RNG).random((b, t)) < p).astype(np.float32)
    m[:, 0] = 0
    m[:, -1] = 1  # every row has at least one action token
    return m


def test_token_and_sequence_logprobs_match_numpy():
    b, t, v = 3, 7, 11
    logits = RNG.normal(size=(b, t, v)).astype(np.float32)
    tokens = RNG.integers(0, v, size=(b, t))
    mask = random_mask(b, t)
    ref = np.zeros((b, t))
    lsm = np_logsoftmax(logits.astype(np.float64))
    for i in range(b):
        for j in range(1, t):
            ref[i, j] = lsm[i, j - 1, tokens[i, j]]
    np.testing.assert_allclose(losses.token_logprobs(logits, tokens), ref, rtol=1e-5, atol=1e-5)
    seq = losses.sequence_logprobs(losses.token_logprobs(logits, tokens), mask)
    np.testing.assert_allclose(seq, (ref * mask).sum(-1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("reduction", ["token", "sequence"])
def test_sft_loss(reduction):
    logp = -RNG.random((4, 9)).astype(np.float32)
    mask = random_mask(4, 9)
    mask[2] = 0  # a row without action tokens
    loss, m = losses.sft_loss(logp, mask, reduction)
    if reduction == "token":
        ref = -(logp * mask).sum() / mask.sum()
    else:
        ref = -(logp * mask).sum(-1)[[0, 1, 3]].mean()
    np.testing.assert_allclose(loss, ref, rtol=1e-6)
    assert float(m["action_tokens"]) == mask.sum()


@pytest.mark.parametrize("loss_type,ls", [("sigmoid", 0.0), ("sigmoid", 0.1), ("ipo", 0.0)])
def test_dpo_loss_matches_formula(loss_type, ls):
    pc, pr, rc, rr = (RNG.normal(size=6).astype(np.float32) * 3 for _ in range(4))
    beta = 0.3
    loss, m = losses.dpo_loss(pc, pr, rc, rr, beta=beta, label_smoothing=ls, loss_type=loss_type)
    h = (pc - rc) - (pr - rr)
    if loss_type == "sigmoid":
        ref = (-(1 - ls) * np_log_sigmoid(beta * h) - ls * np_log_sigmoid(-beta * h)).mean()
    else:
        ref = ((h - 1 / (2 * beta)) ** 2).mean()
    np.testing.assert_allclose(loss, ref, rtol=1e-5)
    np.testing.assert_allclose(m["dpo/reward_margin"], (beta * h).mean(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(m["dpo/accuracy"], (h > 0).mean())


def test_dpo_is_log2_when_policy_equals_reference():
    lp = RNG.normal(size=5).astype(np.float32) * 10
    lr_ = RNG.normal(size=5).astype(np.float32) * 10
    loss, m = losses.dpo_loss(lp, lr_, lp, lr_, beta=0.1)
    np.testing.assert_allclose(loss, np.log(2.0), rtol=1e-6)
    assert float(m["dpo/reward_margin"]) == 0.0


def test_dpo_reference_gets_no_gradient():
    x = jnp.array([1.0, -2.0])
    g = jax.grad(lambda r: losses.dpo_loss(x, -x, r, -r, beta=0.1)[0])(jnp.array([0.5, 0.1]))
    assert np.all(np.asarray(g) == 0)


@pytest.mark.parametrize("c", [0.0, 0.01])
def test_bradley_terry(c):
    a, b = RNG.normal(size=8).astype(np.float32), RNG.normal(size=8).astype(np.float32)
    loss, m = losses.bradley_terry_loss(a, b, center_coef=c)
    ref = (-np_log_sigmoid(a - b) + c * (a + b) ** 2).mean()
    np.testing.assert_allclose(loss, ref, rtol=1e-5)
    np.testing.assert_allclose(m["bt/accuracy"], (a > b).mean())


def test_kl_estimators_match_definitions():
    logp = -RNG.random((3, 5)).astype(np.float32) * 3
    ref = -RNG.random((3, 5)).astype(np.float32) * 3
    d = ref - logp
    np.testing.assert_allclose(losses.kl_penalty(logp, ref, "k1"), -d, rtol=1e-6)
    np.testing.assert_allclose(losses.kl_penalty(logp, ref, "k2"), 0.5 * d**2, rtol=1e-6)
    np.testing.assert_allclose(losses.kl_penalty(logp, ref, "k3"), np.exp(d) - d - 1, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(losses.kl_penalty(logp, ref, "k3", clamp=0.1), np.clip(np.exp(d) - d - 1, -0.1, 0.1), rtol=1e-5)
    with pytest.raises(ValueError, match="k4"):
        losses.kl_penalty(logp, ref, "k4")


def test_kl_estimators_on_categorical_monte_carlo():
    """k1 and k3 are unbiased for KL(π||ref); the expected gradient of k2 equals the exact KL gradient."""
    theta = jnp.array([0.3, -0.5, 1.2, 0.0, -1.0])
    ref_logits = jnp.array([0.0, 0.4, 0.2, -0.3, 0.5])
    ref_logp = jax.nn.log_softmax(ref_logits)

    def exact_kl(th):
        lp = jax.nn.log_softmax(th)
        return jnp.sum(jnp.exp(lp) * (lp - ref_logp))

    n = 400_000
    samples = jax.random.categorical(jax.random.key(0), theta, shape=(n,))

    def mc(th, est):  # samples fixed: the estimator's pathwise gradient, as in the GRPO loss
        lp = jax.nn.log_softmax(th)[samples]
        return jnp.mean(losses.kl_penalty(lp, ref_logp[samples], est))

    kl = float(exact_kl(theta))
    for est in ("k1", "k3"):
        np.testing.assert_allclose(float(mc(theta, est)), kl, rtol=0.03)
    g_exact = np.asarray(jax.grad(exact_kl)(theta))
    g_k2 = np.asarray(jax.grad(mc)(theta, "k2"))
    np.testing.assert_allclose(g_k2, g_exact, atol=0.01)
    # k1's pathwise gradient is the score function's mean (≈ 0), not the KL gradient: the reason k2 exists.
    assert np.abs(np.asarray(jax.grad(mc)(theta, "k1"))).max() < 0.01 < np.abs(g_exact).max()


def np_grpo(logp, old, ref, mask, adv, eps, beta, est, agg):
    ratio = np.exp(logp - old)
    surr = np.minimum(ratio * adv[:, None], np.clip(ratio, 1 - eps, 1 + eps) * adv[:, None])
    d = ref - logp
    kl = {"k1": -d, "k2": 0.5 * d**2, "k3": np.exp(d) - d - 1}[est]
    obj = (surr - beta * kl) * mask
    if agg == "seq_mean_token_mean":
        return -(obj.sum(-1) / mask.sum(-1)).mean()
    if agg == "token_mean":
        return -obj.sum() / mask.sum()
    return -obj.sum() / mask.size


@pytest.mark.parametrize("est", ["k1", "k2", "k3"])
@pytest.mark.parametrize("agg", list(losses.GRPO_AGGREGATIONS))
def test_grpo_loss_matches_numpy(est, agg):
    """Inputs from the test's own generator, not the module's: under pytest-xdist the module generator's state
    depends on which tests a worker ran before (a GPU run under -n 8 once drew inputs whose group advantage was
    near 0). Advantages are checked against a float64 reference with an absolute floor: (r - mean) / std in float32
    cancels where a reward is near its group's mean (2% of draws put a relative error above 1e-5 there)."""
    rng = np.random.default_rng([list(losses.GRPO_AGGREGATIONS).index(agg), ("k1", "k2", "k3").index(est)])
    n, t = 6, 8
    logp = -rng.random((n, t)).astype(np.float32) * 2
    old = logp + rng.normal(size=(n, t)).astype(np.float32) * 0.3
    ref = logp + rng.normal(size=(n, t)).astype(np.float32) * 0.3
    mask = random_mask(n, t, rng=rng)
    rewards = rng.random(n).astype(np.float32)
    adv = np.asarray(losses.group_advantages(rewards, 3))
    r = rewards.reshape(2, 3).astype(np.float64)
    want = ((r - r.mean(1, keepdims=True)) / (r.std(1, ddof=1, keepdims=True) + 1e-4)).ravel()
    np.testing.assert_allclose(adv, want, rtol=1e-5, atol=1e-6)
    loss, m = losses.grpo_loss(logp, old, ref, mask, adv, clip_eps=0.2, beta=0.04, kl_estimator=est, aggregation=agg)
    np.testing.assert_allclose(loss, np_grpo(logp, old, ref, mask, adv, 0.2, 0.04, est, agg), rtol=1e-5, atol=1e-6)
    ratio = np.exp(logp - old)
    clipped = ((ratio < 0.8) & (adv[:, None] < 0)) | ((ratio > 1.2) & (adv[:, None] > 0))
    np.testing.assert_allclose(m["clip_fraction"], (clipped * mask).sum() / mask.sum(), rtol=1e-5)
    d = ref - logp
    np.testing.assert_allclose(m["kl/k2"], (0.5 * d**2 * mask).sum() / mask.sum(), rtol=1e-5)


def test_grpo_identical_rewards_give_zero_policy_gradient():
    n, t = 8, 6
    logp0 = jnp.asarray(-RNG.random((n, t)).astype(np.float32))
    mask = jnp.asarray(random_mask(n, t))
    rewards = jnp.repeat(jnp.array([0.7, 0.2]), 4)  # two groups of 4, constant within each group
    adv = losses.group_advantages(rewards, 4)
    assert np.all(np.asarray(adv) == 0)

    def f(lp):  # on-policy (old = current), reference = current: KL gradient also vanishes
        return losses.grpo_loss(lp, jax.lax.stop_gradient(lp), logp0, mask, adv, beta=0.04)[0]

    assert np.abs(np.asarray(jax.grad(f)(logp0))).max() == 0.0
    g_diff = jax.grad(f)(logp0 + 0.1)  # policy away from the reference: only the KL term pulls
    assert np.abs(np.asarray(g_diff)).max() > 0


def np_gae(r, v, m, gamma, lam):
    b, t = r.shape
    adv = np.zeros((b, t))
    for i in range(b):
        idx = [j for j in range(t) if m[i, j] > 0]
        nxt_v, nxt_a = 0.0, 0.0
        for j in reversed(idx):
            delta = r[i, j] + gamma * nxt_v - v[i, j]
            nxt_a = delta + gamma * lam * nxt_a
            nxt_v = v[i, j]
            adv[i, j] = nxt_a
    return adv


def test_gae_and_ppo_match_numpy():
    b, t = 3, 9
    r, v = RNG.normal(size=(b, t)).astype(np.float32), RNG.normal(size=(b, t)).astype(np.float32)
    m = random_mask(b, t)
    adv, ret = losses.gae(r, v, m, gamma=0.9, lam=0.8)
    ref = np_gae(r, v, m, 0.9, 0.8)
    np.testing.assert_allclose(adv, ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ret, (ref + v) * m, rtol=1e-5, atol=1e-5)

    logp = -RNG.random((b, t)).astype(np.float32)
    old = logp + RNG.normal(size=(b, t)).astype(np.float32) * 0.3
    vals = v + RNG.normal(size=(b, t)).astype(np.float32) * 0.5
    loss, mt = losses.ppo_loss(logp, old, m, ref.astype(np.float32), vals, v, np.asarray(ret), whiten_advantages=False)
    ratio = np.exp(logp - old)
    pg = -np.minimum(ratio * ref, np.clip(ratio, 0.8, 1.2) * ref)
    vc = v + np.clip(vals - v, -0.2, 0.2)
    vf = 0.5 * np.maximum((vals - ret) ** 2, (vc - ret) ** 2)
    expect = (pg * m).sum() / m.sum() + 0.5 * (vf * m).sum() / m.sum()
    np.testing.assert_allclose(loss, expect, rtol=1e-5)


def test_losses_jit():
    f = jax.jit(lambda a, b, c, d: losses.dpo_loss(a, b, c, d, beta=0.1)[0])
    assert np.isfinite(float(f(*(jnp.ones(2) for _ in range(4)))))


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chunked_head_logprobs_equal_the_full_logits_values_and_gradients(temperature):
    # a large vocabulary's log-probs run over checkpointed row chunks (rows not a multiple of the chunk here)
    from jaxrag.models import ModelConfig, init_params
    from jaxrag.models.transformer import logits_from_hidden
    from jaxrag.train.objectives import head_logprobs, sampled_logprobs

    cfg = ModelConfig(vocab_size=96, d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=16, d_ff=64)
    params = init_params(cfg, jax.random.PRNGKey(0))
    tokens = jax.random.randint(jax.random.PRNGKey(1), (3, 11), 0, cfg.vocab_size)
    hidden = jax.random.normal(jax.random.PRNGKey(2), (3, 11, cfg.d_model))

    def full(p, h):
        return sampled_logprobs(logits_from_hidden(cfg, p, h), tokens, temperature)

    def chunked(p, h):  # 7 rows of 96 logits per chunk: 30 rows -> 5 chunks, the last one padded
        return head_logprobs(cfg, p, h, tokens, temperature, max_logits=7 * cfg.vocab_size)

    want, got = full(params, hidden), chunked(params, hidden)
    assert got.shape == (3, 11) and np.all(np.asarray(got[:, 0]) == 0)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    weights = jax.random.normal(jax.random.PRNGKey(3), (3, 11))
    g_want = jax.grad(lambda p, h: jnp.sum(full(p, h) * weights), argnums=(0, 1))(params, hidden)
    g_got = jax.grad(lambda p, h: jnp.sum(chunked(p, h) * weights), argnums=(0, 1))(params, hidden)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), g_got, g_want)


def _dot_operand_dtypes(fn, *args):
    """The operand dtypes of every dot_general in fn's jaxpr, nested jaxprs (scan, custom_vjp) included."""
    from jax.extend.core import jaxprs_in_params

    found = []

    def walk(jaxpr):
        for eqn in jaxpr.eqns:
            if eqn.primitive.name == "dot_general":
                found.append(tuple(str(v.aval.dtype) for v in eqn.invars))
            for sub in jaxprs_in_params(eqn.params):
                walk(sub)

    walk(jax.make_jaxpr(fn)(*args).jaxpr)
    return found


@pytest.mark.parametrize("max_logits", [None, 7 * 96])
def test_bf16_head_backward_runs_every_gemm_in_bf16_close_to_float32(max_logits):
    # the LM head's float32 logits get a bf16 backward (autocast's rule): no float32 GEMM on tensor-core hardware,
    # for the full head and for the chunked one, and gradients within bf16 rounding of the float32 model's
    from jaxrag.models import ModelConfig, init_params
    from jaxrag.train.objectives import MAX_LOGITS, head_logprobs

    cfg = ModelConfig(vocab_size=96, d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=16, d_ff=64,
                      tie_embeddings=True)
    params = init_params(cfg, jax.random.PRNGKey(0))
    tokens = jax.random.randint(jax.random.PRNGKey(1), (3, 11), 0, cfg.vocab_size)
    hidden = jax.random.normal(jax.random.PRNGKey(2), (3, 11, cfg.d_model))
    weights = jax.random.normal(jax.random.PRNGKey(3), (3, 11))

    def loss(p, h, c):
        return jnp.sum(head_logprobs(c, p, h.astype(c.dtype), tokens, 0.7, max_logits or MAX_LOGITS) * weights)

    bf16 = cfg.replace(dtype="bfloat16")
    grad = jax.grad(loss, argnums=(0, 1))
    dots = _dot_operand_dtypes(lambda p, h: grad(p, h, bf16), params, hidden)
    assert dots and all(d == ("bfloat16", "bfloat16") for d in dots), dots
    (gp, gh), (wp, wh) = grad(params, hidden, bf16), grad(params, hidden, cfg)
    for got, want in ((gp["embed"], wp["embed"]), (gh, wh)):
        assert got.dtype == want.dtype == jnp.float32
        assert float(jnp.max(jnp.abs(got - want))) <= 0.02 * float(jnp.max(jnp.abs(want)))


@pytest.mark.parametrize("dtype, max_logits", [("bfloat16", None), ("bfloat16", 7 * 96), ("float32", 7 * 96)])
def test_a_frozen_head_gets_no_weight_gradient_gemm(dtype, max_logits):
    # LoRA trains through a frozen base head: the custom backward rules (bf16 head, chunked head) compute only the
    # hidden states' gradient, as autodiff does, with no [D,V] GEMM; that gradient equals the one taken with w
    from jaxrag.models import ModelConfig, init_params
    from jaxrag.train.objectives import MAX_LOGITS, head_logprobs

    cfg = ModelConfig(vocab_size=96, d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=16, d_ff=64,
                      tie_embeddings=True, dtype=dtype)
    params = init_params(cfg, jax.random.PRNGKey(0))
    tokens = jax.random.randint(jax.random.PRNGKey(1), (3, 11), 0, cfg.vocab_size)
    hidden = jax.random.normal(jax.random.PRNGKey(2), (3, 11, cfg.d_model)).astype(dtype)

    def loss(p, h):
        return jnp.sum(head_logprobs(cfg, p, h, tokens, 1.0, max_logits or MAX_LOGITS))

    h_only = jax.grad(loss, argnums=1)
    shapes = []

    def walk(jaxpr):
        from jax.extend.core import jaxprs_in_params
        for eqn in jaxpr.eqns:
            if eqn.primitive.name == "dot_general":
                shapes.append(tuple(eqn.outvars[0].aval.shape))
            for sub in jaxprs_in_params(eqn.params):
                walk(sub)

    walk(jax.make_jaxpr(h_only)(params, hidden).jaxpr)
    assert shapes and (cfg.d_model, cfg.vocab_size) not in shapes, shapes
    both = jax.grad(loss, argnums=(0, 1))(params, hidden)
    np.testing.assert_array_equal(np.asarray(h_only(params, hidden), np.float32), np.asarray(both[1], np.float32))
    shapes.clear()
    walk(jax.make_jaxpr(jax.grad(loss, argnums=(0, 1)))(params, hidden).jaxpr)
    assert (cfg.d_model, cfg.vocab_size) in shapes   # the trained head's gradient GEMM is there
