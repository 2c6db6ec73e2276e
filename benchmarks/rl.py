"""One online-RL step (jaxrag.rl.train_rl, GRPO): episodes/s and trained tokens/s at batch 1 vs batched, and where
the step's time goes (sampling / retrieval / training / host).

    python -m benchmarks.rl [--steps 5] [--questions 2] [--group 4] [--new-tokens 16] [--preset tiny|1b]
        [--modes batch1,batched,batched_groups,continuous] [--append-only]

Modes (same world, model and update rule):
- batch1:  one episode per RL step (B = G = 1): every policy call samples one action, the update has one
           episode's rows;
- batched: B·G episodes per RL step: all of them advance in one policy call per engine step, one update on all rows
           padded to the longest;
- batched_groups: the same with rl.length_groups (one sub-batch per sequence bucket, gradients summed): less
           padding, more compiled shapes (new_shapes_timed counts the train-step compiles inside the timed steps);
- batched_rows / batched_tree: batched with the update's layout forced (rl.train_layout; batched is "auto"):
           update_per_trained = token slots the update computes per trained token, distinct_per_trained = the
           step's distinct tokens (shared prefixes once) per trained token (jaxrag.train.prefix_tree);
- continuous: batched, sampled through the policy's continuous slot pool (rl.continuous: a finished turn's slot
           takes the next waiting one after every decode chunk; a group's G identical first prompts prefilled once).
World: plain ReAct over BM25 (bm25s) on the multihop contexts corpus (11k passages), k = 5, a random Llama with the
byte tokenizer. The model's tokens are really sampled (and their log-probs trained on), but a random model's text
would end every episode Invalid at step 1, so the action the environment executes is scripted: 2 searches, then an
answer (the benchmarks.rollout convention); the rows hold the sampled ids, so the update costs what it would.
--append-only: the rows hold the scripted action's own ids instead (its bytes, cut or padded to --new-tokens), so
each turn's prompt continues the last turn's prompt and action token for token, as in append-only formats (Search-R1,
ARENA's multi-turn): rows.merge_turns joins an episode's turns into one row (rows per episode: 1) where the whole
episode fits the prompt budget (a prompt the agent had to shorten starts a new row; prompts_cut counts them: give
--max-prompt-tokens 1500 at the default shapes). Without it the sampled ids differ from the text the next prompt
shows, which is what RAG-Gym-style formats give (a row per turn).
Timings: the median over steps after `--warmup` steps (those compile most shapes); steady_step_s: the median over
the timed steps that compiled no new train-step shape (NaN if every one did). A prefix-tree batch's shape is (packs,
pack length, read slots), and the packs' count follows the step's data, so the tree layout compiles more shapes
than padded rows early in a run. --preset 1b is a Llama-3.2-1B
shape (bf16, remat) for an accelerator; it is not meant for this CPU. Writes results/bench/rl.json.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time

from benchmarks.common import table, write_result
from jaxrag.paths import bench_data

SEARCHES = 2
PRESETS = {
    "tiny": dict(d_model=128, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=32, d_ff=512, vocab_size=259,
                 max_seq_len=512),
    "1b": dict(d_model=2048, n_layers=16, n_heads=32, n_kv_heads=8, head_dim=64, d_ff=8192, vocab_size=128256,
               max_seq_len=2048, rope_theta=500000.0, tie_embeddings=True),
}


def _script(prompt: str, length: int | None = None) -> str:
    """The scripted action for a plain ReAct prompt; length: exactly that many characters (bytes: letters and
    spaces only, and no space at either end, so the text is its own canonical form)."""
    n = prompt.count("\nsearch: ")
    if n >= SEARCHES:
        text = "answer: unknown"
    elif length is None:
        return f"search: {prompt.splitlines()[0][10:60]} part {n}"
    else:
        words = "".join(c if c.isascii() and c.isalpha() else " " for c in prompt.splitlines()[0][10:]).split()
        text = f"search: {'abcdefghijklmnopqrstuvwxyz'[n]} " + " ".join(words)   # the turn first: never cut off
    if length is None:
        return text
    text = (text + " x" * length)[:length].rstrip()
    return text + "x" * (length - len(text))


class ScriptedActions:
    """A JaxPolicy whose sampled ids, log-probs and prompt ids are kept while the action text is scripted.
    append_only: the completion's ids are the scripted text's own (bytes), with the sampled log-probs (padded with
    -1.0 where the text is longer): the next prompt then continues this turn's ids."""

    def __init__(self, policy, append_only: bool = False, new_tokens: int = 16):
        self.inner, self.append_only, self.new_tokens = policy, append_only, new_tokens

    def completion(self, prompt: str, c):
        from jaxrag.sampling import Completion

        if not self.append_only:
            return Completion(_script(prompt), c.token_ids, c.logprobs, c.finish_reason, c.prompt_ids)
        text = _script(prompt, self.new_tokens)
        ids = self.inner.tokenizer.encode(text)
        lps = (list(c.logprobs) + [-1.0] * len(ids))[:len(ids)]
        return Completion(text, ids, lps, c.finish_reason, c.prompt_ids)

    cfg = property(lambda self: self.inner.cfg, lambda self, v: setattr(self.inner, "cfg", v))
    params = property(lambda self: self.inner.params, lambda self, v: setattr(self.inner, "params", v))

    def __getattr__(self, name):  # tokenizer, prompt_fits, prompt_budget, ...
        return getattr(self.inner, name)

    def generate(self, prompts, **kw):
        out = self.inner.generate(prompts, **kw)
        return [[self.completion(p, c) for c in row] for p, row in zip(prompts, out)]

    def continuous(self, *args, **kw):
        return ScriptedSession(self.inner.continuous(*args, **kw), self)


