"""Rollout engine throughput: episodes/s vs batch size, and the share of time in generation / retrieval / host.

    python -m benchmarks.rollout [--jax] [--episodes 64] [--batches 1,2,4,8,16,32,64]
        [--new-tokens 16] [--stop-chars 0] [--temperature 0] [--no-fake]
    continuous vs lock-step where action lengths vary: --jax --new-tokens 128 --stop-chars 4 --temperature 1
    N candidates per state, continuous vs lock-step (one prefill per turn; its N rows read the state's cache once:
    cascade; and, as peers, each row copying it): --jax --candidates 5 [...]
    python -m benchmarks.rollout --kv [...]: cross-turn KV reuse vs full prefill (benchmarks/rollout_kv.py)

Policies measured in the same run:
- fake: a fixed per-call latency + per-token cost (models a device that saturates with batch);
- with --jax, the real JaxPolicy (jitted sampler, KV cache, host stop-string checks) over a small random Llama
  (2 layers, d_model 128, byte tokenizer). A random model's text is garbage (every episode would end Invalid
  at step 1), so its completions are generated and paid for, then replaced by a scripted ReAct line: every
  episode is 2 searches then an answer, for every policy. Two peers over the same JaxPolicy: "lock-step" (one
  generate call per engine step, the decode batch runs until its longest row is done) and "continuous"
  (RolloutConfig(continuous=True): a slot pool of batch_size slots, a finished turn's slot takes the next waiting
  prompt after every 16-step chunk; sampling.continuous). Action lengths: besides the agent's "\n", `--stop-chars`
  one-byte stop strings end a row (a random model emits each byte with probability about 1/259), so actions run a
  geometric number of tokens up to --new-tokens, as real actions of different lengths do.
  idle% = decode slot-steps that held no live row (a finished row waiting for its batch, padding rows, free
  slots) / all decode slot-steps run.
  vs_pure_decode% = the rollout's new tokens per second of its whole run (prefill, retrieval and host included)
  / a pure decode's at the same decode batch: `generate.sample` of batch distinct one-token prompts, N rows each,
  decoding --new-tokens tokens each at --temperature with no stop (`pure_decode`, timed after a warm-up): how close
  the engine comes to the decoder.
Retrieval: BM25 (bm25s) over the multihop contexts corpus (11k passages). Agent: plain ReAct, k = RolloutConfig's default.
Shares: gen = inside policy.generate (tok = the part of it in the tokenizer: encode, decode, stop strings),
ret = retriever.search, host = the rest of the engine (render, parse, bookkeeping).
Each path at each batch size first runs all the episodes once (jit compiles for its shapes), then is timed;
`compiles` = XLA compilations inside the timed run (0 when the warm-up met every shape).
The fake's per-token cost is fixed; the JaxPolicy's row shows what the CPU/accelerator really does. Writes results/bench/rollout.json.
"""
from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
import time
from typing import Sequence

from benchmarks.common import table, write_result
from benchmarks.peers import pure_decode
from jaxrag.compilation import compilation
from jaxrag.data.qa import load_qa
from jaxrag.env.agents import get_agent
from jaxrag.env.rollout import RolloutConfig, rollout
from jaxrag.testing import LatencyPolicy, tiny_jax_policy
from jaxrag.paths import bench_data

BENCH = bench_data()   # the full benchmark files, else the repository's slices (printed)
SEARCHES = 2
K = RolloutConfig.k  # documents per search: the engine's default


def _script(prompt: str, j: int = 0) -> str:
    """Plain ReAct: search twice (question words + hop number), then answer."""
    n = prompt.count("\nsearch: ")
    return f"search: {prompt.splitlines()[0][10:60]} part {n}" if n < SEARCHES else "answer: unknown"


STOP_CHARS = "etaoinsrhldcumfp"   # extra one-byte stop strings (--stop-chars of them): actions of random lengths


class ScriptedJax:
    """The real JaxPolicy generates up to `new_tokens` per prompt (paid in full, ended by the agent's stop strings
    and `extra_stops`), the script supplies the action."""

    def __init__(self, pol, new_tokens: int, extra_stops: Sequence[str] = ()):
        self.pol, self.new_tokens, self.extra_stops = pol, new_tokens, list(extra_stops)
        self.generated = self.prefilled = 0

    def _stop(self, stop):
        return (list(stop or []) + self.extra_stops) or None

    def generate(self, prompts, *, n=1, temperature=0.0, max_new_tokens=32, stop=None, seed=0):
        out = self.pol.generate(prompts, n=n, temperature=temperature, max_new_tokens=self.new_tokens,
                                stop=self._stop(stop), seed=seed)
        self.generated += sum(len(c.token_ids) for row in out for c in row)
        self.prefilled += sum(len(row[0].prompt_ids) for row in out)
        return [[dataclasses.replace(c, text=_script(p)) for c in row] for p, row in zip(prompts, out)]

    def continuous(self, slots, *, temperature=0.0, max_new_tokens=32, stop=None, seed=0, group=1):
        return _ScriptedSession(self, self.pol.continuous(slots, temperature=temperature,
                                                          max_new_tokens=self.new_tokens, stop=self._stop(stop),
                                                          seed=seed, group=group))


