"""The trainer's compiled step on an FSDP mesh moves about the weights' bytes, not every token's activations.

XLA's partitioner, left alone, splits a step's matmuls over the fsdp-sharded weights' embed dimension and keeps
every token's activations (the LM head's [B*T, V] logits included) on every device; the model pins its activations
to rows over the batch axes under the train step's mesh (transformer.constrain_rows). Proper FSDP gathers the
weights in the forward and backward passes and reduces the gradients: about 3x the parameter bytes per step.
Runs in a subprocess with 4 fake CPU devices (XLA_FLAGS must be set before jax initialises).
"""

import textwrap

import pytest
from fakes import run_on_fake_devices


SCRIPT = textwrap.dedent('''
    import json
    import jax
    import numpy as np
    from jaxrag import sharding as shd
    from benchmarks.scale import collective_bytes
    from jaxrag.models import ModelConfig, init_params
    from jaxrag.train import config as tconfig
    from jaxrag.train.batching import SFTExample, sft_batch
    from jaxrag.train.learner import build
    from jaxrag.train.state import init_state, put

    cfg = ModelConfig(model_type="llama", vocab_size=512, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2,
                      head_dim=16, d_ff=128, max_seq_len=256)
    B, P = 16, 64
    params = init_params(cfg, jax.random.PRNGKey(0))
    rng = np.random.default_rng(0)
    batch = sft_batch([SFTExample(list(rng.integers(1, 512, P)), list(rng.integers(1, 512, P))) for _ in range(B)],
                      (2 * P,))
    out = {"param_bytes": sum(x.nbytes for x in jax.tree.leaves(params))}
    for shape in [(1, 4, 1), (2, 2, 1), (1, 1, 1)]:
        n = int(np.prod(shape))
        mesh = shd.make_mesh(shape, jax.devices()[:n])
        tc = tconfig.resolve({"mesh": shape, "batch_size": B, "seq_buckets": (2 * P,)})
        tr = build(cfg, params, tc, mesh=mesh)
        state = init_state(put(tr.trainable, tr.state_sh["trainable"]), tr.tx, 0, tr.state_sh)
        lowered = tr.step_fn.lower(state, put(tr.frozen, tr.frozen_sh), shd.shard_batch(mesh, batch))
        text = lowered.compile().as_text()
        out[str(shape)] = {"bytes": sum(collective_bytes(text, loops=True).values()),
                           "once": sum(collective_bytes(text).values()),
                           "constraints": lowered.as_text().count("sharding_constraint")}

    # the LM head's row-chunked log-probs (forced by a small max_logits) on the mesh = the whole logits on one device
    import jaxrag.train.objectives as O
    trained = {}
    for name, shape, max_logits in [("one", (1, 1, 1), O.MAX_LOGITS), ("chunked", (1, 4, 1), 512 * 100)]:
        O.head_logprobs.__defaults__ = O.picked_head_logprobs.__defaults__ = (1.0, max_logits)
        mesh = shd.make_mesh(shape, jax.devices()[:int(np.prod(shape))])
        tr = build(cfg, params, tconfig.resolve({"mesh": shape, "batch_size": B, "seq_buckets": (2 * P,)}), mesh=mesh)
        state = init_state(put(tr.trainable, tr.state_sh["trainable"]), tr.tx, 0, tr.state_sh)
        state, m = tr.step_fn(state, put(tr.frozen, tr.frozen_sh), shd.shard_batch(mesh, batch))
        trained[name] = (float(m["loss"]), np.asarray(jax.device_get(state["trainable"]["model"]["lm_head"])))
    out["chunked_loss"] = [trained["one"][0], trained["chunked"][0]]
    out["chunked_head_diff"] = float(np.abs(trained["one"][1] - trained["chunked"][1]).max())
    print(json.dumps(out))
''')


@pytest.fixture(scope="module")
def steps(tmp_path_factory):
    return run_on_fake_devices(SCRIPT, 4, tmp_path_factory.mktemp("fsdp"), timeout=600)


@pytest.mark.parametrize("shape", ["(1, 4, 1)", "(2, 2, 1)"])
def test_fsdp_step_moves_about_the_weights(steps, shape):
    """Under 6x the parameter bytes per step (2.7x and 3.1x here; 23x before the activations were pinned)."""
    moved = steps[shape]["bytes"]
    assert 0 < moved < 6 * steps["param_bytes"], (moved, steps["param_bytes"])


def test_layer_loop_counted_per_layer(steps):
    """The scan over layers runs its collectives once per layer: counted with its trip count."""
    assert steps["(1, 4, 1)"]["bytes"] > steps["(1, 4, 1)"]["once"]


def test_one_device_program_unchanged(steps):
    """No mesh to split over: no sharding constraint in the program, no collective."""
    assert steps["(1, 1, 1)"] == {"bytes": 0, "once": 0, "constraints": 0}


def test_chunked_head_on_the_mesh_equals_one_device(steps):
    """The LM head's row chunks interleaved over the devices (objectives.picked_head_logprobs): same step."""
    one, chunked = steps["chunked_loss"]
    assert chunked == pytest.approx(one, rel=1e-6)
    assert steps["chunked_head_diff"] < 1e-6
