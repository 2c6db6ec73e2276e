"""Process-supervision collection on real data (QA files, a retriever, an LLM judge): RAG-Gym's `ranking_stage`
(below), and further down critic_pairs_stage, rollout_values_stage (RAG-Gym's critics), mcts_stage (ReasonRAG's
MCTS-SPRE pairs) and smartsearch_stage (SmartSearch's curriculum data), each documented where it is defined.

config[name]:
  policy      a load_policy spec: the actor whose candidates are ranked ({path, max_prompt_tokens, ...}; or
              {fn: "module:function"}: fn(section, workdir) -> a Policy)
  retriever   a load_retriever spec ({index_dir | corpus, kind, backend, ...})
  questions   {path, select}: the training questions (RAG-Gym: the first 1,000 of HotpotQA dev)
  agent       {name, opts}: the agent design (chat mode with the policy's tokenizer unless opts say otherwise)
  judge       {kind: "http", base_url, model, api_key_env, max_retries, timeout_s, max_workers}: an OpenAI-compatible
              endpoint with RAG-Gym's ranking prompt (001 App. H Fig. 10) | {kind: "local", path, ...}: a local
              checkpoint with the same prompt (empty path: the policy itself) | {kind: "fn", fn: "module:function"}:
              fn(judge_section, workdir) -> a judge (e.g. jaxrag.fakes:shortest_judge, the smoke variant's stand-in)
  ranking     jaxrag.supervision.ranking.RankingConfig fields (N = 10 candidates at T = 1.0, 10 steps, keep a
              trajectory iff F1 > 0.75, ...)
Outputs under workdir/<name>/: records.jsonl (every state of a kept trajectory, every candidate with its rank, score,
judge rationale or failure), pairs.jsonl (Pair: text), dpo.jsonl ({prompt_ids, chosen_ids, rejected_ids}: the exact
ids the policy saw and sampled, for jaxrag.pipelines.train), sft.jsonl ({prompt_ids, completion_ids}: the best-ranked
candidate of each such state, RAG-Gym's SFT data), episodes.jsonl (every trajectory, kept or not), stats.json.
"""

from __future__ import annotations

import json
from pathlib import Path

from jaxrag.jsonl import write_atomic
from jaxrag.pipelines.common import (config_fail, load_policy, load_retriever, log, plain, resolve, stage_dir,
                                     write_json)


JUDGE_KINDS = ("http", "local", "fn")
LOAD_POLICY = "jaxrag.pipelines.common:load_policy"


def make_judge(jc: dict, workdir, policy):
    """The judge of a `judge` section (see the module doc)."""
    from jaxrag.supervision.judges import HttpJudge, LocalJudge

    kind = jc.get("kind")
    if kind == "http":
        kw = {k: jc[k] for k in ("api_key_env", "max_retries", "timeout_s", "max_workers", "max_tokens") if k in jc}
        return HttpJudge(jc["base_url"], jc["model"], **kw)
    if kind == "local":
        judge_policy = load_policy(jc, workdir) if jc.get("path") else policy
        return LocalJudge(judge_policy, name=jc.get("name") or "local",
                          **{k: jc[k] for k in ("max_retries", "max_new_tokens") if k in jc})
    if kind == "fn":
        from jaxrag.main import resolve_fn

        return resolve_fn(jc["fn"], "judge.fn")(jc, workdir)
    raise ValueError(f"judge.kind={kind!r}: choose one of {JUDGE_KINDS}")


