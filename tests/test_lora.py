"""LoRA: zero-init adapters leave the model unchanged, the delta is A@B·scale, merge/export round-trips via HF."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrag.models import ModelConfig, forward, init_params, load_hf
from jaxrag.models.lora import apply_lora, export_merged_hf, init_lora, lora_logical_axes, lora_shapes

CFG = ModelConfig(model_type="llama", vocab_size=128, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, d_ff=128)
ALL = ("q", "k", "v", "o", "gate", "up", "down")


def test_shapes_and_axes_cover_every_target():
    s = lora_shapes(CFG, ALL, 4)
    assert s["wq"] == {"a": (2, 64, 4), "b": (2, 4, 4, 16)}
    assert s["wo"] == {"a": (2, 4, 16, 4), "b": (2, 4, 64)}
    assert s["w_down"] == {"a": (2, 128, 4), "b": (2, 4, 64)}
    ad = init_lora(CFG, jax.random.PRNGKey(0), ALL, 4)
    axes = lora_logical_axes(CFG, ad)
    for name in ad:
        for part in ("a", "b"):
            assert len(axes[name][part]) == ad[name][part].ndim


def test_zero_b_is_identity_and_delta_matches_numpy():
    params = init_params(CFG, jax.random.PRNGKey(0))
    ad = init_lora(CFG, jax.random.PRNGKey(1), ALL, 4)
    tokens = jnp.arange(12).reshape(2, 6)
    np.testing.assert_array_equal(forward(CFG, apply_lora(params, ad, 2.0), tokens), forward(CFG, params, tokens))
    ad["wo"]["b"] = jax.random.normal(jax.random.PRNGKey(2), ad["wo"]["b"].shape)
    out = apply_lora(params, ad, 2.0)
    a, b = np.asarray(ad["wo"]["a"]), np.asarray(ad["wo"]["b"])
    expect = np.asarray(params["layers"]["wo"]) + 2.0 * np.einsum("lhdr,lre->lhde", a, b)
    np.testing.assert_allclose(out["layers"]["wo"], expect, rtol=1e-5, atol=1e-6)
    assert out["layers"]["wq"] is not params["layers"]["wq"]  # base untouched: a new tree
    np.testing.assert_array_equal(params["layers"]["wo"], init_params(CFG, jax.random.PRNGKey(0))["layers"]["wo"])


def test_gradient_reaches_only_adapters():
    params = init_params(CFG, jax.random.PRNGKey(0))
    ad = init_lora(CFG, jax.random.PRNGKey(1), ("q", "v"), 4)
    tokens = jnp.arange(12).reshape(2, 6)
    g = jax.grad(lambda a: jnp.sum(forward(CFG, apply_lora(params, a, 1.0), tokens) ** 2))(ad)
    assert set(g) == {"wq", "wv"}
    assert float(jnp.abs(g["wq"]["b"]).max()) > 0  # B gets gradient at B=0; A does not yet
    assert float(jnp.abs(g["wq"]["a"]).max()) == 0


def test_dropout_changes_output_only_when_on():
    params = init_params(CFG, jax.random.PRNGKey(0))
    ad = init_lora(CFG, jax.random.PRNGKey(1), ("q",), 4)
    ad["wq"]["b"] = jnp.ones_like(ad["wq"]["b"])
    a = apply_lora(params, ad, 1.0, dropout=0.5, rng=jax.random.PRNGKey(3))["layers"]["wq"]
    b = apply_lora(params, ad, 1.0)["layers"]["wq"]
    assert not np.allclose(a, b)


def test_unknown_target_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown LoRA targets"):
        init_lora(CFG, jax.random.PRNGKey(0), ("q", "qkv"), 4)


def test_merge_and_export_roundtrip(tmp_path):
    params = init_params(CFG, jax.random.PRNGKey(0))
    ad = init_lora(CFG, jax.random.PRNGKey(1), ("q", "k", "v"), 4)
    ad = jax.tree.map(lambda x: x + 0.01, ad)
    export_merged_hf(CFG, params, ad, 2.0, tmp_path / "m")
    cfg2, loaded = load_hf(tmp_path / "m")
    tokens = jnp.arange(12).reshape(2, 6)
    np.testing.assert_allclose(forward(cfg2, loaded, tokens), forward(CFG, apply_lora(params, ad, 2.0), tokens), rtol=1e-4, atol=1e-5)