class _ScriptedSession:
    """ScriptedJax's view of a JaxPolicy continuous session: completions paid in full, actions from the script."""

    def __init__(self, owner: ScriptedJax, sess):
        self.owner, self.sess, self.prompts = owner, sess, {}

    @property
    def busy(self) -> int:
        return self.sess.busy

    @property
    def idle_share(self) -> float:
        return self.sess.idle_share

    def submit(self, rid, prompt, fold):
        self.prompts[rid] = prompt
        self.sess.submit(rid, prompt, fold)

    def launch(self) -> bool:
        return self.sess.launch()

    def collect(self):
        out = self.sess.collect()
        self.owner.generated += sum(len(c.token_ids) for _, c in out)
        # a turn's prompt once (its N candidates share one prefill: request ids (episode, j)), as lock-step counts it
        self.owner.prefilled += sum(len(c.prompt_ids) for rid, c in out if not isinstance(rid, tuple) or rid[1] == 0)
        return [(rid, dataclasses.replace(c, text=_script(self.prompts.pop(rid)))) for rid, c in out]


def tiny_jax(d_model=128, n_layers=2, max_seq_len=512, max_prompt_tokens=480):
    return tiny_jax_policy(0, max_seq_len, d_model=d_model, n_layers=n_layers, n_heads=4, n_kv_heads=2,
                           d_ff=4 * d_model, std=0.02, max_prompt_tokens=max_prompt_tokens)


def measure(pol, retriever, agent, examples, batch: int, tok=None, continuous: bool = False,
            temperature: float = 0.0, repeats: int = 1, candidates: int = 1) -> dict:
    """Warm up on all `examples` (a run compiles every shape bucket its prompts, turns and batch compositions meet;
    warming on the shortest and longest questions alone left lock-step compiling during its timed run at batch 1),
    then time them at this batch size (`repeats` times: the fastest run's row). The row's `compiles` counts the XLA
    compilations inside the timed run: 0 unless a shape was missed."""
    cfg = RolloutConfig(batch_size=batch, continuous=continuous, temperature=temperature, n_candidates=candidates)
    rollout(pol, retriever, agent, examples, cfg)
    rows = []
    for _ in range(repeats):   # the machine may be shared: the fastest of `repeats` identical timed runs is kept
        rows.append(_timed(pol, retriever, agent, examples, cfg, tok))
    return min(rows, key=lambda r: r["total_s"])