def check_config(config, name: str) -> None:
    """Static checks run by jaxrag.main before any stage starts; errors name the key."""
    from jaxrag.data.qa import QADataError, parse_select
    from jaxrag.env.agents import agent_module
    from jaxrag.supervision.ranking import RankingConfig

    sc = config[name]
    for key in ("policy", "retriever", "questions", "agent", "judge", "ranking"):
        if key not in sc:
            config_fail(f"{name}.{key}", "missing")
    if sc.policy.get("fn", LOAD_POLICY) == LOAD_POLICY and not sc.policy.get("path"):
        config_fail(f"{name}.policy.path", "empty: set it to a Hugging Face checkpoint dir (or stage:<name>)")
    if not sc.questions.get("path"):
        config_fail(f"{name}.questions.path", "empty: a QA JSONL file")
    try:
        parse_select(sc.questions.get("select"), 1)
    except QADataError as e:
        config_fail(f"{name}.questions.select", str(e))
    try:
        agent_module(sc.agent.get("name") or "")
    except KeyError as e:
        config_fail(f"{name}.agent.name", e.args[0])
    try:
        RankingConfig(**plain(sc.ranking))
    except (TypeError, ValueError) as e:
        config_fail(f"{name}.ranking", str(e))
    jc = plain(sc.judge)
    if jc.get("kind") not in JUDGE_KINDS:
        config_fail(f"{name}.judge.kind", f"{jc.get('kind')!r}: choose one of {JUDGE_KINDS}")
    if jc["kind"] == "http" and not (jc.get("base_url") and jc.get("model")):
        config_fail(f"{name}.judge", "an http judge needs base_url and model (e.g. https://api.openai.com/v1, gpt-4o)")
    if jc["kind"] == "fn" and not jc.get("fn"):
        config_fail(f"{name}.judge.fn", "empty: 'module:function'")


def _encode(policy, prompt: str, max_new_tokens: int) -> list[int] | None:
    enc = getattr(policy, "encode_prompt", None)
    return enc(prompt, max_new_tokens) if enc is not None else None


def training_rows(records, policy, max_new_tokens: int) -> tuple[list[dict], list[dict], list]:
    """(dpo rows, sft rows, pairs) from kept records: pairs by RAG-Gym's rule (supervision.ranking.ranking_pairs);
    ids are the prompt as the policy encoded it and each candidate's sampled ids (text when ids are unknown)."""
    from jaxrag.supervision.ranking import ranking_pairs

    dpo, sft, pairs = [], [], []
    for rec in records:
        ids = {c.raw: c.token_ids for c in rec.candidates}
        prompt_ids = _encode(policy, rec.prompt, max_new_tokens)
        rec_pairs = ranking_pairs([rec])
        pairs += rec_pairs
        for p in rec_pairs:
            if prompt_ids is not None and ids.get(p.chosen) and ids.get(p.rejected):
                dpo.append({"prompt_ids": prompt_ids, "chosen_ids": ids[p.chosen], "rejected_ids": ids[p.rejected],
                            "qid": p.qid, "step": p.step, "margin": p.margin})
            else:
                dpo.append({"prompt": p.prompt, "chosen": p.chosen, "rejected": p.rejected, "qid": p.qid,
                            "step": p.step, "margin": p.margin})
        ranked = [c for c in rec.candidates if c.rank is not None]
        if ranked:
            best = min(ranked, key=lambda c: c.rank)
            if prompt_ids is not None and best.token_ids:
                sft.append({"prompt_ids": prompt_ids, "completion_ids": best.token_ids, "qid": rec.qid, "step": rec.step})
            else:
                sft.append({"prompt": rec.prompt, "completion": best.raw, "qid": rec.qid, "step": rec.step})
    return dpo, sft, pairs


def _write_rows(path: Path, rows: list[dict]) -> None:
    write_atomic(path, lambda f: f.writelines(json.dumps(r) + "\n" for r in rows))


def _actor(sc, name: str, workdir):
    """(policy, retriever, agent) of a collection stage's section: the policy loader (`policy.fn`, default
    load_policy), the retriever, and the agent design rendered with the policy's chat template unless opts say
    otherwise."""
    from jaxrag.env.agents import get_agent
    from jaxrag.main import resolve_fn

    pcfg = plain(sc.policy)
    policy = resolve_fn(pcfg.get("fn", LOAD_POLICY), f"config.{name}.policy.fn")(pcfg, workdir)
    retriever = load_retriever(plain(sc.retriever), workdir)
    opts = dict(plain(sc.agent).get("opts", {}))
    if opts.get("mode", "chat") == "chat":
        opts.setdefault("tokenizer", getattr(policy, "tokenizer", None))
    return policy, retriever, get_agent(sc.agent.name, **opts)


