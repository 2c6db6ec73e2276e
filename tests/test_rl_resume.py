"""Killing an RL run with SIGKILL and restarting it continues identically: same questions, sampling keys, PRNG
(LoRA dropout), optimizer state and weights, so the per-step losses and the final params equal an uninterrupted run.
The three runs share a persistent compilation cache (only the first one compiles)."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np

from jaxrag.train.metrics_log import read_metrics

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = textwrap.dedent('''
    import sys, time
    import jax
    workdir, delay, cache, tests = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4]
    jax.config.update("jax_compilation_cache_dir", cache)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    sys.path.insert(0, tests)
    import numpy as np
    from rl_world import QUESTIONS, ascii_share, world
    from jaxrag.rl import RLConfig, train_rl

    def slow_reward(ep):  # slows each RL step down so the kill lands mid-run
        time.sleep(delay)
        return ascii_share(ep)

    policy, retriever, agent = world(seed=5)
    rc = RLConfig(steps=6, questions_per_step=2, group_size=2, temperature=1.0, max_new_tokens=4, max_steps=2, k=1,
                  seed=7)
    tc = {"loss": "grpo", "seq_buckets": (256,), "optimizer": {"lr": 1e-2}, "progress": False,
          "lora": {"enabled": True, "rank": 4, "dropout": 0.1},  # dropout: the PRNG must be restored too
          "checkpoint": {"every_steps": 2, "async_save": True}}
    res = train_rl(policy, retriever, agent, QUESTIONS, slow_reward, rc, tc, workdir)
    leaves = jax.tree_util.tree_leaves_with_path(res.params)
    np.savez(workdir + "/final.npz", **{jax.tree_util.keystr(p): np.asarray(x) for p, x in leaves})
''')


def losses_of(workdir: Path) -> list[float]:
    return [r["loss"] for _, r in sorted(read_metrics(workdir / "metrics.jsonl").items())]


def test_sigkill_mid_rl_and_restart_continues_identically(tmp_path):
    script = tmp_path / "run.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"}
    run = lambda wd, delay: [sys.executable, str(script), str(wd), str(delay), str(tmp_path / "jax_cache"),
                             str(ROOT / "tests")]
    subprocess.run(run(tmp_path / "full", 0), env=env, check=True, capture_output=True, timeout=400)
    full = losses_of(tmp_path / "full")
    assert len(full) == 6

    killed = tmp_path / "killed"
    proc = subprocess.Popen(run(killed, 0.1), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    metrics = killed / "metrics.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline and not (metrics.exists() and len(metrics.read_text().splitlines()) >= 3):
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    steps_before = [json.loads(line)["step"] for line in metrics.read_text().splitlines()]
    assert 3 <= max(steps_before) < 6, steps_before  # killed mid-run
    assert not (killed / "final.npz").exists()

    subprocess.run(run(killed, 0), env=env, check=True, capture_output=True, timeout=400)
    steps = [json.loads(line)["step"] for line in metrics.read_text().splitlines()]
    restart = steps[len(steps_before)]
    assert 1 < restart <= max(steps_before) + 1  # resumed from a checkpoint, not from scratch
    np.testing.assert_allclose(losses_of(killed), full, rtol=1e-6, atol=1e-9)
    a, b = np.load(tmp_path / "full" / "final.npz"), np.load(killed / "final.npz")
    assert sorted(a.files) == sorted(b.files)
    for k in a.files:
        np.testing.assert_array_equal(a[k], b[k])
