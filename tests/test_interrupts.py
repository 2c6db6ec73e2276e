"""Ctrl-C and SIGTERM through `python -m jaxrag.main`: one line and a resumable workdir. SIGTERM (a scheduler's
preemption) makes the training loop save the step it is at and stop with status 143; Ctrl-C stops with 130. Both
reruns of the same command resume and end with the losses of an uninterrupted run."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from jaxrag.train.metrics_log import read_metrics

ROOT = Path(__file__).resolve().parents[1]

STAGE = textwrap.dedent('''
    import os, time, jax, numpy as np
    from pathlib import Path
    from jaxrag.models import ModelConfig, init_params
    from jaxrag.train import BatchStream, SFTExample, fit, sft_batch

    class Slow(BatchStream):
        def batch_at(self, i):
            time.sleep(float(os.environ.get("STAGE_DELAY", "0")))
            return super().batch_at(i)

    def train(config, workdir, name):
        cfg = ModelConfig(model_type="llama", vocab_size=128, d_model=32, n_layers=2, n_heads=2, n_kv_heads=1,
                          head_dim=16, d_ff=64)
        rng = np.random.default_rng(1)
        ex = [SFTExample(list(rng.integers(1, 128, 5)), list(rng.integers(1, 128, 4))) for _ in range(16)]
        fit(cfg, init_params(cfg, jax.random.PRNGKey(0)), Slow(ex, 4, lambda e: sft_batch(e, (16,))), "sft",
            {"steps": 30, "batch_size": 4, "progress": False, "seq_buckets": (16,), "optimizer": {"lr": 1e-2},
             "checkpoint": {"every_steps": 100, "async_save": True}}, Path(workdir) / name)
''')
CONFIG = textwrap.dedent('''
    import ml_collections

    def get_config():
        return ml_collections.ConfigDict({"stages": ["train"], "train": {"fn": "sigstage:train"}})
''')


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    d = tmp_path_factory.mktemp("sig")
    (d / "sigstage.py").write_text(STAGE)
    (d / "cfg.py").write_text(CONFIG)
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), str(d)])}
    cmd = lambda wd: [sys.executable, "-m", "jaxrag.main", f"--config={d / 'cfg.py'}", f"--workdir={wd}"]
    r = subprocess.run(cmd(d / "full"), cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return cmd, env, _losses(d / "full")


def _losses(wd: Path) -> list[float]:
    return [r["loss"] for _, r in sorted(read_metrics(wd / "train" / "metrics.jsonl").items())]


def _stop_at_step(cmd, env, wd: Path, sig: int, at: int = 4):
    """Run slowly, send `sig` once `at` steps are logged; returns (returncode, stderr, last logged step). The stage's
    30 steps leave about 10 s between step `at` and its end, so a busy machine still signals a running stage."""
    proc = subprocess.Popen(cmd(wd), cwd=ROOT, env={**env, "STAGE_DELAY": "0.4"}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    metrics = wd / "train" / "metrics.jsonl"
    deadline = time.time() + 240
    while time.time() < deadline and not (metrics.exists() and len(metrics.read_text().splitlines()) >= at):
        time.sleep(0.05)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=300)
    return proc.returncode, err, max(json.loads(ln)["step"] for ln in metrics.read_text().splitlines())


def test_sigterm_checkpoints_the_step_and_the_rerun_resumes(setup, tmp_path):
    cmd, env, full = setup
    wd = tmp_path / "wd"
    rc, err, last = _stop_at_step(cmd, env, wd, signal.SIGTERM)
    lines = err.strip().splitlines()
    assert rc == 143 and len(lines) == 1, err[-3000:]
    stopped = int(lines[0].split("after step ")[1].split(";")[0])
    assert lines[0] == (f"error: stage 'train' (config.train): stopped by SIGTERM after step {stopped}; saved "
                        f"{wd / 'train' / 'checkpoints' / str(stopped)}; the same command resumes from it")
    assert 4 <= stopped < 30 and stopped in (last, last + 1)     # the step it was at, though every_steps is 100
    assert sorted(int(p.name) for p in (wd / "train" / "checkpoints").iterdir() if p.name.isdigit()) == [stopped]
    assert not (wd / "train" / "DONE").exists()
    r = subprocess.run(cmd(wd), cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    np.testing.assert_allclose(_losses(wd), full, rtol=1e-6)     # resumed at step stopped + 1, same losses


def test_ctrl_c_is_one_line_and_the_rerun_finishes(setup, tmp_path):
    cmd, env, full = setup
    wd = tmp_path / "wd"
    rc, err, _ = _stop_at_step(cmd, env, wd, signal.SIGINT)
    assert rc == 130 and err.strip().splitlines() == [
        "error: interrupted in stage 'train': finished stages are kept; the same command resumes (a training stage "
        "from its last checkpoint)"], err[-3000:]
    assert not (wd / "train" / "DONE").exists()
    r = subprocess.run(cmd(wd), cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    np.testing.assert_allclose(_losses(wd), full, rtol=1e-6)


def test_sigterm_outside_a_training_loop_stops_at_once_in_one_line(tmp_path):
    """A stage that is not a training loop (here: one that sleeps) ends on SIGTERM at once, not at its end."""
    (tmp_path / "sleepstage.py").write_text(
        "import time\n\ndef sleep(config, workdir, name):\n    print('sleeping', flush=True)\n    time.sleep(120)\n")
    (tmp_path / "cfg.py").write_text(
        "import ml_collections\n\ndef get_config():\n"
        "    return ml_collections.ConfigDict({'stages': ['nap'], 'nap': {'fn': 'sleepstage:sleep'}})\n")
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path)])}
    proc = subprocess.Popen([sys.executable, "-m", "jaxrag.main", f"--config={tmp_path / 'cfg.py'}",
                             f"--workdir={tmp_path / 'wd'}"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    for line in proc.stdout:
        if line.startswith("sleeping"):
            break
    t0 = time.time()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert time.time() - t0 < 30 and proc.returncode == 143, err[-3000:]
    assert err.strip().splitlines() == [
        "error: stage 'nap' (config.nap): stopped by SIGTERM: finished stages are kept; the same command resumes (a "
        "training stage from its last checkpoint)"]


TWO_PROCESS = textwrap.dedent('''
    import sys, time
    from jaxrag.train import preemption
    from jaxrag.train.distributed import maybe_initialize
    maybe_initialize()
    preemption.install()
    import jax, numpy as np
    from jaxrag.models import ModelConfig, init_params
    from jaxrag.train import BatchStream, SFTExample, fit, sft_batch

    class Slow(BatchStream):
        def batch_at(self, i):
            time.sleep(0.4)
            return super().batch_at(i)

    cfg = ModelConfig(model_type="llama", vocab_size=128, d_model=32, n_layers=2, n_heads=2, n_kv_heads=1,
                      head_dim=16, d_ff=64)
    rng = np.random.default_rng(0)
    ex = [SFTExample(list(rng.integers(1, 128, 5)), list(rng.integers(1, 128, 4))) for _ in range(16)]
    try:
        fit(cfg, init_params(cfg, jax.random.PRNGKey(0)), Slow(ex, 4, lambda e: sft_batch(e, (16,))), "sft",
            {"steps": 40, "batch_size": 4, "progress": False, "seq_buckets": (16,), "mesh": (2, 1, 1),
             "optimizer": {"lr": 1e-2}, "checkpoint": {"every_steps": 100, "async_save": False}}, sys.argv[1])
    except preemption.Preempted as e:
        print("PREEMPTED", e, flush=True)
        sys.exit(143)
''')


def test_sigterm_to_one_process_stops_every_process_at_the_same_step(tmp_path):
    """Two processes joined by jax.distributed; only process 1 gets SIGTERM (a scheduler may signal one host
    first): both save the same step's checkpoint together and stop."""
    script = tmp_path / "job.py"
    script.write_text(TWO_PROCESS)
    port = __import__("socket").socket()
    port.bind(("127.0.0.1", 0))
    address = f"127.0.0.1:{port.getsockname()[1]}"
    port.close()
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env.update(PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1", JAX_COORDINATOR_ADDRESS=address,
               JAX_NUM_PROCESSES="2")
    wd = tmp_path / "wd"
    procs = [subprocess.Popen([sys.executable, str(script), str(wd)], env={**env, "JAX_PROCESS_ID": str(i)},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i in range(2)]
    metrics = wd / "metrics.jsonl"
    deadline = time.time() + 240
    while time.time() < deadline and not (metrics.exists() and len(metrics.read_text().splitlines()) >= 3):
        time.sleep(0.05)
    procs[1].send_signal(signal.SIGTERM)
    outs = [p.communicate(timeout=180)[0] for p in procs]
    assert [p.returncode for p in procs] == [143, 143], outs[0][-2000:] + outs[1][-2000:]
    lines = [next(ln for ln in out.splitlines() if ln.startswith("PREEMPTED")) for out in outs]
    assert lines[0] == lines[1], lines                       # the same step on both
    step = int(lines[0].split("after step ")[1].split(";")[0])
    assert 3 <= step < 40
    assert sorted(int(p.name) for p in (wd / "checkpoints").iterdir() if p.name.isdigit()) == [step]
