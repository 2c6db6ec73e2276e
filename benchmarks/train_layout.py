"""The update's work and time in the per-row and the prefix-tree layouts (jaxrag.train.prefix_tree), on a step's
rows of three formats with the shapes of benchmarks.rl's ReAct episodes:

- react_rag_gym: RAG-Gym's ReAct, one row per turn, each turn's prompt = instructions + the history so far + the
  question (after the history): consecutive prompts do not extend each other (no merge_turns);
- append_only: each next prompt = the last prompt + the action + the documents (Search-R1 / plain formats):
  rows.merge_turns joins an episode's turns into one row;
- dpo_pairs: DPO pairs whose chosen and rejected share the state prompt (several pairs per state);
- critic_pairs: the same pairs for the critic's Bradley-Terry loss (a score read at each row's last token, no LM
  head; "trained" tokens are the completions, as for DPO).

B questions x G episodes, TURNS actions of NEW generated tokens, DOCS observation tokens per search, an
INSTR-token instruction block; DPO: STATES states x 2 pairs. Per format and layout: the tokens the update computes
(the forward's token slots, padding included) per trained (generated) token, the step's distinct tokens (every
shared prefix once) per trained token, the tree's slots over the distinct tokens (goal <= 2), the cost model's
FLOP ratio and the auto choice, and the time of one jitted gradient step (median of `steps` after a compiling one)
at benchmarks.rl's tiny preset on this CPU. The "1b" columns are the tree the cost model picks for the same rows at
benchmarks.rl's 1b preset (Llama-3.2-1B shapes): its batch shape, slots over distinct tokens and FLOP ratio, from the
host-side packing alone (nothing runs at that size here). `python -m benchmarks.train --only layouts` runs it
alone.
"""

from __future__ import annotations

import numpy as np

from benchmarks.common import table, time_first_and_median

B, G, TURNS, NEW, DOCS, INSTR, QUESTION = 2, 8, 3, 16, 100, 300, 20
STATES = 4
BUCKETS = (128, 256, 512, 768, 1024, 2048)


def _ids(rng, n):
    return [int(x) for x in rng.integers(3, 259, n)]


def episodes(rng, rag_gym: bool, questions: int = B):
    from jaxrag.env.mdp import Action, Episode, Step

    out = []
    instr = _ids(rng, INSTR)
    for q in range(questions):
        question = _ids(rng, QUESTION)
        for _ in range(G):
            history, steps, prompt = [], [], instr + question
            for _ in range(TURNS):
                if rag_gym:
                    prompt = instr + history + question
                gen = _ids(rng, NEW)
                steps.append(Step(action=Action("query", "q"), prompt_ids=list(prompt), token_ids=gen,
                                  logprobs=list(rng.normal(-3.0, 0.5, NEW))))
                docs = _ids(rng, DOCS)
                history = history + gen + docs
                prompt = prompt + gen + docs
            out.append(Episode(qid=f"q{q}", question="", gold=[], steps=steps))
    return out


def pairs(rng):
    from jaxrag.train.batching import PreferencePair

    instr = _ids(rng, INSTR)
    out = []
    for _ in range(STATES):
        prompt = instr + _ids(rng, QUESTION + DOCS + NEW)
        out += [PreferencePair(prompt, _ids(rng, NEW), _ids(rng, NEW)) for _ in range(2)]
    return out


def rl_case(name, rows, eps, mcfg):
    from jaxrag.rl import rows as R
    from jaxrag.train import prefix_tree as PT

    adv = R.group_advantages(eps, list(np.random.default_rng(0).normal(size=len(eps))), G)
    rows_b = R.grpo_batch(rows, adv, "seq_mean_token_mean", 1, BUCKETS)
    tree = R.row_tree(rows, BUCKETS, mcfg)
    tree_b = R.grpo_tree_batch(rows, adv, "seq_mean_token_mean", 1, tree)
    trained = sum(r.generated for r in rows)
    distinct = PT.distinct_tokens([r.prompt + r.completion for r in rows])
    rw, tw = PT.rows_work(R.rows_shapes(rows, BUCKETS)), PT.tree_work(tree)
    return name, rows_b, tree_b, trained, distinct, rw, tw


def pair_case(mcfg, loss: str):
    from jaxrag.train import prefix_tree as PT
    from jaxrag.train.batching import pair_batch

    ps = pairs(np.random.default_rng(2))
    rows_b = pair_batch(ps, BUCKETS)
    rows, units = PT.pair_rows(ps, reads=loss == "dpo")
    tree = PT.best_tree(rows, BUCKETS, mcfg, units=units, lm_head=loss == "dpo")
    tree_b = PT.pair_tree_batch(ps, tree)
    trained = sum(len(c) for _, c, _ in rows)
    distinct = PT.distinct_tokens([list(p) + list(c) for p, c, _ in rows])
    n, _, T = rows_b["tokens"].shape
    rw, tw = PT.rows_work([(2 * n, T)]), PT.tree_work(tree)
    if loss == "bt":   # the critic computes no LM head
        rw, tw = rw.without_head(), tw.without_head()
    return f"{'dpo' if loss == 'dpo' else 'critic'}_pairs", rows_b, tree_b, trained, distinct, rw, tw


