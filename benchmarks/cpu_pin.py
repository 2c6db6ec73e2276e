"""What the CPU numerics pin costs: benchmarks.model's training step and generation at the cpu preset, run in a
fresh process with XLA:CPU pinned (jaxrag.cpu_numerics.pin, as `python -m jaxrag.main` runs) and native (no pin),
alternating, `--rounds` times each; PyTorch's rows of the same runs as the peer.

    python -m benchmarks.cpu_pin [--rounds 2] [--rows train|all]

Prints each setting's median tokens/s per step and pinned / native, and writes results/bench/cpu_pin.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.common import table, write_result
from jaxrag import cpu_numerics

SETTINGS = ("pinned", "native")


def environment(setting: str) -> dict:
    """The process environment of one setting: this one's, less every numerics variable, then pinned or not."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("XLA_FLAGS", *cpu_numerics.ONEDNN, *cpu_numerics.THREADS)}
    env["JAX_PLATFORMS"] = "cpu"
    if setting == "pinned":
        cpu_numerics.pin(env)
    return env


def run_once(setting: str, rows: str) -> list[dict]:
    """One benchmarks.model run (cpu preset) under `setting`, in a scratch folder (its JSON lands there): its rows
    (step, jax tok/s, torch tok/s, ...)."""
    root = Path(__file__).resolve().parents[1]
    env = environment(setting)
    env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    with tempfile.TemporaryDirectory() as out:
        r = subprocess.run([sys.executable, "-m", "benchmarks.model", "--preset", "cpu", "--rows", rows], env=env,
                           capture_output=True, text=True, cwd=out)
        if r.returncode != 0:
            raise RuntimeError(f"benchmarks.model under {setting} failed:\n{r.stderr[-2000:]}")
        [path] = Path(out, "results", "bench").glob("*.json")
        return json.loads(path.read_text())["rows"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2, help="runs per setting, alternating pinned / native")
    ap.add_argument("--rows", choices=("train", "all"), default="train")
    args = ap.parse_args()
    runs: dict[str, list[list[dict]]] = {s: [] for s in SETTINGS}
    for i in range(args.rounds):
        for s in SETTINGS:
            runs[s].append(run_once(s, args.rows))
            print(f"[cpu_pin] round {i + 1}/{args.rounds} {s} done", flush=True)
    steps = [r["step"] for r in runs["pinned"][0] if "jax tok/s" in r]
    out = []
    for step in steps:
        row: dict = {"step": step}
        for s in SETTINGS:
            vals = [r for run in runs[s] for r in run if r["step"] == step]
            row[f"{s} jax tok/s"] = statistics.median(r["jax tok/s"] for r in vals)
            torch = [r["torch tok/s"] for r in vals if "torch tok/s" in r]
            if torch:
                row[f"{s} torch tok/s"] = statistics.median(torch)
        row["pinned / native"] = row["pinned jax tok/s"] / row["native jax tok/s"]
        if "pinned torch tok/s" in row and "native torch tok/s" in row:
            row["torch pinned-env / native-env"] = row["pinned torch tok/s"] / row["native torch tok/s"]
        out.append(row)
    cols = ["step", "pinned jax tok/s", "native jax tok/s", "pinned / native", "pinned torch tok/s",
            "native torch tok/s", "torch pinned-env / native-env"]
    print(table(out, [c for c in cols if any(c in r for r in out)]))
    path = write_result("cpu_pin", {"rounds": args.rounds, "rows_measured": args.rows,
                                    "pinned_settings": cpu_numerics.in_effect(environment("pinned")),
                                    "rows": out, "runs": runs})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
