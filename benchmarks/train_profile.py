"""Where a training step's time goes, on whatever backend JAX finds: the trainer's own step (benchmarks.model's row),
its loss's forward and forward+backward alone, and variants that each change one thing; with --profile, the
step's device kernels from a jax.profiler trace, grouped by kind (matmul, attention, fusion, ...) and by name.

    python -m benchmarks.train_profile [--preset quick|cpu|1b] [--variants step,forward,grad,...] [--profile DIR]

Variants (the sft loss over every token; `grad` is value_and_grad of the same loss as `step`, no optimizer):
- step: `jaxrag.train.learner.build`'s jitted train step (AdamW, fp32 master weights, compute in the preset's dtype);
- forward: the loss alone; grad: loss and gradient;
- grad_nomask: no segment ids (one unpadded segment per row: the attention takes no mask);
- grad_bf16: weights held in bf16 (no fp32 master copy to cast per layer, bf16 gradients);
- grad_scan / grad_unrolled: the stacked layers under lax.scan / unrolled over their slices (ModelConfig.scan_layers;
  the default unrolls on a GPU only); grad_unstacked: layers held as a tuple of per-layer arrays;
- grad_fullhead: the LM head over all rows at once (no chunked, rematerialized head);
- grad_remat: every layer rematerialized.
The rows report tokens/s and each variant's time over `forward`'s; the profile's kernel table reports ms per step.
Writes results/bench/train_profile_<preset>.json (and, with --profile, the trace under DIR). To look a hot fusion up
by name, dump the step's optimized HLO too: XLA_FLAGS="--xla_dump_to=D --xla_dump_hlo_module_re=.*step.*".
"""

from __future__ import annotations

import argparse
import collections
import glob
import os
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from jaxrag import losses
from benchmarks.common import table, time_it, write_result
from benchmarks.model import PRESETS, device_name, forward_flops, jax_train_step
from jaxrag.models import forward_hidden, init_params
from jaxrag.models.transformer import unstack_layers
from jaxrag.train.objectives import MAX_LOGITS, head_logprobs

VARIANTS = ("forward", "step", "grad", "grad_nomask", "grad_bf16", "grad_scan", "grad_unrolled", "grad_unstacked",
            "grad_fullhead", "grad_remat")
# a kernel's kind: the first whose keys its name contains (cuDNN's and cuBLAS's kernels, XLA's fusions by prefix)
KINDS = (("attention", ("fmha", "flash", "cudnn", "attention")),
         ("matmul", ("gemm", "nvjet", "cutlass", "xmma", "matmul", "dot")),
         ("scatter/gather", ("scatter", "gather")),
         ("copy", ("memcpy", "memset", "copy", "transpose", "dynamic-update-slice", "dynamic_update_slice")),
         ("reduce", ("reduce", "reduction")),
         ("fusion", ("fusion", "loop_", "input_", "wrapped_")))


def kernel_kind(name: str) -> str:
    low = name.lower()
    return next((kind for kind, keys in KINDS if any(k in low for k in keys)), "other")


def loss_fn(cfg, *, mask=True, max_logits=MAX_LOGITS, remat=False):
    """(params, batch) -> the sft token-mean loss, as the trainer's sft objective computes it."""

    def loss(params, batch):
        seg = batch["segment_ids"] if mask else None
        hidden = forward_hidden(cfg, params, batch["tokens"], batch["positions"], seg, remat=remat)
        logp = head_logprobs(cfg, params, hidden, batch["tokens"], 1.0, max_logits)
        return losses.sft_loss(logp, batch["loss_mask"])[0]

    return loss


def variant_fn(name, cfg, params, batch, remat):
    """A blocking () -> None for one variant (params and batch already on the device)."""
    if name == "step":
        return jax_train_step(cfg, params, batch["tokens"].shape[0], batch["tokens"].shape[1], remat)
    if name == "forward":
        f = jax.jit(loss_fn(cfg, remat=remat))
        return lambda: f(params, batch).block_until_ready()
    p = params
    kw = {"remat": remat or name == "grad_remat"}
    if name == "grad_nomask":
        kw["mask"] = False
    elif name == "grad_bf16":
        p = jax.tree.map(lambda w: w.astype(cfg.dtype), params)
    elif name in ("grad_scan", "grad_unrolled"):
        cfg = cfg.replace(scan_layers=name == "grad_scan")
    elif name == "grad_unstacked":
        p = unstack_layers(params)
    elif name == "grad_fullhead":
        kw["max_logits"] = 1 << 62
    g = jax.jit(jax.value_and_grad(loss_fn(cfg, **kw)))
    return lambda: jax.block_until_ready(g(p, batch))