def ranking_stage(config, workdir, name) -> None:
    from jaxrag.data.qa import load_qa
    from jaxrag.env.mdp import write_episodes
    from jaxrag.supervision.ranking import RankingConfig, collect_ranking
    from jaxrag.supervision.records import write_pairs, write_records

    sc = config[name]
    out = stage_dir(workdir, name)
    policy, retriever, agent = _actor(sc, name, workdir)
    questions = load_qa(resolve(sc.questions.path, workdir), sc.questions.get("select") or None)
    judge = make_judge(plain(sc.judge), workdir, policy)
    rc = RankingConfig(**plain(sc.ranking))
    episodes: list = []
    records, stats = collect_ranking(policy, retriever, agent, judge, questions, rc, episodes=episodes)
    dpo, sft, pairs = training_rows(records, policy, rc.max_new_tokens)
    write_records(out / "records.jsonl", records)
    write_pairs(out / "pairs.jsonl", pairs)
    _write_rows(out / "dpo.jsonl", dpo)
    _write_rows(out / "sft.jsonl", sft)
    write_episodes(out / "episodes.jsonl", episodes)
    stats.update(pairs=len(pairs), sft_rows=len(sft), judge=judge.name)
    write_json(out / "stats.json", stats)
    log(name, f"{stats['questions']} questions, {stats['trajectories_kept']} kept, {stats['states']} states, "
              f"{len(pairs)} pairs, {stats['judge_failures']} judge failures")
    if not pairs:
        raise RuntimeError(f"{name}: no preference pairs from {stats['questions']} questions ({stats['trajectories_kept']} "
                           f"trajectories kept, {stats['judge_failures']} judge failures; see {out}/stats.json): "
                           "nothing for a DPO stage to train on")


ranking_stage.check_config = check_config


# ------------------------------------------------------------------------------------------ critic training data
def critic_pairs(records, agent, tokenizer, max_len: int, add_bos: bool = True) -> tuple[list[dict], int]:
    """RAG-Gym's reward-model pairs (released rag_gym/algorithms/prm/reward/reward.py: every candidate with reward
    > 0.75 against every one < 0.5 at the same state of a kept trajectory; supervision.ranking.ranking_pairs) with
    each state re-rendered by `agent` (in the critic's own chat template) and tokenized with the critic's tokenizer
    exactly as jaxrag.supervision.critic.CriticScorer reads it at inference: the prompt rendered within max_len
    minus the state's longest action (the agent's shorter views), with BOS, each action on its own. A pair still
    longer than max_len is dropped, as the released code drops examples over max_length (4,096).
    -> ({prompt_ids, chosen_ids, rejected_ids, qid, step, margin} rows, pairs dropped)."""
    from jaxrag.supervision.ranking import ranking_pairs

    rows, dropped = [], 0
    for rec in records:
        pairs = ranking_pairs([rec])
        if not pairs:
            continue
        acts = {t: tokenizer.encode(t) for p in pairs for t in (p.chosen, p.rejected)}
        reserve = max(len(a) for a in acts.values())
        fits = lambda prompt: len(tokenizer.encode(prompt, add_bos=add_bos)) + reserve <= max_len  # noqa: E731
        prompt_ids = tokenizer.encode(agent.render(rec.state(), fits), add_bos=add_bos)
        for p in pairs:
            chosen, rejected = acts[p.chosen], acts[p.rejected]
            if not chosen or not rejected or len(prompt_ids) + max(len(chosen), len(rejected)) > max_len:
                dropped += 1
                continue
            rows.append({"prompt_ids": prompt_ids, "chosen_ids": chosen, "rejected_ids": rejected, "qid": p.qid,
                         "step": p.step, "margin": p.margin})
    return rows, dropped


