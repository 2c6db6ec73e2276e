"""Rollout engine throughput: episodes/s vs batch size, and the share of time in generation / retrieval / host.

python -m jaxrag.bench.rollout [--jax] [--episodes 64]
Policies measured in the same run: a fake with a fixed per-call latency + per-token cost (models a device
that saturates with batch), and with --jax a tiny random JaxPolicy (byte tokenizer). Retrieval: BM25
(bm25s) over the multihop contexts corpus. Agent: plain ReAct, 2 searches then an answer per episode.
Writes results/bench/rollout.json.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from jaxrag.data.qa import load_qa
from jaxrag.env.agents import get_agent
from jaxrag.env.rollout import RolloutConfig, rollout

BENCH = Path("/work/shared/benchmarks")


class _C:
    def __init__(self, text):
        self.text, self.token_ids, self.logprobs, self.finish_reason = text, [0] * 8, [-1.0] * 8, "stop"


def _script(prompt: str) -> str:
    n = prompt.count("\nsearch: ")
    return f"search: {prompt.splitlines()[0][10:60]} part {n}" if n < 2 else "answer: unknown"


class LatencyPolicy:
    """sleep(call_s + token_s * tokens * batch): fixed launch cost + per-sequence compute."""

    def __init__(self, call_s=0.02, token_s=1e-5, tokens=32):
        self.call_s, self.token_s, self.tokens = call_s, token_s, tokens

    def generate(self, prompts, *, n=1, temperature=0.0, max_new_tokens=32, stop=None, seed=0):
        time.sleep(self.call_s + self.token_s * self.tokens * len(prompts) * n)
        return [[_C(_script(p)) for _ in range(n)] for p in prompts]


class ScriptedJax:
    """Runs the tiny JaxPolicy for its cost, answers with the script (so episodes have a fixed length)."""

    def __init__(self, pol):
        self.pol = pol

    def generate(self, prompts, **kw):
        self.pol.generate(prompts, **{**kw, "max_new_tokens": 16})
        return [[_C(_script(p))] for p in prompts]


def _tiny_jax():
    import jax
    from jaxrag.models.config import ModelConfig
    from jaxrag.models.transformer import init_params
    from jaxrag.policy import JaxPolicy

    class ByteTok:
        pad_id, bos_id, eos_id, vocab_size, eos_ids = 0, 1, 2, 259, (2,)

        def encode(self, t, add_bos=False):
            return ([1] if add_bos else []) + [b + 3 for b in t.encode()]

        def decode(self, ids):
            return bytes(int(i) - 3 for i in ids if int(i) >= 3).decode(errors="replace")

        def chat(self, m, add_generation_prompt=True):
            return "\n\n".join(x["content"] for x in m)
    cfg = ModelConfig(vocab_size=259, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, d_ff=128,
                      max_seq_len=512, bos_id=1, eos_ids=(2,), pad_id=0)
    return JaxPolicy(cfg, init_params(cfg, jax.random.PRNGKey(0)), ByteTok(), max_prompt_tokens=480)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--episodes", type=int, default=64)
    ap.add_argument("--batches", default="1,2,4,8,16,32,64")
    ap.add_argument("--jax", action="store_true")
    args = ap.parse_args(argv)
    from jaxrag.retrieval import build_bm25, load_corpus
    retriever = build_bm25(load_corpus(BENCH / "corpus_multihop_contexts.jsonl"), backend="bm25s")
    examples = load_qa(BENCH / "hotpotqa_dev_500.jsonl", f"first:{args.episodes}")
    retriever.search([ex.question for ex in examples[:8]], 5)     # warm up numba before timing
    agent = get_agent("react", mode="plain", max_docs=2, max_doc_chars=200)
    policies = {"fake(20ms+10us/tok)": LatencyPolicy()}
    if args.jax:
        policies["tiny-jax"] = ScriptedJax(_tiny_jax())
    rows = []
    for pname, pol in policies.items():
        if pname == "tiny-jax":   # warm up compiles for every bucket
            rollout(pol, retriever, agent, examples, RolloutConfig(k=5, batch_size=max(int(b) for b in args.batches.split(","))))
        for b in [int(x) for x in args.batches.split(",")]:
            st = {}
            rollout(pol, retriever, agent, examples, RolloutConfig(k=5, batch_size=b), stats=st)
            tot = st["total_s"]
            rows.append({"policy": pname, "batch": b, "episodes_per_s": len(examples) / tot,
                         "generate_share": st["generate_s"] / tot, "retrieve_share": st["retrieve_s"] / tot,
                         "host_share": st["host_s"] / tot, "policy_calls": st["policy_calls"]})
    base = {r["policy"]: r["episodes_per_s"] for r in rows if r["batch"] == rows[0]["batch"]}
    print(f"{'policy':22s} {'batch':>5s} {'ep/s':>8s} {'x b=1':>6s} {'gen%':>6s} {'ret%':>6s} {'host%':>6s}")
    for r in rows:
        r["speedup_vs_smallest_batch"] = r["episodes_per_s"] / base[r["policy"]]
        print(f"{r['policy']:22s} {r['batch']:5d} {r['episodes_per_s']:8.1f} {r['speedup_vs_smallest_batch']:6.1f} "
              f"{100 * r['generate_share']:6.1f} {100 * r['retrieve_share']:6.1f} {100 * r['host_share']:6.1f}")
    out = Path("results/bench/rollout.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"episodes": len(examples), "agent": "react/plain", "k": 5, "rows": rows}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
