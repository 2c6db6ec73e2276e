"""RAG-Gym's process-supervision collection on real data (a QA file, a retriever, an LLM judge): `ranking_stage`
(below), and further down critic_pairs_stage and rollout_values_stage (RAG-Gym's critics). ReasonRAG's MCTS-SPRE
pairs: pipelines/collect_mcts.py; SmartSearch's curriculum data: pipelines/collect_smartsearch.py.

config[name]:
  policy      a load_policy spec: the actor whose candidates are ranked ({path, max_prompt_tokens, ...}; or
              {fn: "module:function"}: fn(section, workdir) -> a Policy)
  retriever   a load_retriever spec ({index_dir | corpus, kind, backend, ...})
  questions   {path, select}: the training questions (RAG-Gym: the first 1,000 of HotpotQA dev)
  agent       {name, opts}: the agent design (chat mode with the policy's tokenizer unless opts say otherwise)
  judge       {kind: "http", base_url, model, api_key_env, max_retries, timeout_s, max_workers}: an OpenAI-compatible
              endpoint with RAG-Gym's ranking prompt (001 App. H Fig. 10) | {kind: "local", path, ...}: a local
              checkpoint with the same prompt (empty path: the policy itself) | {kind: "fn", fn: "module:function"}:
              fn(judge_section, workdir) -> a judge (e.g. jaxrag.testing:shortest_judge, the smoke variant's stand-in);
              http / local: `options` = supervision.prompts.PromptOptions fields (rank_parse "strict" | "lenient")
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

from jaxrag.data.qa import QADataError, load_qa, parse_select
from jaxrag.env.agents import agent_module, get_agent
from jaxrag.env.mdp import write_episodes
from jaxrag.jsonl import write_atomic
from jaxrag.pipelines.common import (config_fail, load_policy, load_retriever, log, plain, resolve, stage_dir,
                                     write_json)
from jaxrag.stage_fn import resolve_fn
from jaxrag.supervision.agreement import agreement_csv, agreement_markdown, agreement_table
from jaxrag.supervision.judges import HttpJudge, LocalJudge
from jaxrag.supervision.prompts import PromptOptions
from jaxrag.supervision.ranking import RankingConfig, collect_ranking, ranking_pairs
from jaxrag.supervision.records import failures_line, judge_failures, read_records, write_pairs, write_records
from jaxrag.supervision.rollout_values import RolloutValueConfig, rollout_values
from jaxrag.tokenizer import load_tokenizer
from jaxrag.train.distributed import lead_only


JUDGE_KINDS = ("http", "local", "fn")
LOAD_POLICY = "jaxrag.pipelines.common:load_policy"


def make_judge(jc: dict, workdir, policy):
    """The judge of a `judge` section (see the module doc)."""
    kind = jc.get("kind")
    opts = PromptOptions(**(jc.get("options") or {}))  # e.g. {"rank_parse": "lenient", "step_score_variant": "code"}
    if kind == "http":
        kw = {k: jc[k] for k in ("api_key_env", "max_retries", "timeout_s", "max_workers", "max_tokens") if k in jc}
        return HttpJudge(jc["base_url"], jc["model"], options=opts, **kw)
    if kind == "local":
        judge_policy = load_policy(jc, workdir) if jc.get("path") else policy
        return LocalJudge(judge_policy, name=jc.get("name") or "local", options=opts,
                          **{k: jc[k] for k in ("max_retries", "max_new_tokens", "temperature") if k in jc})
    if kind == "fn":
        return resolve_fn(jc["fn"], "judge.fn")(jc, workdir)
    raise ValueError(f"judge.kind={kind!r}: choose one of {JUDGE_KINDS}")


def check_actor(config, name: str, keys) -> None:
    """What every collection stage reads as ranking_stage does: its `keys` present, the policy's checkpoint named,
    a known agent design (collect_mcts, collect_smartsearch use it too)."""
    sc = config[name]
    for key in keys:
        if key not in sc:
            config_fail(f"{name}.{key}", "missing")
    if sc.policy.get("fn", LOAD_POLICY) == LOAD_POLICY and not sc.policy.get("path"):
        config_fail(f"{name}.policy.path", "empty: set it to a Hugging Face checkpoint dir (or stage:<name>)")
    try:
        agent_module(sc.agent.get("name") or "")
    except KeyError as e:
        config_fail(f"{name}.agent.name", e.args[0])


def check_questions(key: str, qs) -> None:
    """A questions section ({path, select}) at config key `key`."""
    if not isinstance(qs, dict) or not qs.get("path"):
        config_fail(f"{key}.path", "empty: a QA JSONL file")
    try:
        parse_select(qs.get("select"), 1)
    except QADataError as e:
        config_fail(f"{key}.select", str(e))


def check_judge(name: str, jc: dict, http_example: str) -> None:
    """A judge section (make_judge's): a known kind; an http judge's endpoint (`http_example` in the message)."""
    if jc.get("kind") not in JUDGE_KINDS:
        config_fail(f"{name}.judge.kind", f"{jc.get('kind')!r}: choose one of {JUDGE_KINDS}")
    if jc["kind"] == "http" and not (jc.get("base_url") and jc.get("model")):
        config_fail(f"{name}.judge", f"an http judge needs base_url and model ({http_example})")
    if jc["kind"] == "fn" and not jc.get("fn"):
        config_fail(f"{name}.judge.fn", "empty: 'module:function'")
    try:
        PromptOptions(**(jc.get("options") or {}))
    except (TypeError, ValueError) as e:
        config_fail(f"{name}.judge.options", str(e))


def check_config(config, name: str) -> None:
    """Static checks run by jaxrag.main before any stage starts; errors name the key."""
    sc = config[name]
    check_actor(config, name, ("policy", "retriever", "questions", "agent", "judge", "ranking"))
    check_questions(f"{name}.questions", plain(sc.questions))
    try:
        RankingConfig(**plain(sc.ranking))
    except (TypeError, ValueError) as e:
        config_fail(f"{name}.ranking", str(e))
    check_judge(name, plain(sc.judge), "e.g. https://api.openai.com/v1, gpt-4o")


def encode_prompt(policy, prompt: str, max_new_tokens: int) -> list[int] | None:
    enc = getattr(policy, "encode_prompt", None)
    return enc(prompt, max_new_tokens) if enc is not None else None


def training_rows(records, policy, max_new_tokens: int, dedup: bool = True) -> tuple[list[dict], list[dict], list]:
    """(dpo rows, sft rows, pairs) from kept records: pairs by RAG-Gym's rule (supervision.ranking.ranking_pairs;
    `dedup`: each text pair once per state);
    ids are the prompt as the policy encoded it and each candidate's sampled ids (text when ids are unknown)."""
    dpo, sft, pairs = [], [], []
    for rec in records:
        ids = {c.raw: c.token_ids for c in rec.candidates}
        prompt_ids = encode_prompt(policy, rec.prompt, max_new_tokens)
        rec_pairs = ranking_pairs([rec], dedup=dedup)
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


