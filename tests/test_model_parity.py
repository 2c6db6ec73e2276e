"""The JAX model against transformers/PyTorch on tiny random checkpoints (fp32)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from jaxrag.sampling import SamplingParams, sample
from jaxrag.models import (forward, forward_cached, init_cache, load_hf, param_logical_axes, save_hf)

ATOL = 1e-4


def _ragged_batch(seed=0, lengths=(13, 7, 10)):
    rng = np.random.RandomState(seed)
    return [rng.randint(3, 256, size=n).tolist() for n in lengths]


def _hf_logits(model, ids, mask, positions):
    with torch.no_grad():
        out = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                    position_ids=torch.tensor(positions))
    return out.logits.numpy()


@pytest.mark.parametrize("padding", ["right", "left"])
def test_logits_match_transformers_on_padded_batch(hf_checkpoint, padding):
    kind, model, path = hf_checkpoint
    cfg, params = load_hf(path)
    seqs = _ragged_batch()
    T = max(map(len, seqs))
    ids = np.zeros((len(seqs), T), np.int64)
    seg = np.zeros((len(seqs), T), np.int32)
    for i, s in enumerate(seqs):
        sl = slice(0, len(s)) if padding == "right" else slice(T - len(s), T)
        ids[i, sl], seg[i, sl] = s, 1
    pos = np.maximum(np.cumsum(seg, 1) - 1, 0)
    ref = _hf_logits(model, ids, seg, pos)
    ours = np.asarray(forward(cfg, params, jnp.asarray(ids), jnp.asarray(pos), jnp.asarray(seg)))
    valid = seg.astype(bool)
    assert ours.dtype == np.float32
    err = np.abs(ours[valid] - ref[valid]).max()
    assert err <= ATOL, f"{kind}: max |logit diff| {err}"


def test_packed_segments_equal_separate_rows(hf_checkpoint):
    _, _, path = hf_checkpoint
    cfg, params = load_hf(path)
    a, b = _ragged_batch(1, (9, 6))
    packed = np.array([a + b])
    seg = np.array([[1] * len(a) + [2] * len(b)])
    pos = np.array([list(range(len(a))) + list(range(len(b)))])
    out = np.asarray(forward(cfg, params, jnp.asarray(packed), jnp.asarray(pos), jnp.asarray(seg)))[0]
    alone_a = np.asarray(forward(cfg, params, jnp.asarray([a])))[0]
    alone_b = np.asarray(forward(cfg, params, jnp.asarray([b])))[0]
    np.testing.assert_allclose(out[: len(a)], alone_a, atol=1e-5)
    np.testing.assert_allclose(out[len(a):], alone_b, atol=1e-5)


def test_greedy_generation_matches_transformers_generate(hf_checkpoint):
    kind, model, path = hf_checkpoint
    cfg, params = load_hf(path)
    prompts = [[1] + p for p in _ragged_batch(2, (5, 11, 8))]
    out = sample(cfg.replace(eos_ids=()), params, prompts, SamplingParams(max_new_tokens=20), jax.random.PRNGKey(0))
    for i, p in enumerate(prompts):
        with torch.no_grad():
            ref = model.generate(torch.tensor([p]), max_new_tokens=20, do_sample=False, eos_token_id=None,
                                 pad_token_id=0, attention_mask=torch.ones(1, len(p), dtype=torch.long))
        ref_new = ref[0, len(p):].tolist()
        assert out.finish_reason[i] == "length"
        assert out.tokens[i].tolist() == ref_new, f"{kind}: row {i} greedy tokens differ"


def test_cached_decode_equals_full_sequence(hf_checkpoint):
    _, _, path = hf_checkpoint
    cfg, params = load_hf(path)
    seq = np.array([_ragged_batch(3, (16,))[0], _ragged_batch(4, (16,))[0]])
    full = np.asarray(forward(cfg, params, jnp.asarray(seq)))
    cache = init_cache(cfg, 2, 24)
    pos = jnp.broadcast_to(jnp.arange(16), (2, 16))
    # prefill the first 10 tokens, then decode the other 6 one at a time
    logits, cache = forward_cached(cfg, params, jnp.asarray(seq[:, :10]), pos[:, :10], jnp.ones((2, 10), bool), cache)
    got = [np.asarray(logits)]
    for t in range(10, 16):
        lt, cache = forward_cached(cfg, params, jnp.asarray(seq[:, t:t + 1]), pos[:, t:t + 1], jnp.ones((2, 1), bool), cache)
        got.append(np.asarray(lt))
    np.testing.assert_allclose(np.concatenate(got, axis=1), full, atol=1e-5)


def test_save_hf_round_trip_through_transformers(hf_checkpoint, tmp_path):
    from transformers import AutoModelForCausalLM

    kind, model, path = hf_checkpoint
    cfg, params = load_hf(path)
    out_dir = save_hf(cfg, params, tmp_path / "saved")
    reloaded = AutoModelForCausalLM.from_pretrained(out_dir).eval()
    ids = torch.tensor([_ragged_batch(5, (12,))[0]])
    with torch.no_grad():
        np.testing.assert_allclose(reloaded(ids).logits.numpy(), model(ids).logits.numpy(), atol=1e-5)
    cfg2, params2 = load_hf(out_dir)
    assert cfg2 == cfg
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), params, params2)


def test_sharded_checkpoint_loads(hf_checkpoint, tmp_path):
    _, _, path = hf_checkpoint
    cfg, params = load_hf(path)
    out = save_hf(cfg, params, tmp_path / "sharded", max_shard_bytes=20_000)
    assert (out / "model.safetensors.index.json").exists()
    assert len(list(out.glob("model-*.safetensors"))) > 2
    _, params2 = load_hf(out)
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), params, params2)


def test_logical_axes_cover_every_param(hf_checkpoint):
    _, _, path = hf_checkpoint
    cfg, params = load_hf(path)
    axes = param_logical_axes(cfg)
    leaves = jax.tree.leaves(params)
    names = jax.tree.leaves(axes, is_leaf=lambda x: isinstance(x, tuple))
    assert len(leaves) == len(names)
    for a, n in zip(leaves, names):
        assert len(n) == a.ndim
