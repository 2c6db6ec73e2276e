"""ReasonRAG's process-supervised data on real QA files (002 §2.2, RAG-ProGuide): `mcts_stage` (MCTS with SPRE ->
sibling preference pairs -> DPO / SFT rows for jaxrag.pipelines.train). The actor, retriever, agent and judge sections
are read as RAG-Gym's ranking_stage reads them (jaxrag.pipelines.collect)."""

from __future__ import annotations

from jaxrag.data.qa import load_qa
from jaxrag.pipelines.collect import (actor, check_actor, check_judge, check_questions, encode_prompt, make_judge,
                                      write_rows)
from jaxrag.pipelines.common import config_fail, log, plain, resolve, stage_dir, write_json
from jaxrag.supervision.mcts import MCTSConfig, run_mcts, tree_pairs, tree_records, write_trees
from jaxrag.supervision.mcts_env import PolicyTreeEnv
from jaxrag.supervision.records import write_pairs, write_records
from jaxrag.train.distributed import lead_only


def mcts_rows(trees, records, policy, min_margin: float, max_new_tokens: int) -> tuple[list[dict], list[dict], list]:
    """(dpo rows, sft rows, pairs) of grown trees: sibling pairs with |ΔQ| >= min_margin (002 §2.2.3: different
    text, reward gap >= 0.01; jaxrag.supervision.mcts.tree_pairs); SFT rows = each distinct preferred response at its
    state (002 §3.4, "ReasonRAG (SFT)"). Ids: the prompt as the policy encodes it, an action's sampled ids; an evidence
    extraction (its ids are not kept by the tree), and everything of a policy that does not encode its prompts, go as
    text, which the train stage tokenizes with its `tokenizer`."""
    ids = {(r.prompt, c.raw): c.token_ids for r in records for c in r.candidates if c.token_ids}
    enc: dict = {}
    dpo, sft, pairs, seen = [], [], [], set()
    for t in trees:
        for p in tree_pairs(t, min_margin):
            pairs.append(p)
            if p.prompt not in enc:
                enc[p.prompt] = encode_prompt(policy, p.prompt, max_new_tokens)
            known = enc[p.prompt] is not None   # ids only in the tokens of a policy that encodes its prompts
            row = {"prompt_ids": enc[p.prompt]} if known else {"prompt": p.prompt}
            for key, text in (("chosen", p.chosen), ("rejected", p.rejected)):
                row.update({f"{key}_ids": ids[(p.prompt, text)]} if known and ids.get((p.prompt, text)) else {key: text})
            dpo.append({**row, "qid": p.qid, "step": p.step, "margin": p.margin})
            if (p.prompt, p.chosen) not in seen:
                seen.add((p.prompt, p.chosen))
                s = {k: v for k, v in row.items() if k.startswith("prompt")}
                s.update({"completion_ids": row["chosen_ids"]} if "chosen_ids" in row else {"completion": p.chosen})
                sft.append({**s, "qid": p.qid, "step": p.step})
    return dpo, sft, pairs


def _question_sets(sc) -> list[dict]:
    q = plain(sc.questions)
    return list(q) if isinstance(q, (list, tuple)) else [q]