def write_rows(path: Path, rows: list[dict]) -> None:
    write_atomic(path, lambda f: f.writelines(json.dumps(r) + "\n" for r in rows))


def actor(sc, name: str, workdir):
    """(policy, retriever, agent) of a collection stage's section: the policy loader (`policy.fn`, default
    load_policy), the retriever, and the agent design rendered with the policy's chat template unless opts say
    otherwise."""
    pcfg = plain(sc.policy)
    policy = resolve_fn(pcfg.get("fn", LOAD_POLICY), f"config.{name}.policy.fn")(pcfg, workdir)
    retriever = load_retriever(plain(sc.retriever), workdir)
    opts = dict(plain(sc.agent).get("opts", {}))
    if opts.get("mode", "chat") == "chat":
        opts.setdefault("tokenizer", getattr(policy, "tokenizer", None))
    return policy, retriever, get_agent(sc.agent.name, **opts)


@lead_only  # host-side: process 0 alone (docs/multihost.md)
def ranking_stage(config, workdir, name) -> None:
    sc = config[name]
    out = stage_dir(workdir, name)
    policy, retriever, agent = actor(sc, name, workdir)
    questions = load_qa(resolve(sc.questions.path, workdir), sc.questions.get("select") or None)
    judge = make_judge(plain(sc.judge), workdir, policy)
    rc = RankingConfig(**plain(sc.ranking))
    episodes: list = []
    records, stats = collect_ranking(policy, retriever, agent, judge, questions, rc, episodes=episodes)
    dpo, sft, pairs = training_rows(records, policy, rc.max_new_tokens, dedup=rc.pair_dedup)
    write_records(out / "records.jsonl", records)
    write_pairs(out / "pairs.jsonl", pairs)
    write_rows(out / "dpo.jsonl", dpo)
    write_rows(out / "sft.jsonl", sft)
    write_episodes(out / "episodes.jsonl", episodes)
    fails = judge_failures(records)
    stats.update(pairs=len(pairs), sft_rows=len(sft), judge=judge.name, judge_failed_states=fails["failed_states"],
                 judge_failure_kinds=fails["kinds"])
    write_json(out / "stats.json", stats)
    log(name, f"{stats['questions']} questions, {stats['trajectories_kept']} kept, {stats['states']} states, "
              f"{len(pairs)} pairs, {stats['judge_failures']} judge failures")
    if fails["failed_states"]:  # the last line of the stage: what the judge did not score, and why
        log(name, f"judge {judge.name}: {failures_line(fails)}; each candidate's failure is in {out / 'records.jsonl'}")
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