def device_kernels(trace_dir: str, steps: int) -> tuple[list[dict], list[dict]]:
    """(kinds, kernels): device time per step by kernel kind and by kernel name, from the newest trace in
    trace_dir. Kernels, not XLA ops: on a GPU, XLA runs most of a step as CUDA graphs (command buffers), whose
    kernels all carry the command buffer's op name."""
    from jax.profiler import ProfileData

    paths = sorted(glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True), key=os.path.getmtime)
    if not paths:
        return [], []
    data = ProfileData.from_file(paths[-1])
    ns, count = collections.Counter(), collections.Counter()
    for plane in data.planes:
        if not plane.name.startswith("/device:"):
            continue
        for line in plane.lines:
            if plane.name.startswith("/device:GPU") and "stream" not in line.name.lower():
                continue  # GPU planes also hold summary lines; the streams hold each kernel once
            for ev in line.events:
                ns[ev.name] += ev.duration_ns
                count[ev.name] += 1
    total = sum(ns.values()) or 1
    by_kind = collections.Counter()
    for name, t in ns.items():
        by_kind[kernel_kind(name)] += t
    kinds = [{"kind": k, "ms/step": t / 1e6 / steps, "%": 100 * t / total} for k, t in by_kind.most_common()]
    top = [{"kernel": name[:80], "kind": kernel_kind(name), "calls/step": count[name] / steps,
            "ms/step": t / 1e6 / steps, "%": 100 * t / total} for name, t in ns.most_common(30)]
    return kinds, top


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", choices=("quick", "cpu", "1b"), default="quick")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--remat", action="store_true", help="rematerialize layers in every variant")
    ap.add_argument("--profile", default="", help="trace the train step into this folder and tabulate its kernels")
    ap.add_argument("--profile-steps", type=int, default=3)
    args = ap.parse_args(argv)
    names = [v for v in args.variants.split(",") if v]
    unknown = sorted(set(names) - set(VARIANTS))
    if unknown:
        ap.error(f"unknown variants {unknown}; choose from {list(VARIANTS)}")
    os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.92")
    pre = PRESETS[args.preset]
    cfg = pre.cfg.replace(dtype=pre.dtype)
    B, T = pre.batch, pre.seq
    params = init_params(cfg, jax.random.PRNGKey(0))
    ids = np.random.default_rng(0).integers(1, cfg.vocab_size, (B, T)).astype(np.int32)
    batch = {"tokens": jnp.asarray(ids), "positions": jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T)),
             "segment_ids": jnp.ones((B, T), jnp.int32), "loss_mask": jnp.ones((B, T), jnp.int32).at[:, 0].set(0)}
    print(f"[bench] {device_name()}; preset {args.preset}: {cfg.num_params() / 1e9:.2f}B params, {B} x {T} tokens, "
          f"compute {pre.dtype}, remat {args.remat}", flush=True)
    rows, base = [], None
    flops = forward_flops(cfg, B, T)
    for name in names:
        try:
            fn = variant_fn(name, cfg, params, batch, args.remat)
            t = time_it(fn, pre.repeats)
        except jax.errors.JaxRuntimeError as e:  # out of device memory: recorded, the other variants still run
            rows.append({"variant": name, "error": str(e).splitlines()[0][:160]})
            print(table(rows[-1:], ["variant", "error"]), flush=True)
            continue
        if name == "forward":
            base = t
        r = {"variant": name, "ms": 1e3 * t, "tok/s": B * T / t,
             "model TFLOP/s": (flops if name == "forward" else 3 * flops) / t / 1e12}
        if base:
            r["x forward"] = t / base
        rows.append(r)
        print(table([r], list(r)), flush=True)
        if name == "step" and args.profile:
            out = Path(args.profile)
            out.mkdir(parents=True, exist_ok=True)
            jax.profiler.start_trace(str(out / "trace"))
            for _ in range(args.profile_steps):
                fn()
            jax.profiler.stop_trace()
        del fn
    cols = ["variant", "ms", "tok/s", "model TFLOP/s", "x forward", "error"]
    print(f"\n{device_name()}, preset {args.preset}\n" + table(rows, [c for c in cols if any(c in r for r in rows)]))
    kinds, top = device_kernels(str(Path(args.profile) / "trace"), args.profile_steps) if args.profile else ([], [])
    if args.profile and not kinds:
        print("[bench] the trace holds no device plane (a CPU backend traces host threads only)")
    if kinds:
        print("\ntrain step, device time by kernel kind\n" + table(kinds, ["kind", "ms/step", "%"]))
        print("\ntop kernels\n" + table(top, ["kernel", "kind", "calls/step", "ms/step", "%"]))
    path = write_result(f"train_profile_{args.preset}", {"device": device_name(), "preset": args.preset, "batch": B,
                                                          "seq": T, "remat": args.remat, "rows": rows, "kinds": kinds,
                                                          "top_kernels": top})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
