"""RAG-Gym Table 4 (001 §4.1): reward sources. One process-reward collection per source -> one critic per source ->
the zero-shot Re²Search actor with each critic's best-of-N (10 actions at T = 1.0) on HotpotQA, 2WikiMultihopQA and
Bamboogle.

    python -m jaxrag.main --config=configs/rag_gym/table4.py --workdir=runs/rag_gym_t4 \
        --config.base_model=/models/Llama-3.1-8B-Instruct --config.critic_model=/models/Llama-3.1-8B-Instruct \
        --config.collect.judge.base_url=https://api.openai.com/v1
    python -m jaxrag.main --config=configs/rag_gym/table4.py:smoke --workdir=/tmp/rg_t4_smoke   # CI

Rows (method names as jaxrag.pipelines.published.METHODS):
  PRM (GPT)      collect: GPT-4o ranks (RAG-Gym's prompt) -> critic_pairs -> critic           "re2search+critic"
  PRM (Llama)    collect_llama: Llama-3.1-8B-Instruct (the base model, local) ranks with the same prompt ->
                 critic_pairs_llama -> critic_llama                                           "re2search+critic-llama"
  PRM (Rollout)  rollout: Math-Shepherd rollout values (M continuations per candidate by the base actor) on collect's
                 kept states -> critic_pairs_rollout -> critic_rollout                        "re2search+critic-rollout"
  PRM (Random)   a uniformly random choice among the N candidates (eval.random_critic)      "re2search+critic-random"
Outcome filter as the paper's "Truth": only trajectories with a correct answer (F1 > 0.75) are kept (collect).
The MedQA column is the argument `medqa` (`table4.py:medqa`): every collection on RAG-Gym's 1,000 MedQA training
questions over the medical corpus (configs/rag_gym/pieces.py:medqa_collect), rollout values by the chosen option
(metric acc), the eval on Table 2's MedQA stage. Not here: the ORM row (the paper does not say what its outcome reward
model is trained on) and the Agree column: agreement with human annotators, whose annotations are not available.
rollout/agreement.md reports instead the rollout values' pairwise agreement with the GPT-4o ranks on the same states. M (continuations per candidate) is not given in the paper: 4 (RolloutValueConfig).
Process rewards (collect, configs/rag_gym/pieces.py:collect): GPT-4o over HTTP ranks a state's 10 candidates (T 1.0)
at T = 0, reward 1/(1+rank); the reply read as the released lm_rerank.py reads it (judge.options.rank_parse
"strict"; "lenient" the option); pairs each (chosen, rejected) text once per state (ranking.pair_dedup, as dpo.py).
RAG-Gym has no tree value: no value scheme. docs/conformance.md lists what differs from the released code.
PRM (Llama)'s judge is the local base model with the same prompt, reply reading and pairs, at T = 0.
"""

import ml_collections

from configs.common import paper
from configs.rag_gym import pieces

DATASETS = ("HotpotQA", "2Wiki", "Bamboogle", "MedQA")   # MedQA: in the medqa column's own eval
SOURCES = ("", "llama", "rollout")   # "" = GPT-4o: stages collect / critic_pairs / critic


def _sfx(src: str) -> str:
    return f"_{src}" if src else ""