class ScriptedSession:
    """The same for the policy's continuous session: each finished request's text scripted from its prompt."""

    def __init__(self, session, policy: ScriptedActions):
        self.inner, self.policy, self.prompts = session, policy, {}

    def __getattr__(self, name):  # launch, busy, idle_share, release, keeps_sessions
        return getattr(self.inner, name)

    def submit(self, rid, prompt, fold, *session):
        self.prompts[rid] = prompt
        self.inner.submit(rid, prompt, fold, *session)

    def collect(self):
        return [(rid, self.policy.completion(self.prompts.pop(rid), c)) for rid, c in self.inner.collect()]

    def step(self):
        self.launch()
        return self.collect()


def make_policy(preset: str, max_prompt_tokens: int, append_only: bool = False, new_tokens: int = 16):
    import jax

    from jaxrag.models import ModelConfig, init_params
    from jaxrag.sampling import JaxPolicy

    class ByteTok:
        pad_id, bos_id, eos_id, vocab_size, eos_ids = 0, 1, 2, 259, (2,)

        def encode(self, t, add_bos=False):
            return ([1] if add_bos else []) + [b + 3 for b in t.encode()]

        def decode(self, ids):
            # ids past the 256 bytes (a 128k-vocabulary model samples them) decode to nothing
            return bytes(int(i) - 3 for i in ids if 3 <= int(i) < 259).decode(errors="replace")

        def chat(self, m, add_generation_prompt=True):
            return "\n\n".join(x["content"] for x in m)

    shape = dict(PRESETS[preset])
    shape["max_seq_len"] = max(shape["max_seq_len"], max_prompt_tokens + new_tokens)  # a longer --max-prompt-tokens
    cfg = ModelConfig(**shape, bos_id=1, eos_ids=(2,), pad_id=0)
    params = init_params(cfg, jax.random.PRNGKey(0))
    return ScriptedActions(JaxPolicy(cfg, params, ByteTok(), max_prompt_tokens=max_prompt_tokens), append_only,
                           new_tokens)


def _median_or_nan(xs):
    return statistics.median(xs) if xs else float("nan")