@lead_only  # host-side: process 0 alone (docs/multihost.md)
def mcts_stage(config, workdir, name) -> None:
    """ReasonRAG's process-supervised data (002 §2.2, RAG-ProGuide; METHODS.md §5) on real QA files: MCTS with SPRE
    over the policy's Reasoning / Grounding steps (jaxrag.supervision.mcts + mcts_env.PolicyTreeEnv), `trees_per_round`
    trees grown together, then sibling preference pairs.
    config[name]: policy, retriever, agent ({name, opts}, as ranking_stage), questions ({path, select} or a list of
    them: ReasonRAG samples 3,000 each of PopQA, HotpotQA and 2Wiki train), mcts (MCTSConfig fields), env
    (PolicyTreeEnv settings: k, temperature, rollout_temperature, max_new_tokens, summary_max_new_tokens, batch_size,
    seed), trees_per_round, judge (optional, as ranking_stage's; scores new intermediate nodes with ReasonRAG's
    step prompt, 002 Fig. 14, when mcts.judge_weight > 0 or mcts.rollouts_per_node == 0).
    Outputs under workdir/<name>/: trees.jsonl, records.jsonl, pairs.jsonl, dpo.jsonl and sft.jsonl (rows for
    jaxrag.pipelines.train: `mcts_rows`), questions.jsonl (the questions whose trees gave a pair: the training
    questions of the outcome-RL rows, "the same queries as RL-PRL", 002 §3.4), stats.json."""
    sc = config[name]
    out = stage_dir(workdir, name)
    policy, retriever, agent = actor(sc, name, workdir)
    questions = [q for qs in _question_sets(sc) for q in load_qa(resolve(qs["path"], workdir), qs.get("select"))]
    judge = make_judge(plain(sc.judge), workdir, policy) if sc.get("judge") else None
    cfg = MCTSConfig(**plain(sc.mcts))
    env = PolicyTreeEnv(policy, retriever, agent, **plain(sc.env))
    trees, st = [], {}
    for start in range(0, len(questions), int(sc.trees_per_round)):
        round_st: dict = {}
        trees += run_mcts(env, questions[start:start + int(sc.trees_per_round)], cfg, judge=judge, stats=round_st)
        for k, v in round_st.items():
            st[k] = st.get(k, 0) + v if isinstance(v, (int, float)) else v
        log(name, f"{len(trees)}/{len(questions)} trees, {env.sampled_actions} sampled outputs")
    records = [r for t in trees for r in tree_records(t, agent.name)]
    dpo, sft, pairs = mcts_rows(trees, records, policy, cfg.min_margin, env.max_new_tokens)
    write_trees(out / "trees.jsonl", trees)
    write_records(out / "records.jsonl", records)
    write_pairs(out / "pairs.jsonl", pairs)
    write_rows(out / "dpo.jsonl", dpo)
    write_rows(out / "sft.jsonl", sft)
    with_pairs = {p.qid for p in pairs}
    write_rows(out / "questions.jsonl", [{"id": q.id, "question": q.question, "golden_answers": list(q.golden_answers),
                                           "dataset": q.dataset} for q in questions if q.id in with_pairs])
    stats = {**{k: v for k, v in st.items() if isinstance(v, (int, float))}, "questions": len(questions),
             "trees": len(trees), "states": len(records), "pairs": len(pairs), "sft_rows": len(sft),
             "questions_with_pairs": len(with_pairs), "sampled": dict(env.sampled),
             "sampled_actions_all": env.sampled_actions, "judge": judge.name if judge else None}
    write_json(out / "stats.json", stats)
    log(name, f"{len(trees)} trees, {len(records)} expanded states, {len(pairs)} pairs from {len(with_pairs)} questions")
    if not pairs:
        raise RuntimeError(f"{name}: no preference pairs from {len(trees)} trees (see {out}/stats.json): nothing for a "
                           "DPO stage to train on")


def check_mcts(config, name: str) -> None:
    sc = config[name]
    check_actor(config, name, ("policy", "retriever", "questions", "agent", "mcts", "env", "trees_per_round"))
    for i, qs in enumerate(_question_sets(sc)):
        check_questions(f"{name}.questions" + (f"[{i}]" if isinstance(plain(sc.questions), (list, tuple)) else ""), qs)
    try:
        cfg = MCTSConfig(**plain(sc.mcts))
        cfg.validate()
    except (TypeError, ValueError) as e:
        config_fail(f"{name}.mcts", str(e))
    fields = set(PolicyTreeEnv.__dataclass_fields__) - {"policy", "retriever", "agent", "calls", "sampled", "_draws",
                                                        "summarizer"}
    unknown = sorted(set(plain(sc.env)) - fields)
    if unknown:
        config_fail(f"{name}.env", f"unknown keys {unknown} (known: {sorted(fields)})")
    if int(sc.trees_per_round) < 1:
        config_fail(f"{name}.trees_per_round", f"{sc.trees_per_round}: must be >= 1")
    needs_judge = cfg.judge_weight > 0 or cfg.rollouts_per_node == 0
    if needs_judge and not sc.get("judge"):
        config_fail(f"{name}.judge", "mcts.judge_weight > 0 (or rollouts_per_node 0) needs a judge")
    if sc.get("judge"):
        check_judge(name, plain(sc.judge), "e.g. https://api.openai.com/v1, gpt-4o")


mcts_stage.check_config = check_mcts
