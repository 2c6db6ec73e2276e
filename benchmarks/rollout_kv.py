"""Cross-turn KV reuse vs today's full prefill: full multi-turn rollouts on the synthetic world, the real policy.

    python -m benchmarks.rollout --kv [--workdir DIR] [--batches 1,8,32] [--episodes 128] [--sft-steps 300]
        [--paths today,stops,cascade,reuse,cascade+reuse,continuous,cont+cascade,cont+reuse,cont+cascade+reuse]
        [--n 1] [--temperature 0]
        [--cache-blocks 0,128]

The world: the synthetic pipeline's `tiny` preset (world, index, teacher, tokenizer) with the demo's model size
(d_model 128, 4 layers) trained by its SFT stage for --sft-steps (a reused --workdir skips what is done), so
episodes search and answer in plain ReAct lines. --n N samples N candidate actions per state (the first valid one is
taken: best-of-N's shape without a critic; use --temperature > 0, or the N are identical). Every path (PATHS:
today's sampler, + device stop ids, + cascade attention over the state's cache (N > 1), device stops + KV reuse (a
session pool of batch x N slots); the continuous slot pool of batch x N slots, copying a turn's prompt into its N
slots or reading it once per group (N > 1), and with KV sessions in the pool, copied or in groups) runs the same questions at each batch
size after a warm-up run (every shape compiled; `compiles` counts the compilations inside the timed run, 0 when the
warm-up met every shape). Per row: episodes/s, candidates/s (actions sampled), policy turns (a state's N candidates
are one turn), the prefill token slots computed per turn (padded, what the device ran) and the real prompt tokens
computed per turn (the appended ones on the reuse paths), the reuse paths' continuations and fallbacks (counted per
turn), whether the path took the first path's actions (same_actions; at T > 0 the lock-step paths draw per-call keys
and the pool per-request folds, so only paths of one kind sample alike), the decode batch's fill (tokens kept /
padded row-steps run: a row done early idles until its call's longest row is), the pool paths' decode chunks (host
round trips of the slot pool), and the time split: prefill (host
batch prep + prefill pass), decode, retrieval, host (tokenizer, rendering, parsing, engine). first_run_s: the
warm-up run's seconds (its compilations included; a path measured later at the same batch size reuses the shapes an
earlier one compiled). vs_pure_decode%: the run's new tokens (every candidate's) per second of its whole time / a
pure decode's at the same decode batch, batch distinct prompts x N rows each (benchmarks.peers.pure_decode: one-token
prompts, --max-new-tokens each at --temperature, no stop); vs_pure_decode_ctx%: the same against the decode alone of
distinct prompts as long as the first path's mean prompt (`context_per_turn`), the attention work a rollout's decode
cannot avoid. Before 2026-11-27 the prompts were identical, so the sampler prefilled one and every row of the batch
read it once (the cascade): a context-matched decode 1.2-1.3x faster than any batch of distinct states can run. The
bound of the workload itself: an ideal engine decodes the run's new tokens at that context-matched rate and prefills
the prompt tokens the path computes (the appended ones on the reuse paths) at `pure_prefill`'s rate (the cached
forward alone of that many tokens per row, batch rows, against the rest of the mean prompt held in the cache; no
padding, gathers or copies), with no host, retrieval or dispatch time. ceiling% = its decode time / its whole time
(what vs_pure_decode_ctx% would be for that engine), engine% = its time / the run's, so vs_pure_decode_ctx% =
ceiling% x engine% / 100.
--cache-blocks runs every path at each ModelConfig.cache_block given (0: attention reads the whole KV
cache each step; n: only its filled window, n slots at a time); without it, at the backend's default.
Writes results/bench/rollout_kv.json.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

from benchmarks.common import matmul_gflops, table, write_result
from jaxrag.compilation import compilation


PATHS = {   # (device stops, KV reuse, continuous pool, cascade)
    "today": (False, False, False, False),     # the sampler as it was: stop strings checked on the host every 16 steps
    "stops": (True, False, False, False),      # + one-token stop strings ended on device (JaxPolicy.device_stops)
    "cascade": (True, False, False, True),     # + N candidates read their state's cache once (JaxPolicy.cascade)
    "reuse": (True, True, False, False),       # stops + cross-turn KV reuse (a session pool of `batch` slots)
    "cascade+reuse": (True, True, False, True),  # both: a turn prefills what it appends, its N rows read it once
    "continuous": (True, False, True, False),  # the continuous-batching slot pool (RolloutConfig(continuous=True))
    "cont+cascade": (True, False, True, True),  # its slots in groups of N reading their turn's prompt once
    "cont+reuse": (True, True, True, False),   # + KV sessions in the slot pool (JaxPolicy(pool_sessions=True))
    "cont+cascade+reuse": (True, True, True, True)}   # sessions in groups: a turn appends once, its N slots read it once


def pipeline_config(preset: str = "tiny"):
    """The synthetic pipeline's config at `preset` (configs/synthetic/pipeline.py, read from the repository)."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "configs" / "synthetic" / "pipeline.py"
    spec = importlib.util.spec_from_file_location("synthetic_pipeline", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.get_config(preset)


def synthetic_world(workdir: Path, sft_steps: int):
    """(config, workdir): the tiny world and an SFT policy at the demo model size (stages already done are kept)."""
    from jaxrag import main as jmain

    config = pipeline_config()
    config.model.update(dict(d_model=128, n_layers=4, n_heads=4, n_kv_heads=4, head_dim=32, d_ff=384))
    config.sft.train.steps = sft_steps
    config.sft.train.optimizer.lr = 2e-3
    del config["sampler"]   # tiny's sampler floors are for its tiny model (and the bench builds its own policy)
    jmain.run(config, workdir, only=["world", "index", "teacher", "tokenizer", "sft"])
    return config


def measure(pol, retriever, agent, questions, rcfg) -> tuple[dict, list]:
    from jaxrag.env.rollout import rollout

    t0 = time.perf_counter()
    rollout(pol, retriever, agent, questions, rcfg)                  # warm-up: compiles every shape met below
    first = time.perf_counter() - t0
    pool = pol.sessions.stats if pol.sessions else pol.pool_stats if rcfg.continuous and pol.pool_sessions else None
    before = (dict(pol.timing), pol.prefill_tokens, dict(pool) if pool is not None else {}, pol.decode_slots,
              pol.decode_tokens, pol.pool_stats["chunks"])
    st: dict = {}
    n_compiled = compilation()[0]
    t0 = time.perf_counter()
    eps = rollout(pol, retriever, agent, questions, rcfg, stats=st)
    tot = time.perf_counter() - t0
    n_compiled = compilation()[0] - n_compiled
    turns = st["generations"] // rcfg.n_candidates     # states that sampled: a turn's N candidates are one turn
    pre = pol.timing["prefill_s"] - before[0]["prefill_s"]
    dec = pol.timing["decode_s"] - before[0]["decode_s"]
    real = sum(len(s.prompt_ids) for e in eps for s in e.steps if s.prompt)
    stats = {k: v - before[2].get(k, 0) for k, v in pool.items()} if pool is not None else {}
    if pool is not None:
        real = stats.get("appended_tokens", 0)
    row = {"batch": rcfg.batch_size, "episodes_per_s": len(eps) / tot, "candidates_per_s": st["generations"] / tot,
           "total_s": tot, "first_run_s": first, "compiles": n_compiled,
           "turns": turns,
           "turns_per_episode": turns / len(eps),
           "prefill_slots_per_turn": (pol.prefill_tokens - before[1]) / turns, "prompt_tokens_per_turn": real / turns,
           "context_per_turn": sum(len(s.prompt_ids) for e in eps for s in e.steps if s.prompt) / turns,
           "decode_fill%": 100 * (pol.decode_tokens - before[4]) / max(pol.decode_slots - before[3], 1),
           "prefill%": 100 * pre / tot, "decode%": 100 * dec / tot, "retrieve%": 100 * st["retrieve_s"] / tot,
           "host%": 100 * (tot - pre - dec - st["retrieve_s"] - st["summarize_s"]) / tot,
           "new_tokens_per_s": sum(len(s.token_ids) + sum(len(c["token_ids"]) for c in s.candidates)
                                   for e in eps for s in e.steps if s.prompt) / tot}   # every candidate's tokens
    if rcfg.continuous:
        row["chunks"] = pol.pool_stats["chunks"] - before[5]
    if pool is not None:
        per = rcfg.n_candidates if rcfg.continuous else 1   # the slot pool counts requests: N a turn
        row.update({k: stats.get(k, 0) // per for k in ("reused", "fallback_new", "fallback_not_prefix",
                                                         "fallback_evicted")})
    return row, eps


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--workdir", default="/tmp/jaxrag_bench_kv")
    ap.add_argument("--episodes", type=int, default=128)
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--sft-steps", type=int, default=300)
    ap.add_argument("--max-new-tokens", type=int, default=40)
    ap.add_argument("--paths", default=",".join(PATHS), help=f"which of {list(PATHS)} to run (the first is the base)")
    ap.add_argument("--n", type=int, default=1, help="candidate actions sampled per state")
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--cache-blocks", default=None, help="ModelConfig.cache_block values to run every path at")
    args = ap.parse_args(argv)
    unknown = [p for p in args.paths.split(",") if p not in PATHS]
    if unknown:
        ap.error(f"--paths: unknown {unknown}; choose from {list(PATHS)}")
    paths = {p: PATHS[p] for p in args.paths.split(",")}
    import jax

    from benchmarks.peers import pure_decode, pure_prefill
    from jaxrag.env.agents import get_agent
    from jaxrag.env.rollout import RolloutConfig
    from jaxrag.pipelines.synthetic.world import load_questions, load_tokenizer, make_retriever, stage_policy
    from jaxrag.sampling import SessionPool

    t0 = time.perf_counter()
    config = synthetic_world(Path(args.workdir), args.sft_steps)
    print(f"world + SFT ({args.sft_steps} steps): {time.perf_counter() - t0:.0f}s", flush=True)
    tok = load_tokenizer(args.workdir)
    retriever = make_retriever(config, args.workdir)
    questions = [q for split in ("test", "dev", "heldout") for q in load_questions(args.workdir, split)][:args.episodes]
    agent = get_agent("react", mode="plain")
    pol = stage_policy(args.workdir, "sft", tok)
    model_cfg = pol.cfg
    blocks = [int(x) for x in args.cache_blocks.split(",")] if args.cache_blocks else [model_cfg.cache_block]
    gflops = matmul_gflops()
    rows, prefill_rates = [], {}
    for i, b in enumerate(int(x) for x in args.batches.split(",")):
        if i:   # each batch size compiles its own shapes: drop the last one's programs (a process holding all of
            jax.clear_caches()   # them, 5 paths x 4 sizes, ran out of memory maps in LLVM's JIT at batch 64)
        acts, base = {}, None
        # the decode batch: N rows per live episode
        pure = pure_decode(pol, b, args.max_new_tokens, n=args.n, temperature=args.temperature)
        for (path, (stops, reuse, cont, cascade)), block in [(p, k) for p in paths.items() for k in blocks]:
            pol.cfg = model_cfg.replace(cache_block=block)
            name = path if len(blocks) == 1 else f"{path} block {block}"
            rcfg = RolloutConfig(k=config.index.k, max_steps=8, batch_size=b, max_new_tokens=args.max_new_tokens,
                                 reward="em", seed=config.seed, continuous=cont, n_candidates=args.n,
                                 temperature=args.temperature)
            pol.device_stops, pol.cascade = stops, cascade
            pol.sessions = SessionPool(pol.cfg, b * args.n, pol.cfg.max_seq_len) if reuse and not cont else None
            pol.pool_sessions = reuse and cont
            row, eps = measure(pol, retriever, agent, questions, rcfg)
            acts[name] = [[s.action.raw for s in e.steps] for e in eps]
            if base is None:   # the decoder at the backend's default cache attention
                base, pol.cfg = row["episodes_per_s"], model_cfg
                pure_ctx = pure_decode(pol, b, args.max_new_tokens, context=round(row["context_per_turn"]),
                                       n=args.n, temperature=args.temperature)
            appended = round(row["prompt_tokens_per_turn"])
            held = max(round(row["context_per_turn"]) - appended, 0)
            spec = (b, appended, held, pol.cfg.cache_block)
            if spec not in prefill_rates:   # one prefill a state: its N candidates share it
                prefill_rates[spec] = pure_prefill(pol, b, appended, held)
            decode_s = row["new_tokens_per_s"] * row["total_s"] / pure_ctx
            ideal_s = decode_s + row["prompt_tokens_per_turn"] * row["turns"] / prefill_rates[spec]
            row.update(speedup=row["episodes_per_s"] / base, pure_decode_tokens_per_s=pure,
                       pure_decode_ctx_tokens_per_s=pure_ctx, pure_prefill_tokens_per_s=prefill_rates[spec],
                       **{"vs_pure_decode%": 100 * row["new_tokens_per_s"] / pure,
                          "vs_pure_decode_ctx%": 100 * row["new_tokens_per_s"] / pure_ctx,
                          "ceiling%": 100 * decode_s / ideal_s, "engine%": 100 * ideal_s / row["total_s"]},
                       same_actions=sum(x == y for x, y in zip(next(iter(acts.values())), acts[name])) / len(questions))
            rows.append({"path": name, "cache_block": block, **row})
            print(f"  {name} batch {b}: {row['episodes_per_s']:.2f} ep/s", flush=True)
        pol.cfg = model_cfg
    cols = ["path", "batch", "episodes_per_s", "candidates_per_s", "speedup", "total_s", "first_run_s",
            "turns_per_episode", "prefill_slots_per_turn", "prompt_tokens_per_turn", "decode_fill%", "prefill%",
            "decode%", "retrieve%", "host%", "reused", "fallback_new",
            "fallback_not_prefix", "fallback_evicted", "same_actions", "context_per_turn", "new_tokens_per_s",
            "pure_decode_tokens_per_s", "vs_pure_decode%", "pure_decode_ctx_tokens_per_s", "vs_pure_decode_ctx%",
            "pure_prefill_tokens_per_s", "ceiling%", "engine%", "chunks", "compiles"]
    print(table(rows, cols))
    print(f"jitted 2048x2048 fp32 matmul: {gflops:.1f} GFLOP/s")
    out = write_result("rollout_kv", {"episodes": len(questions), "agent": "react/plain", "k": config.index.k,
                                      "world": "synthetic tiny", "sft_steps": args.sft_steps,
                                      "max_new_tokens": args.max_new_tokens, "matmul_gflops": gflops,
                                      "n_candidates": args.n, "temperature": args.temperature,
                                      "model": {"d_model": pol.cfg.d_model, "n_layers": pol.cfg.n_layers,
                                                "max_seq_len": pol.cfg.max_seq_len}, "rows": rows})
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
