"""The same float results on every x86-64 CPU: XLA:CPU settings that `pin()` sets (jaxrag.main calls it on start).

By default XLA:CPU computes for the host it runs on. Three of its choices change float results between CPU kinds:
- platform-dependent math (`xla_cpu_enable_platform_dependent_math`, on by default): rsqrt by the CPU's
  approximation instruction plus a Newton step instead of 1/sqrt, and matmuls by whichever YNNPACK kernel suits the
  CPU; off, YNNPACK keeps to kernels whose results are the same on every CPU one build runs on
  (YNN_FLAG_CONSISTENT_ARITHMETIC);
- the instruction set LLVM compiles fused kernels for (`xla_cpu_max_isa`, the host's own by default): on an AVX-512
  CPU the demo's 720 SFT steps gave another model with AVX-512 than with AVX2, other flags equal;
- the instruction set oneDNN picks its matmul kernels for at run time (`ONEDNN_MAX_CPU_ISA`, an environment variable
  of oneDNN's own, the host's best by default): XLA:CPU runs some dots there, e.g. the 2-D one contracting both
  operands' first axis that computes the LM head's gradient, whose bits differed between AVX-512 and AVX2 although
  both flags above were pinned.
A fourth choice is not the CPU's kind but its size: the number of threads XLA:CPU's intra-op pool has (the
process's schedulable CPUs unless the `PJRT_NPROC` or `NPROC` environment variable says otherwise). Dots and
reductions are split by that number (a dot contracting 2032 rows gave other bits on 1 thread than on 2; two SFT
steps of the demo's model gave other weights on 2, 4 and 8 threads), so a 2-core and a 16-core machine trained
other models. It is pinned to `THREADS` (2, the demo's reference machine's count): the results then depend on the
pinned number only, not on the cores there are (checked with `taskset`: tests/test_cpu_numerics.py).
Pinned to (off, AVX2, AVX2, 2 threads), the lowest set of this project's machines, a run gives the same bits on an AVX2 and on
an AVX-512 CPU: checked with three SFT steps of the demo's model (forward, backward, AdamW) on an AVX-512 EPYC and
under `qemu-x86_64 -cpu Haswell` (an AVX2 CPU, no AVX-512) on it (README). The demo's SFT stage took 342-370 s
under every setting tried, pinned or not (README). XLA reads its flags when JAX starts its CPU backend (the first
computation) and oneDNN its variable at its first matmul, so `pin()` sets both in the environment before either:
jaxrag.main when it is imported, tests/conftest.py for the suite. `import jaxrag` alone sets nothing (a library must
not change a process's XLA flags; on a GPU or TPU these settings do not apply anyway).

A setting the user made (a flag in XLA_FLAGS, ONEDNN_MAX_CPU_ISA or its older name DNNL_MAX_CPU_ISA) is kept as set;
JAXRAG_NATIVE_CPU_MATH=1 sets none of them (the host's fastest code; every core). Not x86-64 (an ARM host): only platform-
dependent math is turned off; the ISA settings name x86 sets.
"""
from __future__ import annotations

import os
import platform

XLA = {"xla_cpu_enable_platform_dependent_math": "false", "xla_cpu_max_isa": "AVX2"}   # flags in XLA_FLAGS
ONEDNN = ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")   # oneDNN reads either name (the second is its older one)
THREADS = ("PJRT_NPROC", "NPROC")   # XLA:CPU's intra-op pool size, read by the PJRT CPU client in this order
PORTABLE = {**XLA, ONEDNN[0]: "AVX2", THREADS[0]: "2"}
OPT_OUT = "JAXRAG_NATIVE_CPU_MATH"


def _flags(text: str) -> dict[str, str]:
    out = {}
    for token in text.split():
        name, _, value = token.lstrip("-").partition("=")
        out[name] = value
    return out


def _opted_out(environ) -> bool:
    return environ.get(OPT_OUT, "") not in ("", "0")


def _x86(machine: str | None) -> bool:
    return (machine or platform.machine()).lower() in ("x86_64", "amd64")


def portable_flags(environ=os.environ, machine: str | None = None) -> str:
    """XLA_FLAGS with the portable settings added: the user's own flags (and their values of these) kept."""
    current = environ.get("XLA_FLAGS", "")
    if _opted_out(environ):
        return current
    have = _flags(current)
    add = [f"--{k}={v}" for k, v in XLA.items() if k not in have and (_x86(machine) or k != "xla_cpu_max_isa")]
    return " ".join([current, *add]).strip()


def pin(environ=os.environ, machine: str | None = None) -> None:
    """Put the portable settings into XLA_FLAGS and oneDNN's variable (see the module's docstring)."""
    flags = portable_flags(environ, machine)
    if flags:
        environ["XLA_FLAGS"] = flags
    if not _opted_out(environ) and _x86(machine) and not any(environ.get(k) for k in ONEDNN):
        environ[ONEDNN[0]] = PORTABLE[ONEDNN[0]]
    if not _opted_out(environ) and not any(environ.get(k) for k in THREADS):
        environ[THREADS[0]] = PORTABLE[THREADS[0]]


def in_effect(environ=os.environ) -> dict[str, str]:
    """This process's values of the settings that decide CPU numerics ("default" where none is set)."""
    have = _flags(environ.get("XLA_FLAGS", ""))
    onednn = next((environ[k] for k in ONEDNN if environ.get(k)), "default")
    threads = next((environ[k] for k in THREADS if environ.get(k)), "default")
    return {k: (onednn if k == ONEDNN[0] else threads if k == THREADS[0] else have.get(k, "default"))
            for k in PORTABLE}