def _timed(pol, retriever, agent, examples, cfg: RolloutConfig, tok=None) -> dict:
    st: dict = {}
    tok_before = tok.seconds if tok is not None else 0.0
    gen_before, pre_before = getattr(pol, "generated", 0), getattr(pol, "prefilled", 0)
    jp = getattr(pol, "pol", None)   # the JaxPolicy under ScriptedJax: its decode slot counters
    slots_before, kept_before = (jp.decode_slots, jp.decode_tokens) if jp is not None else (0, 0)
    n_compiled = compilation()[0]
    rollout(pol, retriever, agent, examples, cfg, stats=st)
    tot = st["total_s"]
    row = {"batch": cfg.batch_size, "compiles": compilation()[0] - n_compiled,
           "episodes_per_s": len(examples) / tot, "total_s": tot,
           "generate_share": st["generate_s"] / tot, "retrieve_share": st["retrieve_s"] / tot,
           "host_share": st["host_s"] / tot, "policy_calls": st["policy_calls"], "queries": st["queries"],
           "retrieve_ms_per_query": 1e3 * st["retrieve_s"] / max(st["queries"], 1)}
    if tok is not None:
        row["tokenizer_share"] = (tok.seconds - tok_before) / tot
    if jp is not None:
        row["idle%"] = 100 * (1 - (jp.decode_tokens - kept_before) / max(jp.decode_slots - slots_before, 1))
    if hasattr(pol, "generated"):
        row["new_tokens_per_s"] = (pol.generated - gen_before) / st["generate_s"]
        row["prompt_tokens_per_s"] = (pol.prefilled - pre_before) / st["generate_s"]
    return row


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--kv" in argv:
        from benchmarks import rollout_kv
        return rollout_kv.main([a for a in argv if a != "--kv"])
    ap = argparse.ArgumentParser()
    ap.add_argument("--episodes", type=int, default=64)
    ap.add_argument("--batches", default="1,2,4,8,16,32,64")
    ap.add_argument("--jax", action="store_true", help="also measure the real JaxPolicy (small random model)")
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--new-tokens", type=int, default=16, help="tokens the JaxPolicy generates per action at most")
    ap.add_argument("--stop-chars", type=int, default=0,
                    help=f"extra one-byte stop strings (the first N of {STOP_CHARS!r}): actions of random lengths")
    ap.add_argument("--temperature", type=float, default=0.0,
                    help="sampling temperature (at 0 a random model repeats itself: its actions' lengths barely vary)")
    ap.add_argument("--no-fake", action="store_true", help="skip the fixed-latency fake policy")
    ap.add_argument("--repeats", type=int, default=1, help="timed runs per row (the fastest is kept)")
    ap.add_argument("--candidates", type=int, default=1,
                    help="N candidate actions per state (RolloutConfig.n_candidates; the first valid is executed)")
    args = ap.parse_args(argv)
    logging.getLogger("jaxrag.sampling.policy").setLevel(logging.ERROR)   # one "prompt truncated" line per long prompt
    from jaxrag.retrieval import build_bm25, load_corpus

    t0 = time.perf_counter()
    retriever = build_bm25(load_corpus(BENCH / "corpus_multihop_contexts.jsonl"), backend="bm25s")
    examples = load_qa(BENCH / "hotpotqa_dev_500.jsonl", f"first:{args.episodes}")
    retriever.search([ex.question for ex in examples[:8]], K)     # numba compiles before any timing
    print(f"BM25 over {len(retriever.passages) if hasattr(retriever, 'passages') else '?'} passages of {BENCH}: "
          f"{time.perf_counter() - t0:.1f}s (build + numba compile)")
    agent = get_agent("react", mode="plain", max_docs=2, max_doc_chars=200)
    batches = [int(x) for x in args.batches.split(",")]
    policies = {} if args.no_fake else {"fake(20ms+10us/tok)": (LatencyPolicy(_script, call_s=0.02, token_s=1e-5),
                                                                 None, False)}
    if args.jax:
        jaxpol = tiny_jax(args.d_model, args.layers)
        name = (f"jax(L{args.layers},d{args.d_model},{args.new_tokens}tok,{args.stop_chars}stops,T{args.temperature:g}"
                f"{f',N{args.candidates}' if args.candidates > 1 else ''})")
        scripted = ScriptedJax(jaxpol, args.new_tokens, list(STOP_CHARS[:args.stop_chars]))
        policies[f"{name} lock-step"] = (scripted, jaxpol.tokenizer, False)
        if args.candidates > 1:   # the N rows of a state copying its cache instead of reading it once (cascade)
            copying = tiny_jax(args.d_model, args.layers)
            copying.cascade = False
            copied = ScriptedJax(copying, args.new_tokens, list(STOP_CHARS[:args.stop_chars]))
            policies[f"{name} lock-step, copied fork"] = (copied, copying.tokenizer, False)
        policies[f"{name} continuous"] = (scripted, jaxpol.tokenizer, True)
        if args.candidates > 1:   # the pool's N slots of a turn each holding a copy of its prompt
            policies[f"{name} continuous, copied fork"] = (copied, copying.tokenizer, True)
    rows, pure = [], {}
    for b in batches:   # the peers back to back at each batch size (a shared machine's load drifts)
        if args.jax:
            pure[b] = pure_decode(jaxpol, b, args.new_tokens, n=args.candidates,   # the decode batch's rows
                                  temperature=args.temperature)
        for pname, (pol, tok, cont) in policies.items():
            r = {"policy": pname, **measure(pol, retriever, agent, examples, b, tok, cont, args.temperature,
                                            args.repeats, args.candidates)}
            rows.append(r)
            print(f"  {pname} batch {b}: {r['episodes_per_s']:.1f} ep/s", flush=True)
    rows.sort(key=lambda r: list(policies).index(r["policy"]))
    base, lock = {}, {}
    for r in rows:
        base.setdefault(r["policy"], r["episodes_per_s"])
        r["speedup_vs_smallest_batch"] = r["episodes_per_s"] / base[r["policy"]]
        if r["policy"].endswith(" lock-step"):
            lock[(r["policy"][:-len(" lock-step")], r["batch"])] = r["episodes_per_s"]
        elif r["policy"].endswith(" continuous"):
            r["vs_lock_step"] = r["episodes_per_s"] / lock[(r["policy"][:-len(" continuous")], r["batch"])]
        r.update({f"{k}%": 100 * r[f"{k}_share"] for k in ("generate", "tokenizer", "retrieve", "host")
                  if f"{k}_share" in r})
        if "new_tokens_per_s" in r:
            r["pure_decode_tokens_per_s"] = pure[r["batch"]]
            r["vs_pure_decode%"] = 100 * r["new_tokens_per_s"] * r["generate_share"] / pure[r["batch"]]
    cols = ["policy", "batch", "episodes_per_s", "speedup_vs_smallest_batch", "vs_lock_step", "generate%", "tokenizer%",
            "retrieve%", "host%", "idle%", "retrieve_ms_per_query", "prompt_tokens_per_s", "new_tokens_per_s",
            "pure_decode_tokens_per_s", "vs_pure_decode%", "policy_calls", "compiles"]
    print(table(rows, cols))
    out = write_result("rollout", {"episodes": len(examples), "agent": "react/plain", "k": K,
                                   "searches_per_episode": SEARCHES, "new_tokens": args.new_tokens,
                                   "stop_chars": args.stop_chars, "temperature": args.temperature,
                                   "candidates": args.candidates,
                                   "model": {"d_model": args.d_model, "n_layers": args.layers}, "rows": rows})
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
