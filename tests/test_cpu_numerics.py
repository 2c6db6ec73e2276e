"""jaxrag pins XLA:CPU to math every x86-64 CPU computes alike (jaxrag/cpu_numerics.py)."""
import os
import subprocess
import sys

import pytest

from jaxrag.cpu_numerics import PORTABLE, in_effect, portable_flags

PDM, ISA = "--xla_cpu_enable_platform_dependent_math=false", "--xla_cpu_max_isa=AVX2"


def test_the_portable_flags_join_the_users_own_and_never_override_them():
    assert portable_flags({}, "x86_64") == f"{PDM} {ISA}"
    assert portable_flags({"XLA_FLAGS": "--xla_force_host_platform_device_count=8"}, "x86_64") == \
        f"--xla_force_host_platform_device_count=8 {PDM} {ISA}"
    mine = "--xla_cpu_max_isa=AVX512 --xla_cpu_enable_platform_dependent_math=true"
    assert portable_flags({"XLA_FLAGS": mine}, "x86_64") == mine                       # the user's values stand
    assert portable_flags({"XLA_FLAGS": "xla_cpu_max_isa=AVX"}, "x86_64") == f"xla_cpu_max_isa=AVX {PDM}"
    assert portable_flags({}, "aarch64") == PDM                                         # no x86 ISA on ARM
    assert portable_flags({"JAXRAG_NATIVE_CPU_MATH": "1", "XLA_FLAGS": "--a=1"}, "x86_64") == "--a=1"  # opted out
    assert portable_flags({"JAXRAG_NATIVE_CPU_MATH": "0"}, "x86_64") == f"{PDM} {ISA}"
    assert in_effect({"XLA_FLAGS": f"{PDM} {ISA}"}) == PORTABLE
    assert in_effect({}) == {k: "default" for k in PORTABLE}


def test_this_process_runs_with_the_portable_settings():
    """The suite imports jaxrag before JAX computes anything, as every entry point does."""
    import platform

    want = dict(PORTABLE) if platform.machine().lower() in ("x86_64", "amd64") else \
        {**{k: "default" for k in PORTABLE}, "xla_cpu_enable_platform_dependent_math": "false"}
    if os.environ.get("JAXRAG_NATIVE_CPU_MATH", "") not in ("", "0"):
        pytest.skip("the suite was started with JAXRAG_NATIVE_CPU_MATH set")
    assert in_effect() == want


_RSQRT = """
import numpy as np
import jaxrag, jax
x = np.random.default_rng(0).uniform(1e-3, 1e3, 100_000).astype(np.float32)
got = np.asarray(jax.jit(jax.lax.rsqrt)(x))
print(int((got != np.float32(1) / np.sqrt(x)).sum()))
"""


@pytest.mark.parametrize("native", [False, True])
def test_importing_jaxrag_makes_rsqrt_the_correctly_rounded_one_over_sqrt(native):
    """Platform-dependent math computes rsqrt with the CPU's approximation and a Newton step (on x86 with AVX: ~30 %
    of these inputs off by an ulp from 1/sqrt); pinned, XLA computes 1/sqrt(x), the same bits on every CPU."""
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAXRAG_NATIVE_CPU_MATH")}
    env["JAX_PLATFORMS"] = "cpu"
    if native:
        env["JAXRAG_NATIVE_CPU_MATH"] = "1"
    out = subprocess.run([sys.executable, "-c", _RSQRT], env=env, capture_output=True, text=True, check=True)
    differing = int(out.stdout.split()[-1])
    if not native:
        assert differing == 0
    elif differing == 0:   # the native path agreeing is possible on a CPU without the approximation instruction
        flags = open("/proc/cpuinfo").read() if os.path.exists("/proc/cpuinfo") else ""
        assert " avx " not in flags, "rsqrt matched 1/sqrt with platform-dependent math on: is the flag still read?"
    else:
        assert differing > 1000