def run_mode(mode: str, args, retriever, agent, questions) -> dict:
    from jaxrag.rl import RLConfig, train_rl

    policy = make_policy(args.preset, args.max_prompt_tokens, args.append_only, args.new_tokens)
    b, g = (1, 1) if mode == "batch1" else (args.questions, args.group)
    n_ep = b * g
    rc = RLConfig(steps=args.warmup + args.steps, questions_per_step=b, group_size=g, temperature=1.0,
                  max_new_tokens=args.new_tokens, max_steps=SEARCHES + 1, k=5,
                  length_groups=mode == "batched_groups", continuous=mode == "continuous",
                  train_layout={"batched_rows": "rows", "batched_tree": "tree"}.get(mode, "auto"))
    big = args.preset == "1b"
    tc = {"loss": "grpo", "seq_buckets": (128, 256, args.max_prompt_tokens + args.new_tokens), "progress": False,
          "compute_dtype": "bfloat16" if big else "float32", "remat": big, "optimizer": {"lr": 1e-5},
          "checkpoint": {"enabled": False}}
    t0 = time.perf_counter()
    cut0 = agent.prompt_cuts.get("shortened", 0)
    res = train_rl(policy, retriever, agent, questions, "em", rc, tc)
    timed = res.history[args.warmup:]
    med = lambda k: statistics.median(m[k] for m in timed)
    step = med("time/step_s")
    row = {"mode": mode, "episodes": n_ep, "rows": med("rows"), "rows_per_episode": med("rows_merged") / n_ep,
           "trained_tokens": med("row_tokens"),
           "episodes_per_s": n_ep / step, "trained_tokens_per_s": med("row_tokens") / step,
           "train_tokens_per_s": med("trained_tokens_per_s"), "step_s": step,
           "first_steps_s": sum(m["time/step_s"] for m in res.history[:args.warmup]),
           "new_shapes_timed": sum(m["train/new_shapes"] for m in timed),
           "steady_step_s": _median_or_nan([m["time/step_s"] for m in timed if m["train/new_shapes"] == 0]),
           "padding%": 100 * (1 - med("batch_fill")),
           "total_s": time.perf_counter() - t0, "layout_tree": med("layout/tree"),
           "update_per_trained": med("update_tokens") / med("row_tokens"),
           "distinct_per_trained": med("distinct_tokens") / med("row_tokens"),
           "prompts_cut": agent.prompt_cuts.get("shortened", 0) - cut0}
    for part in ("sampling", "retrieval", "training", "host", "sync"):
        row[f"{part}%"] = 100 * med(f"time/{part}_s") / step
    return row


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    ap.add_argument("--questions", type=int, default=2, help="B questions per RL step")
    ap.add_argument("--group", type=int, default=4, help="G episodes per question")
    ap.add_argument("--new-tokens", type=int, default=16, help="tokens sampled per action")
    ap.add_argument("--max-prompt-tokens", type=int, default=448)
    ap.add_argument("--steps", type=int, default=3, help="timed RL steps per mode")
    ap.add_argument("--warmup", type=int, default=2, help="untimed RL steps per mode (compilation)")
    ap.add_argument("--modes", default="batch1,batched,batched_groups,continuous")
    ap.add_argument("--append-only", action="store_true",
                    help="the rows hold the scripted actions' ids: turns continue each other, one row an episode")
    args = ap.parse_args(argv)
    logging.getLogger("jaxrag.sampling.policy").setLevel(logging.ERROR)
    from jaxrag.data.qa import load_qa
    from jaxrag.env.agents import get_agent
    from jaxrag.retrieval import build_bm25, load_corpus

    t0 = time.perf_counter()
    retriever = build_bm25(load_corpus(bench_data() / "corpus_multihop_contexts.jsonl"), backend="bm25s")
    questions = load_qa(bench_data() / "hotpotqa_dev_500.jsonl", "first:64")
    retriever.search([q.question for q in questions[:8]], 5)  # numba compiles before any timing
    print(f"BM25 over {bench_data()} ready in {time.perf_counter() - t0:.1f}s")
    agent = get_agent("react", mode="plain", max_docs=2, max_doc_chars=200)
    rows = []
    for mode in args.modes.split(","):
        rows.append(run_mode(mode, args, retriever, agent, questions))
        print(f"  {mode}: {rows[-1]['episodes_per_s']:.2f} episodes/s, {rows[-1]['trained_tokens_per_s']:.0f} "
              f"trained tokens/s per RL step", flush=True)
    if len(rows) > 1:
        for r in rows:
            r["speedup"] = r["episodes_per_s"] / rows[0]["episodes_per_s"]
    cols = ["mode", "episodes", "rows", "rows_per_episode", "trained_tokens", "episodes_per_s", "trained_tokens_per_s", "speedup",
            "step_s", "sampling%", "retrieval%", "training%", "host%", "sync%", "padding%", "new_shapes_timed",
            "steady_step_s", "first_steps_s", "prompts_cut",
            "layout_tree", "update_per_trained", "distinct_per_trained"]
    print(table(rows, cols))
    out = write_result("rl", {"preset": args.preset, "model": PRESETS[args.preset], "questions": args.questions,
                              "group": args.group, "new_tokens": args.new_tokens,
                              "agent": "react/plain (scripted" + (", append-only ids)" if args.append_only else ")"),
                              "k": 5, "searches_per_episode": SEARCHES, "rows": rows})
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
