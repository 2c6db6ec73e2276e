"""Rollouts over many devices: the decode step and the training step on 1 / 2 / 4 / 8 devices of a (1, n, 1) mesh.

    python -m benchmarks.scale [--preset small|tiny|quick|1b|8b] [--devices 1,2,4,8] [--rows 32] [--prompt 64]
        [--new 16] [--repeats 3]

Per device count n (the first n devices; on CPU, 8 fake devices made with --xla_force_host_platform_device_count,
which share this machine's cores: their wall times show the partitioned program's overhead, not a speedup), two
decode layouts measured side by side:
- "rows split": generate's decode layout (rows over data x fsdp, weights whole on every device as
  generate.place_for_decode chooses them without a memory limit; KV cache B/n rows a device);
- "replicated": the layout before it, every device holding and decoding every row, with the RL trainer's
  fsdp-sharded weights (what the sampler read in an RL step): each step gathers the weights.
Columns: rows per device; collective bytes of the compiled decode program (the ops in its loop run every step,
so this is the bytes moved per decode step) and of the trainer's compiled step (jaxrag.train.learner.build at
mesh (1, n, 1), one batch of --rows x 2*--prompt tokens; its scan over layers counted once per layer: bytes per
step); the decode program's memory per device (XLA's
compiled memory_analysis: arguments + temporaries; outputs alias the donated cache); the wall seconds of
--new decode steps of every row (median of --repeats, compiled beforehand). Writes results/bench/scale.json.
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import time


def _fake_devices(n: int) -> None:
    """On CPU, ask XLA for n host devices (before jax creates its backend)."""
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={n}".strip()


_BYTES = {"pred": 1, "s8": 1, "u8": 1, "bf16": 2, "f16": 2, "s16": 2, "u16": 2, "f32": 4, "s32": 4, "u32": 4,
          "f64": 8, "s64": 8, "u64": 8}
_COLLECTIVE = re.compile(r"= (.*?) (all-gather|all-reduce|all-to-all|collective-permute|reduce-scatter)(-start)?\(")


def collective_bytes(hlo_text: str, loops: bool = False) -> dict[str, int]:
    """Bytes of the results of each kind of collective in a compiled (partitioned: per device) HLO module. A
    collective inside a while loop counts once (the bytes of one iteration), or with `loops`, once per iteration
    of every enclosing loop whose trip count XLA knows (a training step's scan over layers: bytes per step)."""
    out: dict[str, int] = {}
    for name, body in _computations(hlo_text).items():
        times = _multipliers(hlo_text).get(name, 1) if loops else 1
        for shapes, op, _ in _COLLECTIVE.findall(body):
            n = sum(_BYTES.get(dt, 4) * _prod(dims) for dt, dims in re.findall(r"(\w+)\[([\d,]*)\]", shapes))
            out[op] = out.get(op, 0) + times * n
    return out


_HEADER = re.compile(r"^(ENTRY )?%?([\w.\-]+) .*\{$", re.M)
_CALLEE = re.compile(r"(?:calls|to_apply|body|condition|branch_computations)=\{?%([\w.\-]+)")
_WHILE = re.compile(r"while\(.*?body=%([\w.\-]+).*?\"known_trip_count\":\{\"n\":\"(\d+)\"")


def _computations(hlo_text: str) -> dict[str, str]:
    """Computation name -> its text (the entry computation under the key "ENTRY")."""
    heads = list(_HEADER.finditer(hlo_text))
    out = {}
    for i, h in enumerate(heads):
        end = heads[i + 1].start() if i + 1 < len(heads) else len(hlo_text)
        out["ENTRY" if h.group(1) else h.group(2)] = hlo_text[h.end():end]
    return out


def _multipliers(hlo_text: str) -> dict[str, int]:
    """Computation name -> how many times it runs per call of the entry computation (known loop trip counts)."""
    comps = _computations(hlo_text)
    times, todo = {"ENTRY": 1}, ["ENTRY"]
    while todo:
        name = todo.pop()
        body = comps.get(name, "")
        trips = {b: int(n) for b, n in _WHILE.findall(body)}
        for callee in _CALLEE.findall(body):
            t = times[name] * trips.get(callee, 1)
            if t > times.get(callee, 0):
                times[callee] = t
                todo.append(callee)
    return times


def _prod(dims: str) -> int:
    n = 1
    for d in dims.split(","):
        if d:
            n *= int(d)
    return n


def decode_args(cfg, B: int, P: int, N: int, mesh, rows_split: bool):
    """(cache, state, stop ids, keys) of a decode halfway placed: B rows whose prompts fill P slots of P + N."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec

    from jaxrag.sampling import generate as G

    cache = G.init_cache(cfg, B, P + N)
    cache["valid"] = jnp.asarray(np.arange(P + N)[None].repeat(B, 0) < P)
    cache["index"] = jnp.asarray(P, jnp.int32)
    state = {"logits": jnp.zeros((B, cfg.vocab_size)), "tokens": jnp.zeros((B, N), jnp.int32),
             "logprobs": jnp.zeros((B, N)), "lengths": jnp.zeros(B, jnp.int32),
             "position": jnp.full((B,), P, jnp.int32), "done": jnp.zeros(B, bool), "stopped": jnp.zeros(B, bool),
             "t": jnp.zeros((), jnp.int32)}
    keys, stop = G.row_keys(jax.random.PRNGKey(0), B), jnp.asarray([-1], jnp.int32)
    if rows_split:
        (cache, state, keys), stop = G.on_params_mesh(None, (cache, state, keys), stop, mesh)
        return cache, state, stop, keys
    rep = NamedSharding(mesh, PartitionSpec())
    return jax.device_put((cache, state, stop, keys), rep)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="small", help="small | tiny | a benchmarks.model preset (quick, cpu, 1b, 8b)")
    ap.add_argument("--devices", default="1,2,4,8")
    ap.add_argument("--rows", type=int, default=32, help="decode rows (B), also the training batch")
    ap.add_argument("--prompt", type=int, default=64, help="prompt slots filled per row")
    ap.add_argument("--new", type=int, default=16, help="decode steps timed (new tokens a row)")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    counts = [int(x) for x in args.devices.split(",")]
    if os.environ.get("JAX_PLATFORMS", "cpu") == "cpu":
        _fake_devices(max(counts))

    import jax
    import numpy as np

    from jaxrag import sharding as shd

    from jaxrag.sampling import generate as G
    from benchmarks.common import matmul_gflops, table, write_result
    from benchmarks.model import PRESETS, device_name
    from jaxrag.models import ModelConfig, init_params, param_logical_axes, unstack_layers
    from jaxrag.train import config as tconfig
    from jaxrag.train.batching import SFTExample, sft_batch
    from jaxrag.train.learner import build
    from jaxrag.train.state import init_state, put

    small = ModelConfig(model_type="llama", vocab_size=2048, d_model=256, n_layers=4, n_heads=8, n_kv_heads=4,
                        head_dim=32, d_ff=512, max_seq_len=512)
    own = {"small": small, "tiny": small.replace(vocab_size=256, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2,
                                                 head_dim=16, d_ff=128)}
    cfg = own[args.preset] if args.preset in own else PRESETS[args.preset].cfg.replace(dtype=PRESETS[args.preset].dtype)
    B, P, N = args.rows, args.prompt, args.new
    if len(jax.devices()) < max(counts):
        raise SystemExit(f"benchmarks.scale: {len(jax.devices())} devices; --devices asks for {max(counts)}")
    params = init_params(cfg, jax.random.PRNGKey(0))
    sp = G.SamplingParams(temperature=0.0, max_new_tokens=N)
    rng = np.random.default_rng(0)
    train_batch = sft_batch([SFTExample(list(rng.integers(1, cfg.vocab_size, P)), list(rng.integers(1, cfg.vocab_size, P)))
                             for _ in range(B)], (2 * P,))
    print(f"[bench] {device_name()} x {len(jax.devices())}; preset {args.preset}: {cfg.n_layers} layers, d_model "
          f"{cfg.d_model}; {B} rows x ({P} prompt + {N} new)", flush=True)
    rows = []
    for n in counts:
        mesh = shd.make_mesh((1, n, 1), jax.devices()[:n])
        tc = tconfig.resolve({"mesh": (1, n, 1), "batch_size": B, "seq_buckets": (2 * P,)})
        tr = build(cfg, params, tc, mesh=mesh)
        state = init_state(put(tr.trainable, tr.state_sh["trainable"]), tr.tx, 0, tr.state_sh)
        frozen = put(tr.frozen, tr.frozen_sh)
        train_text = tr.step_fn.lower(state, frozen, shd.shard_batch(mesh, train_batch)).compile().as_text()
        train_coll = sum(collective_bytes(train_text, loops=True).values())
        fsdp = jax.device_put(params, shd.param_shardings(mesh, params, param_logical_axes(cfg)))
        split, _ = G.place_for_decode(cfg, params, mesh)
        for name, p, rows_split in (("rows split", split, True), ("replicated", fsdp, False)):
            p = unstack_layers(p)
            m = mesh if rows_split else None
            compiled = G._decode_chunk.lower(cfg, sp, N, p, *decode_args(cfg, B, P, N, mesh, rows_split),
                                             mesh=m).compile()
            coll = collective_bytes(compiled.as_text())
            mem = compiled.memory_analysis()
            times = []
            for _ in range(args.repeats):
                a = decode_args(cfg, B, P, N, mesh, rows_split)
                jax.block_until_ready(a)
                t0 = time.perf_counter()
                jax.block_until_ready(compiled(p, *a))
                times.append(time.perf_counter() - t0)
            row = {"devices": n, "layout": name, "rows/device": B // n if rows_split else B,
                   "decode coll. KB/step": sum(coll.values()) / 1e3,
                   "gathered KB/step": coll.get("all-gather", 0) / 1e3,
                   "train coll. MB/step": train_coll / 1e6,
                   "decode MB/device": (mem.argument_size_in_bytes + mem.temp_size_in_bytes) / 1e6,
                   f"{N} steps s": statistics.median(times)}
            rows.append(row)
            print(table([row], list(row)), flush=True)
    cols = list(rows[0])
    print(table(rows, cols))
    gflops = matmul_gflops() if jax.default_backend() == "cpu" else None
    if gflops:
        print(f"jitted 2048x2048 fp32 matmul: {gflops:.1f} GFLOP/s; fake CPU devices share {os.cpu_count()} cores")
    out = write_result("scale", {"device": device_name(), "devices_available": len(jax.devices()),
                                 "preset": args.preset, "rows": B, "prompt": P, "new": N, "repeats": args.repeats,
                                 "fake_cpu_devices": jax.default_backend() == "cpu", "matmul_gflops": gflops,
                                 "table": rows})
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