def grad_step(mcfg, loss: str, batch_size: int):
    import jax

    from jaxrag.models import init_params
    from jaxrag.train import config as tconfig
    from jaxrag.train.steps import make_grad_fn

    tc = tconfig.resolve({"loss": loss, "batch_size": batch_size, "grpo": {"group_size": G, "beta": 0.0}})
    fn = jax.jit(make_grad_fn(mcfg, tc))
    args = ({"model": init_params(mcfg, jax.random.PRNGKey(0))}, {"ref": init_params(mcfg, jax.random.PRNGKey(0))})
    if loss == "bt":
        from jaxrag.models import critic_init

        args = ({**args[0], "head": critic_init(mcfg, jax.random.PRNGKey(1))}, {})
    return lambda batch: (lambda: jax.block_until_ready(fn(*args, batch, jax.random.PRNGKey(0))))


def preset(name: str):
    """benchmarks.rl's model preset `name` ("tiny" | "1b") as a ModelConfig."""
    from benchmarks.rl import PRESETS
    from jaxrag.models import ModelConfig

    return ModelConfig(**PRESETS[name], bos_id=1, eos_ids=(2,), pad_id=0)


def cases(mcfg) -> list[tuple]:
    from jaxrag.rl import rows as R

    eps_rg, eps_ao = episodes(np.random.default_rng(0), True), episodes(np.random.default_rng(1), False)
    return [rl_case("react_rag_gym", R.action_rows(eps_rg), eps_rg, mcfg),
            rl_case("append_only (merged rows)", R.merge_turns(R.action_rows(eps_ao)), eps_ao, mcfg),
            pair_case(mcfg, "dpo"), pair_case(mcfg, "bt")]


def run(steps: int = 2) -> list[dict]:
    from jaxrag.train import prefix_tree as PT

    mcfg, big = preset("tiny"), preset("1b")
    plans = {c[0]: c for c in cases(big)}   # the same rows (same draws), packed for the 1b preset's cost
    out = []
    for name, rows_b, tree_b, trained, distinct, rw, tw in cases(mcfg):
        _, _, tree_big, _, _, rw_big, tw_big = plans[name]
        at_1b = {"shape_1b": "x".join(map(str, tree_big["tokens"].shape)),
                 "update_per_distinct_1b": tw_big.tokens / distinct,
                 "flops_ratio_1b": tw_big.flops(big) / rw_big.flops(big)}
        loss, bs = {"dpo_pairs": ("dpo", len(rows_b["tokens"])), "critic_pairs": ("bt", len(rows_b["tokens"]))
                    }.get(name, ("grpo", B * G))
        step = grad_step(mcfg, loss, bs)
        auto = PT.choose_layout("auto", rw, tw, mcfg)[0]
        for layout, batch, work in (("rows", rows_b, rw), ("tree", tree_b, tw)):
            first, med = time_first_and_median(step(batch), steps)
            out.append({"format": name, "layout": layout, "shape": "x".join(map(str, batch["tokens"].shape)),
                        "trained_tokens": trained, "update_tokens": work.tokens,
                        "update_per_trained": work.tokens / trained, "distinct_per_trained": distinct / trained,
                        "update_per_distinct": work.tokens / distinct,
                        "flops_ratio": tw.flops(mcfg) / rw.flops(mcfg), "auto": auto, "update_s": med,
                        "first_s": first, **(at_1b if layout == "tree" else {})})
        out[-1]["speedup"] = out[-2]["update_s"] / out[-1]["update_s"]
        print(table(out[-2:], COLUMNS), flush=True)
    return out


COLUMNS = ["format", "layout", "shape", "trained_tokens", "update_tokens", "update_per_trained",
           "distinct_per_trained", "update_per_distinct", "flops_ratio", "auto", "update_s", "speedup", "shape_1b",
           "update_per_distinct_1b", "flops_ratio_1b"]


def plan_1b(questions: int = 16) -> dict:
    """The 1b preset's layouts for `questions` x G ReAct (RAG-Gym) episodes (16 x 8: the H200 step in
    docs/prefix_tree.md), from the host-side packing alone: the per-row and tree batch shapes, slots per trained
    token, slots over distinct tokens and the tree's FLOP ratio."""
    from jaxrag.rl import rows as R

    big = preset("1b")
    eps = episodes(np.random.default_rng(0), True, questions)
    _, rows_b, tree_b, trained, distinct, rw, tw = rl_case("react_rag_gym", R.action_rows(eps), eps, big)
    return {"questions": questions, "G": G, "rows_shape": "x".join(map(str, rows_b["tokens"].shape)),
            "tree_shape": "x".join(map(str, tree_b["tokens"].shape)), "rows_per_trained": rw.tokens / trained,
            "tree_per_trained": tw.tokens / trained, "distinct_per_trained": distinct / trained,
            "tree_per_distinct": tw.tokens / distinct, "flops_ratio": tw.flops(big) / rw.flops(big)}


def main(steps: int = 2) -> dict:
    rows = run(steps)
    print(f"update layouts, benchmarks.rl tiny preset, B={B} x G={G}, {TURNS} turns x {NEW} new tokens, {DOCS} document "
          f"tokens a search, {INSTR} instruction tokens")
    print(table(rows, COLUMNS))
    big = plan_1b()
    print(f"1b preset, {big['questions']} x {big['G']} ReAct episodes, packing alone (nothing runs): rows "
          f"{big['rows_shape']} vs tree {big['tree_shape']}; slots per trained token {big['rows_per_trained']:.1f} vs "
          f"{big['tree_per_trained']:.1f}; tree over distinct tokens {big['tree_per_distinct']:.2f}; FLOPs tree/rows "
          f"{big['flops_ratio']:.2f}")
    return {"B": B, "G": G, "turns": TURNS, "new_tokens": NEW, "doc_tokens": DOCS, "instr_tokens": INSTR,
            "states": STATES, "buckets": BUCKETS, "rows": rows, "plan_1b": big}
