"""Cross-turn KV reuse by agent design: the prompt tokens each turn must prefill, extensions only vs shared prefix.

    python -m benchmarks.prefix_reuse [--workdir DIR] [--episodes 128] [--designs react,search-o1,...]
        [--modes plain,chat] [--replay react/chat,react/plain] [--batch 16] [--new-tokens 8]
        [--mcts N [--mcts-iterations I]] [--values N [--values-n 4 --values-m 4]]

The world: the synthetic pipeline's `tiny` preset (world, index, teacher, tokenizer; no training). Its teacher's
multi-turn episodes (train split, the first --episodes) are rendered turn by turn by each design in each mode and
encoded by the world's tokenizer (one BOS), the teacher's action as the turn's completion (agent.format + its stop
string, encoded as the SFT data encodes it: what a policy trained on it generates).

Part 1, token accounting (host only), per design x mode, over every transition (turn t -> t + 1 of one episode):
`extend%` the share whose next prompt extends prompt + completion (sessions.extends: reused in full),
`shared%` the share that does not but keeps a common prefix of >= 16 ids (sessions.shared_prefix), and the
prompt tokens a turn prefills: `full` (no sessions), `extensions` (sessions, min_shared = 0: jaxrag before shared
prefixes) and `shared` (min_shared = 16, the default), with `saved` = 1 - shared / full.

Part 2, replay through the slot pool (the real sampler on a random model of the demo's size, the world's vocab):
the same episodes' prompts, --batch episodes at a time, each turn's prompts submitted to one SlotPool with the
episode as the session (greedy, --new-tokens per turn; what the model generates is not the teacher's action, so
a plain-mode prompt never extends the held ids here: only the shared-prefix path reuses), turns/s and the pool's
prefill token slots and appended tokens per turn for: no sessions, sessions with extensions only, sessions with
shared prefixes, each timed on a second run (the first compiles every shape it meets).
Part 3 (--mcts N): ReasonRAG MCTS on N questions of benchmarks.rollout --kv's world with its SFT policy, rollouts through
the slot pool with KV sessions, without and with the prefix cache, and with expansions through the pool too
(`mcts_rows`; requests and prefill then count the expansions' samples as well).
Part 4 (--values N): rollout values (M continuations of each candidate) of the states a ranking collection over N
questions of that world recorded, through the pool with KV sessions, without and with the prefix cache (`values_rows`).
Writes results/bench/prefix_reuse.json.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from benchmarks.common import matmul_gflops, table, write_result

DESIGNS = ("react", "search-o1", "re2search", "reasonrag", "smartsearch")


def tiny_world(workdir: Path):
    """The tiny preset's world, index, teacher and tokenizer (stages already done are kept); its config."""
    from jaxrag import main as jmain
    from benchmarks.rollout_kv import pipeline_config

    config = pipeline_config()
    jmain.run(config, workdir, only=["world", "index", "teacher", "tokenizer"])
    return config