def critic_pairs_stage(config, workdir, name) -> None:
    """config[name]: records (a collect stage's records.jsonl, relative to the workdir), agent ({name, opts}: the
    design whose prompts the critic reads, as in the eval stage's critic entry), tokenizer (the critic's: a dir,
    absolute, relative to the workdir or stage:<s>; RAG-Gym's critic is Llama-3.1-8B-Instruct), max_len (default
    4,096: the released max_length). Writes
    workdir/<name>/pairs.jsonl (ids in the critic's tokens, for the train stage with loss "bt") and stats.json."""
    from jaxrag.env.agents import get_agent
    from jaxrag.supervision.records import read_records
    from jaxrag.tokenizer import load_tokenizer

    sc = config[name]
    out = stage_dir(workdir, name)
    tok = load_tokenizer(resolve(sc.tokenizer, workdir))
    opts = dict(plain(sc.agent).get("opts", {}))
    if opts.get("mode", "chat") == "chat":
        opts["tokenizer"] = tok
    agent = get_agent(sc.agent.name, **opts)
    records = read_records(resolve(sc.records, workdir))
    rows, dropped = critic_pairs(records, agent, tok, int(sc.get("max_len", 4096)))
    _write_rows(out / "pairs.jsonl", rows)
    stats = {"records": len(records), "pairs": len(rows), "dropped": dropped, "max_len": int(sc.get("max_len", 4096)),
             "tokenizer": str(resolve(sc.tokenizer, workdir))}
    write_json(out / "stats.json", stats)
    log(name, f"{len(rows)} critic pairs from {len(records)} states ({dropped} dropped: an empty action or over max_len)")
    if not rows:
        raise RuntimeError(f"{name}: no critic pairs in {resolve(sc.records, workdir)}: nothing to train on")


def check_critic_pairs(config, name: str) -> None:
    from jaxrag.env.agents import agent_module

    sc = config[name]
    for key in ("records", "agent", "tokenizer"):
        if not sc.get(key):
            config_fail(f"{name}.{key}", "missing or empty")
    try:
        agent_module(sc.agent.get("name") or "")
    except KeyError as e:
        config_fail(f"{name}.agent.name", e.args[0])


critic_pairs_stage.check_config = check_critic_pairs


# ------------------------------------------------------------------------------------- rollout (Math-Shepherd) source
def rollout_values_stage(config, workdir, name) -> None:
    """RAG-Gym Table 4's "PRM (Rollout)" process source (001 §4.1; Math-Shepherd, METHODS.md §5): every candidate
    of a collection's kept states re-scored by the mean outcome of M continuations from it
    (jaxrag.supervision.rollout_values; the engine batches every continuation of every candidate together).
    config[name]: records (a collect stage's records.jsonl, relative to the workdir), policy (a load_policy spec:
    the actor that continues), retriever, agent ({name, opts}), rollouts (RolloutValueConfig fields), summarizer
    (optional policy spec; default the policy). Writes workdir/<name>/records.jsonl (source "rollout"; pairs by the
    same > 0.75 / < 0.5 rule via critic_pairs_stage), agreement.{md,csv}: pairwise ranking agreement of the rollout
    values with the collection's judge ranks on the same states (jaxrag.supervision.agreement; the paper's Agree
    column is against human annotators on MedQA, which jaxrag does not have), and stats.json."""
    from jaxrag.supervision.agreement import agreement_csv, agreement_markdown, agreement_table
    from jaxrag.supervision.records import read_records, write_records
    from jaxrag.supervision.rollout_values import RolloutValueConfig, rollout_values

    sc = config[name]
    out = stage_dir(workdir, name)
    policy, retriever, agent = _actor(sc, name, workdir)
    scfg = plain(sc.get("summarizer", None) or {})
    summarizer = load_policy(scfg, workdir) if scfg.get("path") else None
    records = read_records(resolve(sc.records, workdir))
    stats: dict = {}
    valued = rollout_values(policy, retriever, agent, records, RolloutValueConfig(**plain(sc.rollouts)),
                            summarizer=summarizer, stats=stats)
    write_records(out / "records.jsonl", valued)
    src = records[0].source if records else "judge"
    rows = agreement_table({src: records, "rollout": valued}, reference=src)
    (out / "agreement.md").write_text(f"Agreement of rollout values with {src} on the same {len(records)} states "
                                      "(no human annotations: the paper's Agree column is not reproducible)\n\n"
                                      + agreement_markdown(rows))
    (out / "agreement.csv").write_text(agreement_csv(rows))
    write_json(out / "stats.json", {"records": len(records), "agreement": rows,
                                    **{k: v for k, v in stats.items() if isinstance(v, (int, float, str))}})
    log(name, f"{len(valued)} states valued by rollouts; agreement with {src}: {rows[0]['agreement'] if rows else None}")


