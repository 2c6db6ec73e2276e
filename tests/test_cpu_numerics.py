"""jaxrag.main pins XLA:CPU to math every x86-64 CPU computes alike (jaxrag/cpu_numerics.py); `import jaxrag` does not."""
import os
import platform
import shutil
import subprocess
import sys

import pytest

from jaxrag.cpu_numerics import PORTABLE, in_effect, pin, portable_flags
from jaxrag.machine import cpu

PDM, ISA = "--xla_cpu_enable_platform_dependent_math=false", "--xla_cpu_max_isa=AVX2"


def test_onednn_is_pinned_to_avx2_unless_the_user_chose():
    env = {}
    pin(env, "x86_64")
    assert env["ONEDNN_MAX_CPU_ISA"] == "AVX2" and in_effect(env)["ONEDNN_MAX_CPU_ISA"] == "AVX2"
    for mine in ({"ONEDNN_MAX_CPU_ISA": "AVX512_CORE"}, {"DNNL_MAX_CPU_ISA": "AVX512_CORE"}):
        env = dict(mine)
        pin(env, "x86_64")
        assert "ONEDNN_MAX_CPU_ISA" not in env or env["ONEDNN_MAX_CPU_ISA"] == "AVX512_CORE"   # the user's stands
        assert in_effect(env)["ONEDNN_MAX_CPU_ISA"] == "AVX512_CORE"
    for env, machine in (({}, "aarch64"), ({"JAXRAG_NATIVE_CPU_MATH": "1"}, "x86_64")):
        pin(env, machine)
        assert "ONEDNN_MAX_CPU_ISA" not in env and in_effect(env)["ONEDNN_MAX_CPU_ISA"] == "default"


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
    assert in_effect({"XLA_FLAGS": f"{PDM} {ISA}", "ONEDNN_MAX_CPU_ISA": "AVX2", "PJRT_NPROC": "2"}) == PORTABLE
    assert in_effect({}) == {k: "default" for k in PORTABLE}


def test_this_process_runs_with_the_portable_settings():
    """The suite pins before JAX computes anything (tests/conftest.py), as jaxrag.main does."""
    want = dict(PORTABLE) if platform.machine().lower() in ("x86_64", "amd64") else \
        {**{k: "default" for k in PORTABLE}, "xla_cpu_enable_platform_dependent_math": "false", "PJRT_NPROC": "2"}
    if os.environ.get("JAXRAG_NATIVE_CPU_MATH", "") not in ("", "0"):
        pytest.skip("the suite was started with JAXRAG_NATIVE_CPU_MATH set")
    assert in_effect() == want


_ENV = """
import json, os
{imports}
print(json.dumps({{k: os.environ.get(k) for k in ("XLA_FLAGS", "ONEDNN_MAX_CPU_ISA", "PJRT_NPROC")}}))
"""


def test_importing_the_library_changes_nothing_and_the_cli_pins():
    """A researcher's script that imports jaxrag's modules keeps its process's XLA settings; jaxrag.main (the CLI)
    sets the portable ones when it is imported, before JAX computes."""
    import json

    lib = "import jaxrag, jaxrag.losses, jaxrag.models, jaxrag.train, jaxrag.rl.loop, jaxrag.pipelines.train"
    clean = {k: None for k in ("XLA_FLAGS", "ONEDNN_MAX_CPU_ISA", "PJRT_NPROC")}
    assert json.loads(_run(_ENV.format(imports=lib))) == clean
    main = json.loads(_run(_ENV.format(imports="import jaxrag.main")))
    if platform.machine().lower() in ("x86_64", "amd64"):
        assert main == {"XLA_FLAGS": f"{PDM} {ISA}", "ONEDNN_MAX_CPU_ISA": "AVX2", "PJRT_NPROC": "2"}


_RSQRT = """
import numpy as np
from jaxrag.cpu_numerics import pin; pin()
import jax
x = np.random.default_rng(0).uniform(1e-3, 1e3, 100_000).astype(np.float32)
got = np.asarray(jax.jit(jax.lax.rsqrt)(x))
print(int((got != np.float32(1) / np.sqrt(x)).sum()))
"""


@pytest.mark.parametrize("native", [False, True])
def test_the_pin_makes_rsqrt_the_correctly_rounded_one_over_sqrt(native):
    """Platform-dependent math computes rsqrt with the CPU's approximation and a Newton step (on x86 with AVX: ~30 %
    of these inputs off by an ulp from 1/sqrt); pinned, XLA computes 1/sqrt(x), the same bits on every CPU."""
    differing = int(_run(_RSQRT, **({"JAXRAG_NATIVE_CPU_MATH": "1"} if native else {})))
    if not native:
        assert differing == 0
    elif differing == 0:   # the native path agreeing is possible on a CPU without the approximation instruction
        assert "avx" not in cpu()["vector"], "rsqrt matched 1/sqrt with platform-dependent math on: is the flag read?"
    else:
        assert differing > 1000


_LM_HEAD_GRAD = """
import hashlib, numpy as np
from jaxrag.cpu_numerics import pin; pin()
import jax, jax.numpy as jnp
rng = np.random.default_rng(0)
h, d = (jnp.asarray(rng.normal(size=s).astype(np.float32)) for s in ((2032, 128), (2032, 2000)))
out = jax.jit(lambda h, d: jnp.einsum("nd,nv->dv", h, d, precision="highest"))(h, d)
print(hashlib.sha256(np.asarray(out).tobytes()).hexdigest())
"""