def turns_of(episode, agent, tok) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, completion ids) of each turn of a teacher episode rendered by `agent`."""
    from jaxrag.data.synthetic.sft_data import step_pairs

    return [(tok.encode(p, add_bos=True), tok.encode(t)) for p, t in step_pairs(episode, agent)]


def account(episodes, agent, tok) -> dict:
    """Part 1 for one design x mode (module doc)."""
    from jaxrag.sampling import extends, shared_prefix

    n = ext = shared = 0
    full = only_ext = with_shared = 0
    for ep in episodes:
        turns = turns_of(ep, agent, tok)
        full += sum(len(p) for p, _ in turns)
        only_ext += len(turns[0][0])
        with_shared += len(turns[0][0])
        for (p, c), (q, _) in zip(turns, turns[1:]):
            held = p + c
            n += 1
            e, s = extends(held, q), shared_prefix(held, q)
            ext += e
            shared += bool(s) and not e
            only_ext += len(q) - (len(held) if e else 0)
            with_shared += len(q) - s
    n_turns = sum(len(ep.steps) for ep in episodes)
    return {"transitions": n, "extend%": 100 * ext / max(n, 1), "shared%": 100 * shared / max(n, 1),
            "prompt_tokens_per_turn": full / n_turns, "full": full / n_turns, "extensions": only_ext / n_turns,
            "shared": with_shared / n_turns, "saved%": 100 * (1 - with_shared / full)}


def replay(model_cfg, params, turns_by_episode, batch: int, new_tokens: int, sessions: bool, min_shared: int,
           pool_tokens: int) -> dict:
    """Part 2 for one variant: every episode's prompts through one SlotPool, `batch` episodes at a time."""
    import jax

    from jaxrag.sampling import SamplingParams, SlotPool

    pool = SlotPool(model_cfg, params, batch, pool_tokens, SamplingParams(max_new_tokens=new_tokens),
                    jax.random.PRNGKey(0), sessions=sessions, min_shared=min_shared, setting="--pool-tokens")
    t0, turns = time.perf_counter(), 0
    for lo in range(0, len(turns_by_episode), batch):
        group = dict(enumerate(turns_by_episode[lo:lo + batch], lo))
        for t in range(max(len(v) for v in group.values())):
            live = [e for e, v in group.items() if t < len(v)]
            for e in live:
                pool.submit((e, t), group[e][t][0], (e, t), session=e if sessions else None)
            while pool.busy:
                pool.step()
            turns += len(live)
            if sessions:
                pool.release([e for e in live if t + 1 == len(group[e])])
    total = time.perf_counter() - t0
    st = pool.stats
    return {"turns_per_s": turns / total, "total_s": total, "prefill_slots_per_turn": st["prefill_tokens"] / turns,
            "prompt_tokens_per_turn": (st["appended_tokens"] if sessions else
                                       sum(len(p) for v in turns_by_episode for p, _ in v)) / turns,
            "reused": st["reused"], "reused_partial": st["reused_partial"], "fallbacks": st["fallback_not_prefix"],
            "insert%": 100 * pool.timing["insert_s"] / total, "decode%": 100 * pool.timing["decode_s"] / total}


def sft_world(workdir: Path, questions: int):
    """(config, tokenizer, retriever, the first `questions` train questions) of benchmarks.rollout --kv's world (its SFT
    policy trained for 300 steps if not yet done)."""
    from benchmarks.rollout_kv import synthetic_world
    from jaxrag.pipelines.synthetic.world import load_questions, load_tokenizer, make_retriever

    config = synthetic_world(workdir, 300)
    items = load_questions(workdir, "train")[:questions]
    return config, load_tokenizer(workdir), make_retriever(config, workdir), items


def pool_policy(workdir: Path, tok, cache: bool):
    """A fresh copy of that world's SFT policy, KV sessions in its slot pool, the prefix cache on or off."""
    from jaxrag.pipelines.synthetic.world import stage_policy

    pol = stage_policy(workdir, "sft", tok)
    pol.pool_sessions, pol.prefix_cache = True, cache
    return pol


def mcts_rows(workdir: Path, questions: int, iterations: int, batch: int) -> list[dict]:
    """Part 3 (--mcts): ReasonRAG MCTS (PolicyTreeEnv, continuous rollouts with KV sessions) over the benchmarks.rollout
    --kv world's SFT policy and its questions, with and without the prefix cache: rollouts/s, the pool's prefill
    token slots per rollout, the forks from cached rows. Each variant runs twice (the first compiles)."""
    from jaxrag.env.agents import get_agent
    from jaxrag.supervision.mcts import MCTSConfig, run_mcts
    from jaxrag.supervision.mcts_env import PolicyTreeEnv

    config, tok, retriever, items = sft_world(workdir, questions)
    mcfg = MCTSConfig(max_iterations=iterations, rollouts_per_node=2, value_scheme="paper")
    rows = []
    for name, cache, expansions in (("pool + sessions", False, False), ("+ prefix cache", True, False),
                                    ("+ expansions in the pool", True, True)):
        for timed in (False, True):
            pol = pool_policy(workdir, tok, cache)
            env = PolicyTreeEnv(pol, retriever, get_agent("react", mode="plain"), k=config.index.k, batch_size=batch,
                                max_new_tokens=40, continuous=True, pool_expansions=expansions, seed=1)
            t0 = time.perf_counter()
            trees = run_mcts(env, items, mcfg)
            total = time.perf_counter() - t0
        st = pol.pool_stats
        rollouts = sum(len(n.samples) for t in trees for n in t.nodes)   # own rollouts of every node
        rows.append({"path": name, "trees": len(trees), "nodes": sum(len(t.nodes) for t in trees),
                     "rollouts": rollouts, "rollouts_per_s": rollouts / total, "total_s": total,
                     "requests": st["finished"],
                     "prefill_slots_per_request": st["prefill_tokens"] / max(st["finished"], 1),
                     "reused": st["reused"], "reused_cached": st["reused_cached"],
                     "prefix_shared": st["prefix_shared"], "prefix_shared_tokens": st["prefix_shared_tokens"],
                     "dropped_cached": st["dropped_cached"], "evicted": st["evicted"],
                     "prefill_s": pol.timing["prefill_s"], "decode_s": pol.timing["decode_s"]})
        print(f"  mcts {name}: {rows[-1]['rollouts_per_s']:.1f} rollouts/s", flush=True)
    return rows


