"""The machine a result was made on: what results/bench JSON and the synthetic report record."""
from __future__ import annotations

import platform
from pathlib import Path


def cpu() -> dict:
    """The host CPU's model name and its vector extensions (from /proc/cpuinfo where there is one): XLA:CPU compiles
    for them, so two machines of one speed but other extensions may round float sums differently."""
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
    return {"model": model, "vector": sorted(f for f in flags if f.startswith(("avx", "amx", "fma")))}