def get_config(variant: str = ""):
    variant, domain = paper.variant_and_domain("configs/rag_gym/table4.py", variant)
    agent = "re2search"
    c, t2, base, critic_base = pieces.critic_head("table4", (), agent, variant)   # stages: set below
    c.collect_llama = pieces.collect(base, t2, agent, judge={"kind": "local", "path": base, "name": "llama",
                                                            "max_prompt_tokens": 8192})
    if domain == "medqa":
        pieces.medqa_collect(c.collect, t2)
        pieces.medqa_collect(c.collect_llama, t2)
    c.rollout = ml_collections.ConfigDict({
        "fn": "jaxrag.pipelines.collect:rollout_values_stage", "records": "collect/records.jsonl",
        "policy": {"path": base, "max_prompt_tokens": 4096}, "retriever": c.collect.retriever.to_dict(),
        "agent": {"name": agent, "opts": {"max_doc_chars": None}},
        "rollouts": {"m": 4, "temperature": 1.0, "metric": c.collect.ranking.outcome_metric, "max_steps": 10, "k": 32,
                     "batch_size": 256, "max_new_tokens": 512, "summary_max_new_tokens": 512, "seed": 0},
    })
    records = {"": "collect/records.jsonl", "llama": "collect_llama/records.jsonl", "rollout": "rollout/records.jsonl"}
    stages = ["collect", "collect_llama", "rollout"]
    for src in SOURCES:
        if src:   # "": critic_pairs and critic from pieces.critic_head
            c[f"critic_pairs_{src}"] = pieces.critic_pairs(critic_base, records[src], agent)
            c[f"critic_{src}"] = pieces.critic(critic_base, f"critic_pairs_{src}/pairs.jsonl")
        stages += [f"critic_pairs{_sfx(src)}", f"critic{_sfx(src)}"]
    c.stages = stages + ["eval"]
    c.eval = t2.eval_medqa if domain == "medqa" else t2.eval
    c.eval.datasets = [d for d in c.eval.datasets if d["name"] in DATASETS]
    c.eval.agents = [pieces.critic_entry(agent, f"stage:critic{_sfx(s)}", **({"variant": s} if s else {}))
                     for s in SOURCES]
    c.eval.agents.append(pieces.critic_entry(agent, {"fn": "jaxrag.pipelines.eval:random_critic", "seed": 0},
                                             variant="random"))
    c.eval.policy.path = base
    if variant == "shared":   # both collections on the first 250 shared HotpotQA questions (as pieces.critic_head)
        c.collect_llama.questions.update(dict(path=c.collect.questions.path, select=c.collect.questions.select))
        c.eval.datasets = [dict(d, select="last:250") if d["name"] == "HotpotQA" else d for d in c.eval.datasets]
    elif variant == "smoke":
        smoke(c)
        if domain == "medqa":
            pieces.smoke_medqa(c)
    return c


def smoke(c) -> None:
    """Tiny random actor and critic; both collections ranked by the stand-in judge; 1 rollout per candidate of
    at most 2 steps; 2 steps per critic; N = 2 on 2 HotpotQA questions. A random model's rollouts all end at F1 0,
    so they give no pairs: the smoke takes the rollout row as far as its values and agreement table (the rollout
    stage) and leaves out critic_pairs_rollout, critic_rollout and the "critic-rollout" eval row."""
    from jaxrag.pipelines.rl import tiny_checkpoint_config

    c.stages = ["setup", "setup_critic"] + list(c.stages)
    c.setup = tiny_checkpoint_config(paper.SAMPLE_CORPUS)
    c.model = "tiny-random"
    c.base_model = "stage:setup"
    pieces.smoke_collect(c)
    pieces.smoke_collect(c, "collect_llama")
    pieces.smoke_critic(c)
    c.rollout.policy.max_prompt_tokens = 384
    c.rollout.retriever.update(dict(index_dir="", corpus=paper.SAMPLE_CORPUS, max_passages=300, kind="bm25"))
    c.rollout.agent.opts.max_doc_chars = 60
    c.rollout.rollouts.update(dict(m=1, max_steps=2, k=2, batch_size=8, max_new_tokens=16, summary_max_new_tokens=16))
    for src in ("llama", "rollout"):
        c[f"critic_pairs_{src}"].max_len = c.critic_pairs.max_len
        pieces.smoke_train(c[f"critic_{src}"])
        c[f"critic_{src}"].train.seq_buckets = c.critic.train.seq_buckets
    c.stages = [s for s in c.stages if s not in ("critic_pairs_rollout", "critic_rollout")]
    pieces.smoke_eval(c.eval, ("HotpotQA",), "last:2")
    c.eval.agents = [dict(a, n=2) for a in c.eval.agents if a.get("variant") != "rollout"]
