"""ReasonRAG process supervision in the synthetic world: MCTS with Shortest Path Reward Estimation (METHODS.md §5,
jaxrag.supervision.mcts) over the SFT policy, at the ranking collection's compute.

config[name]: policy (the stage whose model samples), agent, budget_from (a supervision stage: its stats.json says
how many policy outputs the ranking collection sampled, `sampled_actions_all`; "" = no budget, every question),
max_questions (the same seeded train subset as the supervision stage, in the same order), trees_per_round (trees
grown together; rounds stop once this stage has sampled the budget, so it ends at most one round over it),
temperature, max_new_tokens, batch_size, and `mcts` (jaxrag.supervision.mcts.MCTSConfig fields).
Compute is counted as the ranking collection counts it: every sampled policy output (expansion candidates and
rollout actions; evidence too, for agents that summarize).
Outputs under workdir/<name>/: trees.jsonl, records_mcts.jsonl, pairs.jsonl (sibling pairs with |ΔQ| >= min_margin,
the format the preference stage reads), stats.json.
"""

from __future__ import annotations

from pathlib import Path

from tqdm import tqdm

from jaxrag.pipelines.common import log, read_json, write_json
from jaxrag.pipelines.synthetic import checks
from jaxrag.pipelines.synthetic.supervise import sampling_setup
from jaxrag.supervision.mcts import MCTSConfig, run_mcts, tree_pairs, tree_records, write_trees
from jaxrag.supervision.mcts_env import PolicyTreeEnv
from jaxrag.supervision.records import write_pairs, write_records
from jaxrag.train.distributed import lead_only

SUMMED = ("iterations", "expand_calls", "rollout_calls", "expanded", "rollouts", "revisits", "nodes", "expand_s",
          "rollout_s", "total_s")


@lead_only  # host-side: process 0 alone (docs/multihost.md)
def mcts_stage(config, workdir, name) -> None:
    s = config[name]
    if s.trees_per_round < 1:
        raise ValueError(f"config.{name}.trees_per_round={s.trees_per_round} must be >= 1")
    cfg = MCTSConfig(**s.mcts.to_dict())
    cfg.validate()
    budget = int(read_json(Path(workdir) / s.budget_from / "stats.json")["sampled_actions_all"]) if s.budget_from else 0
    _, out, retriever, agent, policy, questions = sampling_setup(config, workdir, name)
    env = PolicyTreeEnv(policy, retriever, agent, k=config.index.k, temperature=s.temperature,
                        rollout_temperature=s.temperature, max_new_tokens=s.max_new_tokens, batch_size=s.batch_size,
                        seed=config.seed)
    trees, totals = [], dict.fromkeys(SUMMED, 0)
    bar = tqdm(total=budget or len(questions), unit="action" if budget else "tree", desc=name)
    for start in range(0, len(questions), s.trees_per_round):
        if budget and env.sampled_actions >= budget:
            break
        st: dict = {}
        trees += run_mcts(env, questions[start:start + s.trees_per_round], cfg, stats=st)
        for key in SUMMED:
            totals[key] += st.get(key, 0)
        bar.update(min(env.sampled_actions, budget) - bar.n if budget else len(trees) - bar.n)
        bar.set_postfix(trees=len(trees))
    bar.close()
    if budget and env.sampled_actions < budget:
        log(name, f"ran out of questions at {env.sampled_actions} of {budget} sampled actions (max_questions="
                  f"{s.max_questions})")
    records = [r for t in trees for r in tree_records(t, agent.name)]
    pairs = [p for t in trees for p in tree_pairs(t, cfg.min_margin)]
    write_trees(out / "trees.jsonl", trees)
    write_records(out / "records_mcts.jsonl", records)
    write_pairs(out / "pairs.jsonl", pairs)
    solved = sum(any(n.stage == "Terminal" and n.value is not None and n.value >= 1.0 for n in t.nodes) for t in trees)
    stats = {**totals, "trees": len(trees), "states": len(records), "pairs": len(pairs), "budget_actions": budget,
             "sampled_actions_all": env.sampled_actions, "sampled": dict(env.sampled),
             "trees_with_a_right_answer": solved, "mcts": s.mcts.to_dict()}
    write_json(out / "stats.json", stats)
    log(name, f"{len(trees)} trees, {len(records)} expanded states, {len(pairs)} pairs, {env.sampled_actions} sampled "
              f"actions (budget {budget or 'none'}), {solved} trees reached a right answer, {totals['total_s']:.0f} s")


# jaxrag.main checks the config before any stage runs
mcts_stage.check_config = checks.check_sampling