def values_rows(workdir: Path, questions: int, n: int, m: int, batch: int) -> list[dict]:
    """Part 4 (--values): Math-Shepherd rollout values (supervision/rollout_values, continuous, KV sessions in the
    pool) of the states a ranking collection over the benchmarks.rollout --kv world's SFT policy recorded (N candidates
    at T = 1, the oracle judge), M continuations each, without and with the prefix cache (which shares a state's
    history among its candidates' first prompts within one insert): seconds, prefill token slots per request, the
    shared heads. Each variant runs twice (the first compiles); the records are collected once."""
    from jaxrag.env.agents import get_agent
    from jaxrag.supervision.judges import OracleJudge
    from jaxrag.supervision.ranking import RankingConfig, collect_ranking
    from jaxrag.supervision.rollout_values import RolloutValueConfig, rollout_values

    config, tok, retriever, items = sft_world(workdir, questions)
    agent = get_agent("react", mode="plain")
    k = config.index.k
    records, _ = collect_ranking(pool_policy(workdir, tok, False), retriever, agent, OracleJudge(retriever, k), items,
                                 RankingConfig(n_candidates=n, max_steps=4, k=k, batch_size=batch, max_new_tokens=40))
    vcfg = RolloutValueConfig(m=m, temperature=1.0, metric="em", max_steps=4, k=k, batch_size=batch,
                              max_new_tokens=40, continuous=True)
    rows = []
    for name, cache in (("pool + sessions", False), ("+ prefix cache", True)):
        for timed in (False, True):
            pol = pool_policy(workdir, tok, cache)
            st: dict = {}
            t0 = time.perf_counter()
            rollout_values(pol, retriever, agent, records, vcfg, stats=st)
            total = time.perf_counter() - t0
        ps = pol.pool_stats
        rows.append({"path": name, "states": len(records), "candidates": st["candidates"],
                     "continuations": st["continuations"], "continuations_per_s": st["continuations"] / total,
                     "total_s": total, "requests": ps["finished"],
                     "prefill_slots_per_request": ps["prefill_tokens"] / max(ps["finished"], 1),
                     "prefix_shared": ps["prefix_shared"], "prefix_shared_tokens": ps["prefix_shared_tokens"],
                     "reused": ps["reused"], "reused_cached": ps["reused_cached"],
                     "prefill_s": pol.timing["prefill_s"], "decode_s": pol.timing["decode_s"]})
        print(f"  values {name}: {rows[-1]['continuations_per_s']:.1f} continuations/s", flush=True)
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--workdir", default="/tmp/jaxrag_bench_prefix")
    ap.add_argument("--episodes", type=int, default=128)
    ap.add_argument("--designs", default=",".join(DESIGNS))
    ap.add_argument("--modes", default="plain,chat")
    ap.add_argument("--replay", default="react/chat,reasonrag/chat,react/plain",
                    help="design/mode pairs replayed through the pool")
    ap.add_argument("--batch", type=int, default=16, help="episodes (pool slots) at a time in the replay")
    ap.add_argument("--new-tokens", type=int, default=8, help="tokens generated per turn in the replay")
    ap.add_argument("--mcts", type=int, default=0, help="also run MCTS on this many questions (needs the SFT world)")
    ap.add_argument("--mcts-iterations", type=int, default=6)
    ap.add_argument("--mcts-workdir", default="/tmp/jaxrag_bench_kv")
    ap.add_argument("--values", type=int, default=0,
                    help="also run rollout values of a ranking collection's states on this many questions (SFT world)")
    ap.add_argument("--values-n", type=int, default=4, help="candidates per state (--values)")
    ap.add_argument("--values-m", type=int, default=4, help="continuations per candidate (--values)")
    args = ap.parse_args(argv)
    import jax

    from jaxrag.env.agents import get_agent
    from jaxrag.env.mdp import read_episodes
    from jaxrag.models.config import ModelConfig
    from jaxrag.models.transformer import init_params
    from jaxrag.pipelines.synthetic.world import load_tokenizer

    workdir = Path(args.workdir)
    tiny_world(workdir)
    tok = load_tokenizer(workdir)
    episodes = [e for e in read_episodes(workdir / "teacher" / "episodes_train.jsonl") if len(e.steps) > 1]
    episodes = episodes[:args.episodes]
    rows = []
    for design in args.designs.split(","):
        for mode in args.modes.split(","):
            agent = get_agent(design, mode=mode, tokenizer=tok)
            rows.append({"design": design, "mode": mode, **account(episodes, agent, tok)})
    print(f"{len(episodes)} teacher episodes of more than one turn ({sum(len(e.steps) for e in episodes)} turns)")
    print(table(rows, ["design", "mode", "transitions", "extend%", "shared%", "prompt_tokens_per_turn", "full",
                       "extensions", "shared", "saved%"]))

    replays = []
    for pair in [p for p in args.replay.split(",") if p]:
        design, mode = pair.split("/")
        agent = get_agent(design, mode=mode, tokenizer=tok)
        turns = [turns_of(e, agent, tok) for e in episodes]
        longest = max(len(p) for v in turns for p, _ in v)
        pool_tokens = -(-(longest + args.new_tokens) // 64) * 64
        cfg = ModelConfig(vocab_size=tok.vocab_size, d_model=128, n_layers=4, n_heads=4, n_kv_heads=4, head_dim=32,
                          d_ff=384, max_seq_len=pool_tokens, bos_id=tok.bos_id, eos_ids=tok.eos_ids,
                          pad_id=tok.pad_id)
        params = init_params(cfg, jax.random.PRNGKey(0))
        for name, sessions, min_shared in (("no sessions", False, 0), ("extensions", True, 0),
                                           ("shared prefix", True, 16)):
            replay(cfg, params, turns, args.batch, args.new_tokens, sessions, min_shared, pool_tokens)   # compiles
            row = replay(cfg, params, turns, args.batch, args.new_tokens, sessions, min_shared, pool_tokens)
            replays.append({"design": design, "mode": mode, "path": name, "pool_tokens": pool_tokens, **row})
            print(f"  replay {pair} {name}: {row['turns_per_s']:.1f} turns/s", flush=True)
    if replays:
        base = {(r["design"], r["mode"]): r["turns_per_s"] for r in replays if r["path"] == "no sessions"}
        for r in replays:
            r["speedup"] = r["turns_per_s"] / base[(r["design"], r["mode"])]
        print(table(replays, ["design", "mode", "path", "turns_per_s", "speedup", "prompt_tokens_per_turn",
                              "prefill_slots_per_turn", "reused", "reused_partial", "fallbacks", "insert%",
                              "decode%", "pool_tokens"]))
    mcts = mcts_rows(Path(args.mcts_workdir), args.mcts, args.mcts_iterations, args.batch) if args.mcts else []
    if mcts:
        print(table(mcts, ["path", "trees", "nodes", "rollouts", "rollouts_per_s", "total_s", "requests",
                           "prefill_slots_per_request", "reused", "reused_cached", "prefix_shared",
                           "prefix_shared_tokens", "dropped_cached", "evicted",
                           "prefill_s", "decode_s"]))
    values = values_rows(Path(args.mcts_workdir), args.values, args.values_n, args.values_m, args.batch) \
        if args.values else []
    if values:
        print(table(values, ["path", "states", "candidates", "continuations", "continuations_per_s", "total_s",
                             "requests", "prefill_slots_per_request", "prefix_shared", "prefix_shared_tokens",
                             "reused", "reused_cached", "prefill_s", "decode_s"]))
    gflops = matmul_gflops()
    print(f"jitted 2048x2048 fp32 matmul: {gflops:.1f} GFLOP/s")
    out = write_result("prefix_reuse", {"episodes": len(episodes), "world": "synthetic tiny (teacher, train split)",
                                        "batch": args.batch, "new_tokens": args.new_tokens, "matmul_gflops": gflops,
                                        "accounting": rows, "replay": replays, "mcts": mcts, "values": values,
                                        "turns": int(np.sum([len(e.steps) for e in episodes]))})
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
