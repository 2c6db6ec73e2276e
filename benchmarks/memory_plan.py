"""Memory plan by AOT lowering (nothing allocated): per-device bytes of a full train step for Llama-3.1-8B shapes.

    python -m benchmarks.memory_plan [--seq=1024] [--pairs=8]

Cases: a full-parameter DPO step with FSDP over 8 (fake CPU) devices, and a LoRA r=256 DPO step on one device.
The step is the trainer's own (jaxrag.train.steps.make_train_step) lowered with ShapeDtypeStructs and compiled;
bytes come from XLA's `compiled.memory_analysis()` (CPU backend: buffer assignment differs from GPU's, so read
these as a plan, not a promise). Writes results/memory_plan.md and results/bench/memory_plan.json.

On an accelerator (`JAX_PLATFORMS=cuda python -m benchmarks.memory_plan`) it plans the cases that fit the devices
present with that backend's own compiler and buffer assignment (one GPU: the LoRA case) and writes
results/memory_plan_<device>.md and results/bench/memory_plan_<device>.json instead.
"""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse  # noqa: E402
from pathlib import Path  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from jaxrag import sharding as shd  # noqa: E402
from benchmarks.common import table, write_result  # noqa: E402
from jaxrag.models import ModelConfig, param_logical_axes, param_shapes  # noqa: E402
from jaxrag.models.lora import init_lora, lora_logical_axes  # noqa: E402
from jaxrag.train import config as tconfig  # noqa: E402
from jaxrag.train.state import abstract_state, state_shardings  # noqa: E402
from jaxrag.train.steps import make_optimizer, make_train_step  # noqa: E402

GPU_BYTES = 80e9
LLAMA_31_8B = ModelConfig(model_type="llama", vocab_size=128256, d_model=4096, n_layers=32, n_heads=32, n_kv_heads=8,
                          head_dim=128, d_ff=14336, rope_theta=500000.0, max_seq_len=131072)


def abstract_params(cfg: ModelConfig):
    dtype = jnp.dtype(cfg.param_dtype)
    return jax.tree.map(lambda s: jax.ShapeDtypeStruct(s, dtype), param_shapes(cfg), is_leaf=lambda x: isinstance(x, tuple))