def check_rollout_values(config, name: str) -> None:
    from jaxrag.env.agents import agent_module
    from jaxrag.supervision.rollout_values import RolloutValueConfig

    sc = config[name]
    for key in ("records", "policy", "retriever", "agent", "rollouts"):
        if key not in sc or not sc[key]:
            config_fail(f"{name}.{key}", "missing or empty")
    if sc.policy.get("fn", LOAD_POLICY) == LOAD_POLICY and not sc.policy.get("path"):
        config_fail(f"{name}.policy.path", "empty: set it to a Hugging Face checkpoint dir (or stage:<name>)")
    try:
        agent_module(sc.agent.get("name") or "")
    except KeyError as e:
        config_fail(f"{name}.agent.name", e.args[0])
    try:
        RolloutValueConfig(**plain(sc.rollouts))
    except (TypeError, ValueError) as e:
        config_fail(f"{name}.rollouts", str(e))


rollout_values_stage.check_config = check_rollout_values


# -------------------------------------------------------------------------------------- ReasonRAG MCTS on a QA file
def mcts_rows(trees, records, policy, min_margin: float, max_new_tokens: int) -> tuple[list[dict], list[dict], list]:
    """(dpo rows, sft rows, pairs) of grown trees: sibling pairs with |ΔQ| >= min_margin (002 §2.2.3: different
    text, reward gap >= 0.01; jaxrag.supervision.mcts.tree_pairs); SFT rows = each distinct preferred response at its
    state (002 §3.4, "ReasonRAG (SFT)"). Ids: the prompt as the policy encodes it, an action's sampled ids; an evidence
    extraction (its ids are not kept by the tree), and everything of a policy that does not encode its prompts, go as
    text, which the train stage tokenizes with its `tokenizer`."""
    from jaxrag.supervision.mcts import tree_pairs

    ids = {(r.prompt, c.raw): c.token_ids for r in records for c in r.candidates if c.token_ids}
    enc: dict = {}
    dpo, sft, pairs, seen = [], [], [], set()
    for t in trees:
        for p in tree_pairs(t, min_margin):
            pairs.append(p)
            if p.prompt not in enc:
                enc[p.prompt] = _encode(policy, p.prompt, max_new_tokens)
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
    from jaxrag.data.qa import load_qa
    from jaxrag.supervision.mcts import MCTSConfig, run_mcts, tree_records, write_trees
    from jaxrag.supervision.mcts_env import PolicyTreeEnv
    from jaxrag.supervision.records import write_pairs, write_records

    sc = config[name]
    out = stage_dir(workdir, name)
    policy, retriever, agent = _actor(sc, name, workdir)
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
    _write_rows(out / "dpo.jsonl", dpo)
    _write_rows(out / "sft.jsonl", sft)
    with_pairs = {p.qid for p in pairs}
    _write_rows(out / "questions.jsonl", [{"id": q.id, "question": q.question, "golden_answers": list(q.golden_answers),
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
    from jaxrag.data.qa import QADataError, parse_select
    from jaxrag.env.agents import agent_module
    from jaxrag.supervision.mcts import MCTSConfig
    from jaxrag.supervision.mcts_env import PolicyTreeEnv

    sc = config[name]
    for key in ("policy", "retriever", "questions", "agent", "mcts", "env", "trees_per_round"):
        if key not in sc:
            config_fail(f"{name}.{key}", "missing")
    if sc.policy.get("fn", LOAD_POLICY) == LOAD_POLICY and not sc.policy.get("path"):
        config_fail(f"{name}.policy.path", "empty: set it to a Hugging Face checkpoint dir (or stage:<name>)")
    for i, qs in enumerate(_question_sets(sc)):
        key = f"{name}.questions" + (f"[{i}]" if isinstance(plain(sc.questions), (list, tuple)) else "")
        if not isinstance(qs, dict) or not qs.get("path"):
            config_fail(f"{key}.path", "empty: a QA JSONL file")
        try:
            parse_select(qs.get("select"), 1)
        except QADataError as e:
            config_fail(f"{key}.select", str(e))
    try:
        agent_module(sc.agent.get("name") or "")
    except KeyError as e:
        config_fail(f"{name}.agent.name", e.args[0])
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
        jc = plain(sc.judge)
        if jc.get("kind") not in JUDGE_KINDS:
            config_fail(f"{name}.judge.kind", f"{jc.get('kind')!r}: choose one of {JUDGE_KINDS}")


mcts_stage.check_config = check_mcts


# ------------------------------------------------------------------------------ SmartSearch curriculum on a QA file
def outcome_pairs(episodes, agent, cfg) -> list:
    """Stage 2 "w/o process rewards" (004 §5.3: preference "based exclusively on the final answer correctness"): per
    question, the first correct trajectory ≻ the first incorrect one (input order: sampled, then refined); margin 1."""
    from jaxrag.supervision import smartsearch as SS
    from jaxrag.supervision.records import Pair

    groups: dict = {}
    for ep in episodes:
        groups.setdefault(ep.qid, []).append(ep)
    out = []
    for qid, group in groups.items():
        right = [ep for ep in group if SS.is_correct(ep, cfg)]
        wrong = [ep for ep in group if not SS.is_correct(ep, cfg)]
        if right and wrong:
            out.append(Pair(agent.render(group[0].state(0)), SS.trajectory_text(right[0], agent),
                            SS.trajectory_text(wrong[0], agent), 1.0, "outcome", qid, 0))
    return out


def smartsearch_stage(config, workdir, name) -> None:
    """SmartSearch's curriculum data (004 §4.2-4.4; released scripts/data_construction) on a real QA file: the
    policy's trajectories, dual-level credit (novelty by rule + usefulness by the judge, 004 App. A), and with
    `refine` every S_t = 0 query rewritten by the judge and the trajectory regenerated from it
    (jaxrag.supervision.smartsearch: assess, refine, sft_filter, dpo_pairs).
    config[name]: policy, retriever, agent, questions ({path, select}), judge (as ranking_stage's: it scores
    usefulness and refines; the paper's is a Qwen2.5-3B student of Qwen3-32B), rollout (RolloutConfig fields: the
    sampling of the `samples` trajectories per question), refine (bool), smartsearch (SmartSearchConfig fields).
    Writes under workdir/<name>/ text rows for jaxrag.pipelines.train (prompt = the agent's first prompt, completion /
    chosen / rejected = the trajectory as the agent renders it, results included, as the released transfer_*.py
    take the whole response): sft.jsonl (stage 1: correct, well formed, every S_t = 1), sft_outcome.jsonl (stage 1
    "w/o process rewards": correct and well formed), dpo.jsonl (stage 2: dpo_pairs over the sampled and refined
    trajectories), dpo_outcome.jsonl (stage 2 "w/o process rewards": `outcome_pairs`), episodes.jsonl,
    records.jsonl (per-step credit), stats.json."""
    import dataclasses

    from jaxrag.data.qa import load_qa
    from jaxrag.env.mdp import write_episodes
    from jaxrag.env.rollout import RolloutConfig, rollout
    from jaxrag.supervision import smartsearch as SS
    from jaxrag.supervision.records import write_records

    sc = config[name]
    out = stage_dir(workdir, name)
    policy, retriever, agent = _actor(sc, name, workdir)
    questions = load_qa(resolve(sc.questions.path, workdir), sc.questions.get("select") or None)
    judge = make_judge(plain(sc.judge), workdir, policy)
    cfg = SS.SmartSearchConfig(**plain(sc.smartsearch)).validate()
    rc = RolloutConfig(**plain(sc.rollout))
    episodes = rollout(policy, retriever, agent, [q for q in questions for _ in range(int(sc.samples))], rc)
    SS.assess(episodes, judge, cfg)
    refined = SS.Refinement([], [], 0)
    if sc.refine:
        refined = SS.refine(episodes, judge, policy, retriever, agent, dataclasses.replace(rc, seed=rc.seed + 37))
        SS.assess(refined.episodes, judge, cfg)
    every = episodes + refined.episodes

    def rows(eps, key: str) -> list[dict]:
        return [{"prompt": agent.render(ep.state(0)), key: SS.trajectory_text(ep, agent), "qid": ep.qid} for ep in eps]

    def pair_rows(pairs) -> list[dict]:
        return [{"prompt": p.prompt, "chosen": p.chosen, "rejected": p.rejected, "qid": p.qid, "margin": p.margin}
                for p in pairs]

    sft = SS.sft_filter(every, cfg)
    sft_outcome = [ep for ep in every if SS.is_correct(ep, cfg) and SS.format_check(ep)[0]]
    pairs, pairs_outcome = SS.dpo_pairs(every, agent, cfg), outcome_pairs(every, agent, cfg)
    _write_rows(out / "sft.jsonl", rows(sft, "completion"))
    _write_rows(out / "sft_outcome.jsonl", rows(sft_outcome, "completion"))
    _write_rows(out / "dpo.jsonl", pair_rows(pairs))
    _write_rows(out / "dpo_outcome.jsonl", pair_rows(pairs_outcome))
    write_episodes(out / "episodes.jsonl", every)
    write_records(out / "records.jsonl", SS.credit_records(every, agent))
    stats = {"questions": len(questions), "sampled": len(episodes), "refine_requests": refined.requests,
             "refined": len(refined.episodes), "refine_failures": len(refined.failures), "sft": len(sft),
             "sft_outcome": len(sft_outcome), "pairs": len(pairs), "pairs_outcome": len(pairs_outcome),
             "correct_sampled": sum(SS.is_correct(e, cfg) for e in episodes),
             "search_quality_sampled": SS.search_quality(episodes, cfg), "judge": judge.name}
    write_json(out / "stats.json", stats)
    log(name, f"{len(episodes)} trajectories ({stats['correct_sampled']} correct), {refined.requests} queries refined "
              f"into {len(refined.episodes)} trajectories; rows: sft {len(sft)}, sft_outcome {len(sft_outcome)}, "
              f"dpo {len(pairs)}, dpo_outcome {len(pairs_outcome)}")


def check_smartsearch(config, name: str) -> None:
    from jaxrag.data.qa import QADataError, parse_select
    from jaxrag.env.agents import agent_module
    from jaxrag.env.rollout import RolloutConfig
    from jaxrag.supervision.smartsearch import SmartSearchConfig

    sc = config[name]
    for key in ("policy", "retriever", "questions", "agent", "judge", "rollout", "samples", "refine", "smartsearch"):
        if key not in sc:
            config_fail(f"{name}.{key}", "missing")
    if sc.policy.get("fn", LOAD_POLICY) == LOAD_POLICY and not sc.policy.get("path"):
        config_fail(f"{name}.policy.path", "empty: set it to a Hugging Face checkpoint dir (or stage:<name>)")
    if not sc.questions.get("path"):
        config_fail(f"{name}.questions.path", "empty: a QA JSONL file")
    try:
        parse_select(sc.questions.get("select"), 1)
    except QADataError as e:
        config_fail(f"{name}.questions.select", str(e))
    try:
        agent_module(sc.agent.get("name") or "")
    except KeyError as e:
        config_fail(f"{name}.agent.name", e.args[0])
    for key, cls in (("rollout", RolloutConfig), ("smartsearch", SmartSearchConfig)):
        try:
            obj = cls(**plain(sc[key]))
        except (TypeError, ValueError) as e:
            config_fail(f"{name}.{key}", str(e))
        if key == "smartsearch":
            try:
                obj.validate()
            except ValueError as e:
                config_fail(f"{name}.{key}", str(e))
    if int(sc.samples) < 1:
        config_fail(f"{name}.samples", f"{sc.samples}: must be >= 1")
    jc = plain(sc.judge)
    if jc.get("kind") not in JUDGE_KINDS:
        config_fail(f"{name}.judge.kind", f"{jc.get('kind')!r}: choose one of {JUDGE_KINDS}")
    if jc["kind"] == "http" and not (jc.get("base_url") and jc.get("model")):
        config_fail(f"{name}.judge", "an http judge needs base_url and model (the process-reward model's endpoint)")


smartsearch_stage.check_config = check_smartsearch
