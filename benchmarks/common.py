"""Shared helpers for benchmarks: timing, a markdown table, the JSON record under results/bench/."""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Callable

from jaxrag.machine import cpu


def durations(fn: Callable[[], object], n: int) -> list[float]:
    """Wall seconds of n successive calls of fn (fn must block until its work is done)."""
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def time_it(fn: Callable[[], object], repeats: int = 3, warmup: int = 1) -> float:
    """Median wall seconds of fn() over `repeats` runs after `warmup` runs."""
    durations(fn, warmup)
    return statistics.median(durations(fn, repeats))


def time_first_and_median(fn: Callable[[], object], repeats: int = 3) -> tuple[float, float]:
    """(seconds of the first call, compilation included; median seconds of the `repeats` calls after it)."""
    times = durations(fn, 1 + repeats)
    return times[0], statistics.median(times[1:])


def table(rows: list[dict], columns: list[str]) -> str:
    def fmt(v):
        if isinstance(v, float):
            return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.3g}"
        return str(v)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(fmt(r.get(c, "")) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


def write_result(name: str, payload: dict, out_dir: str | Path = "results/bench") -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    payload = dict(payload, machine={"cpus": os.cpu_count(), "platform": platform.platform(), "cpu": cpu(),
                                     "time": time.strftime("%Y-%m-%dT%H:%M:%S")})
    path = out / f"{name}.json"
    path.write_text(json.dumps(payload, indent=2))
    return path


def matmul_gflops(n: int = 2048, repeats: int = 5) -> float:
    """This machine's speed of the moment: GFLOP/s of a jitted n x n fp32 matmul (the README's machine figure)."""
    import jax
    import jax.numpy as jnp

    mm = jax.jit(lambda a: a @ a)
    a = jnp.ones((n, n), jnp.float32)
    mm(a).block_until_ready()
    t0 = time.perf_counter()
    for _ in range(repeats):
        mm(a).block_until_ready()
    return repeats * 2 * n ** 3 / (time.perf_counter() - t0) / 1e9