def plan(name, cfg, tc, mesh, pairs, seq):
    tx, schedule = make_optimizer(tc)
    axes = param_logical_axes(cfg)
    params = abstract_params(cfg)
    if tc.lora.enabled:
        lora = jax.eval_shape(lambda k: init_lora(cfg, k, tuple(tc.lora.targets), tc.lora.rank), jax.random.PRNGKey(0))
        trainable, t_axes = {"lora": lora}, {"lora": lora_logical_axes(cfg, lora)}
        frozen, f_axes = {"base": params}, {"base": axes}
    else:
        trainable, t_axes = {"model": params}, {"model": axes}
        frozen, f_axes = {"ref": params}, {"ref": axes}
    t_sh = shd.param_shardings(mesh, trainable, t_axes)
    f_sh = shd.param_shardings(mesh, frozen, f_axes)
    state_sh = state_shardings(mesh, tx, trainable, t_sh)
    state = abstract_state(tx, trainable, state_sh)
    batch = {"tokens": jax.ShapeDtypeStruct((pairs, 2, seq), jnp.int32), "positions": jax.ShapeDtypeStruct((pairs, 2, seq), jnp.int32),
             "segment_ids": jax.ShapeDtypeStruct((pairs, 2, seq), jnp.int32), "loss_mask": jax.ShapeDtypeStruct((pairs, 2, seq), jnp.float32)}
    batch_sh = shd.batch_shardings(mesh, batch)
    step = jax.jit(make_train_step(cfg.replace(dtype=tc.compute_dtype), tc, tx, schedule),
                   in_shardings=(state_sh, f_sh, batch_sh), out_shardings=(state_sh, shd.replicated(mesh)), donate_argnums=(0,))
    compiled = step.lower(state, shd.abstract(frozen, f_sh), batch).compile()
    m = compiled.memory_analysis()
    n_dev = mesh.devices.size
    nbytes = lambda t: sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(t))
    row = {
        "case": name, "devices": n_dev, "mesh": "x".join(str(mesh.shape[a]) for a in shd.MESH_AXES),
        "pairs x seq": f"{pairs}x{seq}", "trainable params": sum(x.size for x in jax.tree.leaves(trainable)),
        "state GB/dev (ideal)": nbytes(state) / n_dev / 1e9, "frozen GB/dev (ideal)": nbytes(frozen) / n_dev / 1e9,
        "argument GB": m.argument_size_in_bytes / 1e9, "output GB": m.output_size_in_bytes / 1e9,
        "alias GB": m.alias_size_in_bytes / 1e9, "temp GB": m.temp_size_in_bytes / 1e9,
    }
    peak = m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes + m.temp_size_in_bytes
    row["peak GB/dev"] = peak / 1e9
    row["fits 80GB"] = "yes" if peak < GPU_BYTES else "no"
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--pairs", type=int, default=8)
    a = ap.parse_args()
    devices = jax.devices()
    on_cpu = jax.default_backend() == "cpu"
    if on_cpu and len(devices) < 8:
        raise SystemExit(f"needs 8 devices (XLA_FLAGS=--xla_force_host_platform_device_count=8), found {len(devices)}")
    base = {"loss": "dpo", "batch_size": a.pairs, "remat": True, "compute_dtype": "bfloat16"}
    bf16 = LLAMA_31_8B.replace(param_dtype="bfloat16")
    rows = []
    if len(devices) >= 8:  # on an accelerator: only with 8 of them
        rows += [
            plan("full DPO, fp32 master weights + fp32 reference, FSDP 8", LLAMA_31_8B, tconfig.resolve(base),
                 shd.make_mesh((1, 8, 1), devices[:8]), a.pairs, a.seq),
            plan("full DPO, bf16 weights/reference, FSDP 8", bf16, tconfig.resolve(base),
                 shd.make_mesh((1, 8, 1), devices[:8]), a.pairs, a.seq),
        ]
    rows.append(plan("LoRA r=256 a=512 q,k,v DPO, bf16 base, 1 device", bf16,
                     tconfig.resolve({**base, "batch_size": 1, "lora": {"enabled": True, "rank": 256, "alpha": 512.0,
                                                                         "targets": ("q", "k", "v"), "dropout": 0.05}}),
                     shd.make_mesh((1, 1, 1), devices[:1]), 1, a.seq))
    cols = ["case", "devices", "mesh", "pairs x seq", "trainable params", "state GB/dev (ideal)", "frozen GB/dev (ideal)",
            "argument GB", "temp GB", "peak GB/dev", "fits 80GB"]
    md = table(rows, cols)
    print(md)
    device = f"{devices[0].platform}:{devices[0].device_kind}"
    where = ("fake CPU devices; bytes from XLA's `compiled.memory_analysis()`). bf16 compute, per-layer remat, AdamW.\n"
             if on_cpu else f"{device}, that backend's own compiler and buffer assignment; bytes from XLA's\n"
             "`compiled.memory_analysis()`). bf16 compute, per-layer remat, AdamW.\n")
    text = (
        "# Memory plan: Llama-3.1-8B DPO steps (AOT, no allocation)\n\n"
        "Produced by `python -m benchmarks.memory_plan` (the trainer's own step, lowered with ShapeDtypeStructs on\n"
        + where + "peak = arguments + outputs - aliased (donated state) + temporaries, per device, against an 80 GB GPU.\n"
        + ("The CPU backend's buffer assignment is not the GPU's: treat this as a plan, check on the real device.\n"
           if on_cpu else "") + "\n" + md + "\n"
    )
    stem = "memory_plan" if on_cpu else "memory_plan_" + devices[0].device_kind.replace(" ", "_")
    Path("results").mkdir(exist_ok=True)
    Path(f"results/{stem}.md").write_text(text)
    write_result(stem, {"device": device, "rows": rows, "seq": a.seq, "pairs": a.pairs})


if __name__ == "__main__":
    main()
