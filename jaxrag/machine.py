"""The machine a result was made on: what results/bench JSON and the synthetic report record."""
from __future__ import annotations

import platform
from pathlib import Path

from jaxrag.cpu_numerics import in_effect


def cpu() -> dict:
    """The host CPU's model name, its vector extensions (from /proc/cpuinfo where there is one) and the XLA:CPU
    settings that decide whether its float results match other CPUs' (jaxrag/cpu_numerics.py: pinned unless the user
    unpinned them, in which case XLA compiles for these extensions and another CPU kind may round differently)."""
    model, flags = platform.processor() or platform.machine(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
    except OSError:
        pass
    return {"model": model, "vector": sorted(f for f in flags if f.startswith(("avx", "amx", "fma"))),
            "xla_cpu": in_effect()}
