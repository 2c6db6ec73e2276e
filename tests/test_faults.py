"""Fault injection on the tiny synthetic pipeline (issue 16): SIGKILL at many moments across the stages, including
during a --force rerun, then a plain rerun; the results and every model file are byte-identical to an
uninterrupted run: the session's one run of the tiny pipeline (conftest.synthetic_run, whose first stages are the
pipeline's with the same settings)."""

import hashlib
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIG = "--config=configs/synthetic/pipeline.py:tiny"
# a kill inside each of these stages (the delay after the stage starts is random, seeded): 10 points in all; sft
# twice in a row, so the second kill lands in a run that resumed sft from the first one's checkpoint
KILL_IN = ["teacher", "sft", "sft", "supervision", "dpo", "critic", "outcome", "grpo", "bestofn", "eval"]


def _env():
    return {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu", "PYTHONUNBUFFERED": "1"}


def _cmd(workdir, *extra):
    return [sys.executable, "-m", "jaxrag.main", CONFIG, f"--workdir={workdir}", *extra]


def _run_and_kill(workdir, stage: str, delay: float, *extra) -> str:
    """Start a run, SIGKILL it `delay` s after `stage` starts; returns what happened ("killed" | "finished")."""
    proc = subprocess.Popen(_cmd(workdir, *extra), cwd=ROOT, env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 600
    for line in proc.stdout:
        if line.startswith(f"[main] {stage}: running"):
            time.sleep(delay)
            break
        assert time.time() < deadline, f"{stage} never started"
    if proc.poll() is not None:
        proc.stdout.close()
        return "finished"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    proc.stdout.close()
    return "killed"


def _digests(workdir: Path, stages) -> dict[str, str]:
    files = [workdir / "report" / "results.csv"] + sorted(p for s in stages for p in (workdir / s / "model").glob("*"))
    return {str(p.relative_to(workdir)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files if p.is_file()}


def test_sigkill_anywhere_then_rerun_gives_the_uninterrupted_results(tmp_path, synthetic_run):
    import configs.synthetic.pipeline as pipeline

    stages = pipeline.get_config("tiny").stages
    assert set(KILL_IN) <= set(stages)  # a kill point in no stage would never land
    want = _digests(Path(synthetic_run[1]), stages)   # the uninterrupted run
    assert "report/results.csv" in want and any("/model/" in k for k in want)

    rng = random.Random(0)
    work = tmp_path / "killed"
    outcomes = [_run_and_kill(work, stage, rng.uniform(0.0, 1.5)) for stage in KILL_IN]
    assert outcomes.count("killed") >= 8, outcomes  # the kills landed inside the run, not after it
    done = subprocess.run(_cmd(work), cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert _digests(work, stages) == want

    # a --force rerun of sft killed midway: the old outputs come back, nothing downstream is left half-invalidated
    assert _run_and_kill(work, "sft", 1.0, "--force", "--stages=sft") == "killed"
    again = subprocess.run(_cmd(work), cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=900)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert _digests(work, stages) == want
