"""Cascade decode against the copied fork: one decode step of n samples per prompt.

    python -m benchmarks.cascade [--preset cpu|quick|1b|8b] [--prompts 4] [--n 4,8] [--prompt-len 256,1024]
        [--new 64] [--steps 16]

RAG-Gym's N candidates a state, GRPO's G completions a question and MCTS's M rollouts a node all decode n rows
that continue one prompt. generate.sample's copied fork gives each of them a copy of the prompt's keys/values
(`fork`, a cache [U*n, P + new]); the cascade keeps the prompt once (`cascade_cache`: a prefix [U, P] and each
row's own [U*n, new]) and a decode step reads it once per group (`attend_shared`). Per (n, prompt length), at
--prompts U prompts and a step halfway through --new tokens: ms per step of each (median over --steps, the
cache donated as the sampler's is), XLA's bytes accessed per step, the cache's bytes, the speedup, and the
largest |logit| difference between the two (the same model, so float rounding only). Models: benchmarks.model's
presets (random weights, the preset's compute dtype and cache dtype). Writes results/bench/cascade.json.
"""
from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp

from benchmarks.common import matmul_gflops, table, write_result
from benchmarks.model import PRESETS, device_name, time_decode_step
from jaxrag.models import init_cache, init_params, unstack_layers


def caches(cfg, U: int, n: int, P: int, new: int, key) -> tuple[dict, dict]:
    """(the copied fork's cache, the cascade's), the state of a decode halfway through: U prompts of P tokens,
    n rows each holding new // 2 decoded tokens, random keys/values, the same values in both layouts (the fork's
    rows hold their prompt's copy, then their own slots)."""
    done, L = new // 2, cfg.n_layers
    own, prompt = init_cache(cfg, U * n, new), init_cache(cfg, U, P)
    draw = lambda bufs, keys: tuple(jax.random.normal(k, b.shape, b.dtype) for b, k in zip(bufs, keys))
    ks = jax.random.split(key, 4 * L)
    own.update(k=draw(own["k"], ks[:L]), v=draw(own["v"], ks[L:2 * L]), index=jnp.asarray(done, jnp.int32),
               valid=own["valid"].at[:, :done].set(True))
    shared = dict(own, prefix={"k": draw(prompt["k"], ks[2 * L:3 * L]), "v": draw(prompt["v"], ks[3 * L:]),
                               "valid": jnp.ones((U, P), bool)})
    group = jnp.repeat(jnp.arange(U), n)
    copy = lambda pre, mine: tuple(jnp.concatenate([a[group], b], axis=2) for a, b in zip(pre, mine))
    forked = {"k": copy(shared["prefix"]["k"], own["k"]), "v": copy(shared["prefix"]["v"], own["v"]),
              "valid": jnp.concatenate([jnp.ones((U * n, P), bool), own["valid"]], axis=1),
              "index": jnp.asarray(P + done, jnp.int32)}
    return forked, shared


def nbytes(cache: dict) -> int:
    return sum(x.nbytes for x in jax.tree.leaves(cache))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", choices=sorted(PRESETS), default="cpu")
    ap.add_argument("--prompts", type=int, default=4, help="distinct prompts (U)")
    ap.add_argument("--n", default="4,8", help="samples per prompt")
    ap.add_argument("--prompt-len", default="256,1024")
    ap.add_argument("--new", type=int, default=64, help="new tokens a sample may generate (the own slots)")
    ap.add_argument("--steps", type=int, default=16, help="timed decode steps per row (the median is kept)")
    args = ap.parse_args(argv)
    pre = PRESETS[args.preset]
    cfg = pre.cfg.replace(dtype=pre.dtype)
    params = unstack_layers(init_params(cfg, jax.random.PRNGKey(0)))
    print(f"[bench] {device_name()}; preset {args.preset}: {cfg.n_layers} layers, d_model {cfg.d_model}, kv heads "
          f"{cfg.n_kv_heads} x {cfg.head_dim}, compute {pre.dtype}", flush=True)
    rows, U = [], args.prompts
    for P in [int(x) for x in args.prompt_len.split(",")]:
        for n in [int(x) for x in args.n.split(",")]:
            forked, shared = caches(cfg, U, n, P, args.new, jax.random.PRNGKey(1))
            position = jnp.full((U * n,), P + args.new // 2, jnp.int32)
            sizes = (nbytes(forked), nbytes(shared))
            t_f, b_f, l_f = time_decode_step(cfg, params, forked, position, args.steps)
            t_c, b_c, l_c = time_decode_step(cfg, params, shared, position, args.steps)
            row = {"prompt": P, "n": n, "rows": U * n, "fork ms": 1e3 * t_f, "cascade ms": 1e3 * t_c,
                   "speedup": t_f / t_c, "fork GB accessed": b_f / 1e9, "cascade GB accessed": b_c / 1e9,
                   "bytes ratio": b_f / b_c, "fork cache MB": sizes[0] / 1e6, "cascade cache MB": sizes[1] / 1e6,
                   "max |dlogit|": float(jnp.abs(l_f - l_c).max())}
            rows.append(row)
            print(table([row], list(row)), flush=True)
    cols = list(rows[0])
    print(table(rows, cols))
    gflops = matmul_gflops() if jax.default_backend() == "cpu" else None
    if gflops:
        print(f"jitted 2048x2048 fp32 matmul: {gflops:.1f} GFLOP/s")
    out = write_result("cascade", {"device": device_name(), "preset": args.preset, "prompts": U, "new": args.new,
                                   "steps": args.steps, "matmul_gflops": gflops, "rows": rows})
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