@lead_only  # host-side: process 0 alone (docs/multihost.md)
def critic_pairs_stage(config, workdir, name) -> None:
    """config[name]: records (a collect stage's records.jsonl, relative to the workdir), agent ({name, opts}: the
    design whose prompts the critic reads, as in the eval stage's critic entry), tokenizer (the critic's: a dir,
    absolute, relative to the workdir or stage:<s>; RAG-Gym's critic is Llama-3.1-8B-Instruct), max_len (default
    4,096: the released max_length). Writes
    workdir/<name>/pairs.jsonl (ids in the critic's tokens, for the train stage with loss "bt") and stats.json."""
    sc = config[name]
    out = stage_dir(workdir, name)
    tok = load_tokenizer(resolve(sc.tokenizer, workdir))
    opts = dict(plain(sc.agent).get("opts", {}))
    if opts.get("mode", "chat") == "chat":
        opts["tokenizer"] = tok
    agent = get_agent(sc.agent.name, **opts)
    records = read_records(resolve(sc.records, workdir))
    rows, dropped = critic_pairs(records, agent, tok, int(sc.get("max_len", 4096)))
    write_rows(out / "pairs.jsonl", rows)
    stats = {"records": len(records), "pairs": len(rows), "dropped": dropped, "max_len": int(sc.get("max_len", 4096)),
             "tokenizer": str(resolve(sc.tokenizer, workdir))}
    write_json(out / "stats.json", stats)
    log(name, f"{len(rows)} critic pairs from {len(records)} states ({dropped} dropped: an empty action or over max_len)")
    if not rows:
        raise RuntimeError(f"{name}: no critic pairs in {resolve(sc.records, workdir)}: nothing to train on")


def check_critic_pairs(config, name: str) -> None:
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
@lead_only  # host-side: process 0 alone (docs/multihost.md)
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
    sc = config[name]
    out = stage_dir(workdir, name)
    policy, retriever, agent = actor(sc, name, workdir)
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