def _clean_env(**env_vars) -> dict:
    """This process's environment without the numerics settings and the suite's compilation cache, plus env_vars."""
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAXRAG_NATIVE_CPU_MATH", "ONEDNN_MAX_CPU_ISA",
                                                            "DNNL_MAX_CPU_ISA", "PJRT_NPROC", "NPROC")
           and not k.startswith(("JAX_COMPILATION_CACHE", "JAX_PERSISTENT_CACHE"))}
    return {**env, **env_vars}


def _run(code: str, *, under: tuple = (), **env_vars) -> str:
    """The last line `code` prints in a fresh process (run `under` a command such as qemu's), whose environment has
    none of the numerics settings but `env_vars`, and no persistent compilation cache (the suite's: tests/conftest.py),
    so each process compiles its programs under its own settings and CPU."""
    env = _clean_env(JAX_PLATFORMS="cpu", **env_vars)
    return subprocess.run([*under, sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True,
                          timeout=1800).stdout.splitlines()[-1].strip()


def test_the_pin_sets_onednns_matmul_kernels_to_avx2():
    """XLA:CPU runs the LM head's gradient (a 2-D dot contracting both operands' first axis) in oneDNN, which picks
    its kernel for the host's best ISA when its first matmul runs: on an AVX-512 CPU its bits differ from an AVX2
    CPU's. pin() must set ONEDNN_MAX_CPU_ISA before that: the pinned bits are those of oneDNN told AVX2
    by hand, and on an AVX-512 CPU not those of the unpinned process."""
    pinned = _run(_LM_HEAD_GRAD)
    assert pinned == _run(_LM_HEAD_GRAD, JAXRAG_NATIVE_CPU_MATH="1", ONEDNN_MAX_CPU_ISA="AVX2")
    if "avx512f" in cpu()["vector"]:
        assert pinned != _run(_LM_HEAD_GRAD, JAXRAG_NATIVE_CPU_MATH="1"), "is ONEDNN_MAX_CPU_ISA still read?"


def test_xla_cpu_thread_count_is_pinned_unless_the_user_chose():
    env = {}
    pin(env, "aarch64")
    assert env["PJRT_NPROC"] == "2" and in_effect(env)["PJRT_NPROC"] == "2"
    for mine in ({"PJRT_NPROC": "16"}, {"NPROC": "16"}):
        env = dict(mine)
        pin(env, "x86_64")
        assert in_effect(env)["PJRT_NPROC"] == "16"
    env = {"JAXRAG_NATIVE_CPU_MATH": "1"}
    pin(env, "x86_64")
    assert "PJRT_NPROC" not in env and in_effect(env)["PJRT_NPROC"] == "default"


@pytest.mark.skipif(shutil.which("taskset") is None or len(os.sched_getaffinity(0)) < 2,
                    reason="needs taskset and 2 schedulable CPUs")
def test_the_bits_do_not_depend_on_how_many_cores_the_machine_has():
    """XLA:CPU splits the LM head's gradient dot by its thread pool's size, which is the schedulable CPUs unless
    PJRT_NPROC says otherwise: natively, 1 CPU (taskset -c 0) gives other bits than 2 threads. pin() sets the
    pool's size, so the bits are the same on 1 CPU as on all of them."""
    one_cpu = ("taskset", "-c", "0")
    assert _run(_LM_HEAD_GRAD, under=one_cpu) == _run(_LM_HEAD_GRAD)
    native = {"JAXRAG_NATIVE_CPU_MATH": "1", "ONEDNN_MAX_CPU_ISA": "AVX2"}
    assert _run(_LM_HEAD_GRAD, under=one_cpu, **native) != _run(_LM_HEAD_GRAD, PJRT_NPROC="2", **native), \
        "the thread count no longer changes the bits: is PJRT_NPROC still read, or the split gone?"


_TRAIN_STEPS = """
import hashlib, numpy as np
from jaxrag.cpu_numerics import pin; pin()
import jax
from jaxrag.models import ModelConfig
from jaxrag.models import transformer as tf
from jaxrag.train import loop
cfg = ModelConfig(vocab_size=512, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, d_ff=192,
                  max_seq_len=128, bos_id=1, eos_ids=(2,), pad_id=0)
rng = np.random.default_rng(0)
def batches():
    while True:
        t = rng.integers(3, cfg.vocab_size, (8, 64)).astype(np.int32)
        yield {"tokens": t, "loss_mask": np.ones(t.shape, np.float32), "segment_ids": np.ones_like(t),
               "positions": np.tile(np.arange(64, dtype=np.int32), (8, 1))}
res = loop.fit(cfg, tf.init_params(cfg, jax.random.PRNGKey(0)), batches(), loss="sft",
               train_config={"steps": 2, "batch_size": 8, "optimizer": {"lr": 2e-3}, "progress": False,
                             "checkpoint": {"enabled": False}, "seq_buckets": (64,)})
print(hashlib.sha256(b"".join(np.asarray(x).tobytes() for x in jax.tree.leaves(res.params))).hexdigest())
"""


@pytest.mark.skipif(shutil.which("qemu-x86_64") is None or platform.machine().lower() not in ("x86_64", "amd64"),
                    reason="needs qemu-x86_64 (Debian's qemu-user) to run an AVX2 CPU without AVX-512")
def test_two_sft_steps_give_the_same_bits_on_an_emulated_avx2_cpu():
    """The claim itself, where it can be checked: two SFT steps (forward, backward, AdamW) of a small Llama give the
    same weights natively and under `qemu-x86_64 -cpu Haswell` (AVX2 and FMA, no AVX-512: the CPUID that XLA, oneDNN
    and YNNPACK read says so). A few minutes: under emulation XLA compiles slowly."""
    assert _run(_TRAIN_STEPS, under=("qemu-x86_64", "-cpu", "Haswell")) == _run(_TRAIN_STEPS)
