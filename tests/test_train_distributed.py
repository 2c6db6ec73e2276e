"""Two local processes joined by jax.distributed (CPU, one device each) run a short data-parallel job and agree,
with each other and with one process holding two devices."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = textwrap.dedent('''
    import json, sys
    from jaxrag.train.distributed import maybe_initialize
    maybe_initialize()
    import jax, numpy as np
    from jaxrag.models import ModelConfig, init_params
    from jaxrag.train import BatchStream, SFTExample, fit, sft_batch
    cfg = ModelConfig(model_type="llama", vocab_size=128, d_model=32, n_layers=2, n_heads=2, n_kv_heads=1,
                      head_dim=16, d_ff=64)
    rng = np.random.default_rng(0)
    ex = [SFTExample(list(rng.integers(1, 128, 5)), list(rng.integers(1, 128, 4))) for _ in range(16)]
    r = fit(cfg, init_params(cfg, jax.random.PRNGKey(0)), BatchStream(ex, 4, lambda e: sft_batch(e, (16,))), "sft",
            {"steps": 3, "batch_size": 4, "progress": False, "seq_buckets": (16,), "mesh": (2, 1, 1),
             "optimizer": {"lr": 1e-2}}, None)
    emb = r.params["embed"]
    local = float(np.asarray(emb.addressable_shards[0].data).sum())
    print("RESULT " + json.dumps({"process": jax.process_index(), "devices": jax.device_count(),
                                  "loss": r.metrics["loss"], "embed_sum": local}))
''')


def results(out: str):
    return [json.loads(l.split("RESULT ", 1)[1]) for l in out.splitlines() if "RESULT " in l]


def test_two_processes_agree(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'launch'}", "JAX_PLATFORMS": "cpu"}
    env.pop("XLA_FLAGS", None)
    proc = subprocess.run([sys.executable, str(ROOT / "launch" / "local.py"), "--num_processes=2", "--", str(script)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    multi = results(proc.stdout)
    assert sorted(r["process"] for r in multi) == [0, 1] and all(r["devices"] == 2 for r in multi)
    assert multi[0]["loss"] == multi[1]["loss"]
    assert multi[0]["embed_sum"] == pytest.approx(multi[1]["embed_sum"], rel=1e-6)  # replicas equal

    single = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                            env={**env, "XLA_FLAGS": "--xla_force_host_platform_device_count=2"})
    assert single.returncode == 0, single.stderr[-2000:]
    (one,) = results(single.stdout)
    assert one["devices"] == 2
    assert one["loss"] == pytest.approx(multi[0]["loss"], rel=1e-5)
