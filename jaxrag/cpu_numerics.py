"""The same float results on every x86-64 CPU: XLA:CPU flags that jaxrag sets when it is imported.

By default XLA:CPU computes for the host it runs on. Two of its choices change float results between CPU kinds:
- platform-dependent math (`xla_cpu_enable_platform_dependent_math`, on by default): rsqrt by the CPU's
  approximation instruction plus a Newton step instead of 1/sqrt, and matmuls by whichever YNNPACK kernel suits the
  CPU; off, YNNPACK keeps to kernels whose results are the same on every CPU one build runs on
  (YNN_FLAG_CONSISTENT_ARITHMETIC);
- the instruction set LLVM compiles fused kernels for (`xla_cpu_max_isa`, the host's own by default): on an AVX-512
  CPU the demo's 720 SFT steps gave another model with AVX-512 than with AVX2, other flags equal.
Pinned to (off, AVX2), the lowest set of this project's machines, a run gives the same bits on an AVX2 and on an
AVX-512 CPU, and the demo's table stops depending on the machine it was made on. Neither cost measurable time in
the demo's SFT stage (README). The flags reach XLA only if they are in XLA_FLAGS before JAX starts its CPU backend
(the first computation), which importing jaxrag first guarantees.

A flag the user set in XLA_FLAGS is kept as set; JAXRAG_NATIVE_CPU_MATH=1 sets neither (the host's fastest code).
Not x86-64 (an ARM host): only platform-dependent math is turned off; `xla_cpu_max_isa` names x86 sets.
"""
from __future__ import annotations

import os
import platform

PORTABLE = {"xla_cpu_enable_platform_dependent_math": "false", "xla_cpu_max_isa": "AVX2"}
OPT_OUT = "JAXRAG_NATIVE_CPU_MATH"


def _flags(text: str) -> dict[str, str]:
    out = {}
    for token in text.split():
        name, _, value = token.lstrip("-").partition("=")
        out[name] = value
    return out


def portable_flags(environ=os.environ, machine: str | None = None) -> str:
    """XLA_FLAGS with the portable settings added: the user's own flags (and their values of these) kept."""
    current = environ.get("XLA_FLAGS", "")
    if environ.get(OPT_OUT, "") not in ("", "0"):
        return current
    x86 = (machine or platform.machine()).lower() in ("x86_64", "amd64")
    have = _flags(current)
    add = [f"--{k}={v}" for k, v in PORTABLE.items() if k not in have and (x86 or k != "xla_cpu_max_isa")]
    return " ".join([current, *add]).strip()


def pin(environ=os.environ) -> None:
    """Put the portable settings into XLA_FLAGS (see the module's docstring)."""
    flags = portable_flags(environ)
    if flags:
        environ["XLA_FLAGS"] = flags


def in_effect(environ=os.environ) -> dict[str, str]:
    """This process's values of the settings that decide CPU numerics ("default" where XLA_FLAGS does not set one)."""
    have = _flags(environ.get("XLA_FLAGS", ""))
    return {k: have.get(k, "default") for k in PORTABLE}
