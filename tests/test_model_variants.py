"""dtype policy, remat, and the critic head."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrag.models import ConfigError, ModelConfig, critic_init, critic_scores, forward, forward_hidden, init_params

CFG = ModelConfig(vocab_size=97, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=64, max_seq_len=64)
TOKENS = jax.random.randint(jax.random.PRNGKey(1), (3, 10), 0, 97)


def test_bf16_compute_keeps_fp32_logits_and_stays_close():
    params = init_params(CFG, jax.random.PRNGKey(0), std=0.1)
    ref = forward(CFG, params, TOKENS)
    bf = forward(CFG.replace(dtype="bfloat16"), params, TOKENS)
    assert ref.dtype == bf.dtype == jnp.float32
    assert float(jnp.abs(ref - bf).max()) < 0.05 * float(jnp.abs(ref).max())
    p16 = init_params(CFG.replace(param_dtype="bfloat16"), jax.random.PRNGKey(0))
    assert all(a.dtype == jnp.bfloat16 for a in jax.tree.leaves(p16))


def test_remat_gives_identical_values_and_gradients():
    params = init_params(CFG, jax.random.PRNGKey(0))

    def loss(p, remat):
        return forward(CFG, p, TOKENS, remat=remat).mean()

    g0 = jax.grad(loss)(params, False)
    g1 = jax.grad(loss)(params, True)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6), g0, g1)


def test_critic_reads_the_hidden_state_at_the_given_index():
    params = init_params(CFG, jax.random.PRNGKey(0))
    head = critic_init(CFG, jax.random.PRNGKey(2))
    read = jnp.array([9, 4, 0])
    scores = critic_scores(CFG, params, head, TOKENS, read_index=read)
    hidden = forward_hidden(CFG, params, TOKENS)
    want = np.array([hidden[i, int(r)] @ head["w"] + head["b"] for i, r in enumerate(read)])
    assert scores.shape == (3,)
    np.testing.assert_allclose(scores, want, atol=1e-5)
    # tokens after the read index do not change the score (causal)
    changed = TOKENS.at[1, 5:].set(0)
    np.testing.assert_allclose(critic_scores(CFG, params, head, changed, read_index=read)[1], scores[1], atol=1e-5)


def _dot_precisions(cfg):
    params = init_params(cfg, jax.random.PRNGKey(0))
    text = jax.jit(lambda p, t: forward(cfg, p, t)).lower(params, TOKENS).as_text()
    dots = re.findall(r"stablehlo.dot_general.*", text)
    return len(dots), [re.search(r"precision = \[(\w+), (\w+)\]", d).groups() for d in dots]


def test_matmul_precision_is_full_for_fp32_and_default_for_bf16_unless_configured():
    # every projection, attention product and the LM head: (q,k,v,o, 2 attn, gate,up,down) + head;
    # the xla attention path (on a GPU "auto" gives bf16 attention to cuDNN, whose products are no dot_general);
    # the layers scanned (the scan body's 9 dots once; on a GPU, scan_layers=None unrolls them)
    for cfg, want in [(CFG, "HIGHEST"), (CFG.replace(dtype="bfloat16"), "DEFAULT"),
                      (CFG.replace(precision="high"), "HIGH"), (CFG.replace(dtype="bfloat16", precision="highest"), "HIGHEST")]:
        n, precisions = _dot_precisions(cfg.replace(attention_impl="xla", scan_layers=True))
        assert n == 10 and set(precisions) == {(want, want)}, (cfg.dtype, cfg.precision, precisions)
    with pytest.raises(ConfigError, match="precision='tf32'"):
        CFG.replace(precision="tf32")
