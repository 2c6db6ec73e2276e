"""Mesh rules, and the same short run on meshes (8,1,1), (2,4,1), (1,4,2) and one device giving the same losses.

The multi-device part runs in a subprocess: XLA_FLAGS=--xla_force_host_platform_device_count=8 must be set before
jax initialises.
"""

import json
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest
from jax.sharding import PartitionSpec as P

from jaxrag.sharding import DEFAULT_RULES, logical_to_spec

ROOT = Path(__file__).resolve().parents[1]
MESH = types.SimpleNamespace(shape={"data": 2, "fsdp": 4, "tensor": 2})


def test_logical_rules():
    assert logical_to_spec(("layers", "embed", "heads", "head_dim"), (2, 64, 4, 16), MESH) == P(None, "fsdp", "tensor", None)
    assert logical_to_spec(("vocab", "embed"), (128, 64), MESH) == P("tensor", "fsdp")
    # a dimension the mesh axis does not divide stays replicated
    assert logical_to_spec(("layers", "embed", "kv_heads", "head_dim"), (2, 64, 1, 16), MESH) == P(None, "fsdp", None, None)
    assert logical_to_spec(("embed", "vocab"), (62, 7), MESH) == P(None, None)
    # a mesh axis is used at most once per array
    assert logical_to_spec(("embed", "embed"), (8, 8), MESH, {"embed": "fsdp"}) == P("fsdp", None)
    assert logical_to_spec(("batch", None), (8, 3), MESH, DEFAULT_RULES) == P(("data", "fsdp"), None)


SCRIPT = textwrap.dedent('''
    import json, sys
    import jax, numpy as np
    from jaxrag.models import ModelConfig, init_params
    from jaxrag.sharding import make_mesh
    from jaxrag.train import fit, BatchStream, SFTExample, PreferencePair, sft_batch, pair_batch
    from jaxrag.train.metrics_log import read_metrics
    assert len(jax.devices()) == 8, jax.devices()
    out = sys.argv[1]
    cfg = ModelConfig(model_type="llama", vocab_size=128, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2,
                      head_dim=16, d_ff=128)
    params = init_params(cfg, jax.random.PRNGKey(0))
    rng = np.random.default_rng(0)
    sft = [SFTExample(list(rng.integers(1, 128, rng.integers(2, 9))), list(rng.integers(1, 128, rng.integers(1, 8))))
           for _ in range(32)]
    pairs = [PreferencePair(list(rng.integers(1, 128, 5)), list(rng.integers(1, 128, 4)), list(rng.integers(1, 128, 6)))
             for _ in range(32)]
    runs = {}
    def run(name, mesh, loss, data, make, extra):
        tc = {"steps": 3, "batch_size": 8, "progress": False, "seq_buckets": (16,), "optimizer": {"lr": 1e-2},
              "checkpoint": {"enabled": False}, **extra}
        fit(cfg, params, BatchStream(data, 8, lambda e: make(e, (16,))), loss, tc, f"{out}/{name}", mesh=mesh)
        runs[name] = [r["loss"] for s, r in sorted(read_metrics(f"{out}/{name}/metrics.jsonl").items())]
    one = make_mesh((1, 1, 1), jax.devices()[:1])
    for shape in [(8, 1, 1), (2, 4, 1), (1, 4, 2)]:
        run(f"sft_{shape}", make_mesh(shape), "sft", sft, sft_batch, {})
    run("sft_one", one, "sft", sft, sft_batch, {})
    lora = {"lora": {"enabled": True, "rank": 4, "targets": ("q", "v", "down")}}
    run("dpo_lora_one", one, "dpo", pairs, pair_batch, lora)
    run("dpo_lora_(1, 4, 2)", make_mesh((1, 4, 2)), "dpo", pairs, pair_batch, lora)
    print(json.dumps(runs))
''')


@pytest.fixture(scope="module")
def mesh_runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("mesh")
    script = tmp / "run.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8", "JAX_PLATFORMS": "cpu",
           "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, str(script), str(tmp)], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_same_losses_on_every_mesh(mesh_runs):
    ref = mesh_runs["sft_one"]
    assert len(ref) == 3 and len(set(ref)) == 3  # three different steps logged
    for shape in ["(8, 1, 1)", "(2, 4, 1)", "(1, 4, 2)"]:
        assert mesh_runs[f"sft_{shape}"] == pytest.approx(ref, rel=1e-5, abs=1e-5), shape
    assert mesh_runs["dpo_lora_(1, 4, 2)"] == pytest.approx(mesh_runs["dpo_lora_one"], rel=1e-5, abs=1e-5)
    assert mesh_runs["dpo_lora_one"][0] == pytest.approx(0.6931472, abs=1e-6)  # B = 0: policy == reference
