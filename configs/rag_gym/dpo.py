"""RAG-Gym Table 2, DPO rows (001 §3; released rag_gym/algorithms/prm/rollout.py and dpo/dpo.py): process-reward
collection with a GPT-4o ranking judge, DPO on the process-level pairs, then the Table 2 protocol with the tuned actor.

    python -m jaxrag.main --config=configs/rag_gym/dpo.py --workdir=runs/rag_gym_dpo \
        --config.base_model=/models/Llama-3.1-8B-Instruct --config.collect.judge.base_url=https://api.openai.com/v1
    python -m jaxrag.main --config=configs/rag_gym/dpo.py:shared --workdir=runs/rag_gym_dpo_shared \
        --config.base_model=/models/Llama-3.1-8B-Instruct --config.collect.judge.base_url=http://localhost:8000/v1
    python -m jaxrag.main --config=configs/rag_gym/dpo.py:smoke --workdir=/tmp/rg_dpo_smoke   # CI: no LLM judge

Stages:
  collect  the first 1,000 HotpotQA dev questions (the eval takes the last 1,000); at every state N = 10 candidate
           actions at T = 1.0, ranked by the judge (GPT-4o over HTTP, T = 0) with RAG-Gym's prompt (sufficiency /
           utility / redundancy), the best executed; 10 steps, 32 documents; trajectories kept iff their answer's
           F1 > 0.75; reward 1/(1+rank), the judge's reply read as the released lm_rerank.py reads it (strict: only a
           ```json{...}``` block; `judge.options.rank_parse = "lenient"` accepts any JSON object); pairs (reward
           > 0.75, reward < 0.5) at one state, each text pair once as dpo.py (`ranking.pair_dedup`); pieces.collect.
  dpo      β 0.1, LoRA r 256 / α 512 / dropout 0.05 on q, k, v (reference: the base with adapters off), lr 2e-6, batch
           32 pairs (code: 1 x 32 accumulation), one epoch (the stage's `epochs`: steps = ceil(pairs / 32), logged),
           bf16 with remat, prompts up to 4,096 tokens.
  eval     configs/rag_gym/table2.py's protocol on the open-domain sets with the tuned actor ("<agent>+dpo"); the
           Search-o1 / Re²Search summaries from the untuned base model, as in RAG-Gym.
The design is the config's argument, alone or after the variant: `dpo.py:react`, `dpo.py:shared,search_o1` (RAG-Gym
tunes each of its six; default Re²Search, its best). `medqa` makes it the row's MedQA column (`dpo.py:medqa,react`):
collect on RAG-Gym's 1,000 MedQA training questions over the medical corpus (configs/rag_gym/pieces.py:medqa_collect;
write data/medqa_train_1000.jsonl with `python -m jaxrag.data.rag_gym_medqa`), eval on Table 2's MedQA stage.
`base_model` is the one place the base checkpoint is named (collect's policy, dpo's init and tokenizer, the
summarizer).
"""

import importlib.util
from pathlib import Path

import ml_collections

from configs.common import paper
from configs.common.train import train_stage
from configs.rag_gym import pieces


def _table2(variant: str):
    spec = importlib.util.spec_from_file_location("rag_gym_table2", Path(__file__).with_name("table2.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.get_config(variant)


def get_config(variant: str = ""):
    variant, agent, domain = paper.variant_and_agent("configs/rag_gym/dpo.py", variant)
    t2 = _table2("shared" if variant == "shared" else "")
    base = ml_collections.FieldReference("", field_type=str)
    c = ml_collections.ConfigDict({"paper": "rag_gym", "table": "table2", "model": "Llama-3.1-8B-Instruct"})
    c.base_model = base
    c.stages = ["collect", "dpo", "eval"]
    c.collect = pieces.collect(base, t2, agent)
    if domain == "medqa":
        pieces.medqa_collect(c.collect, t2)
    c.dpo = train_stage("jaxrag.pipelines.train:train_stage", "collect/dpo.jsonl", loss="dpo", steps=100,
                        batch_size=32, grad_accum=32, seq_buckets=(1024, 2048, 4096, 4608),
                        compute_dtype="bfloat16", remat=True)
    c.dpo.init = base
    c.dpo.tokenizer = base
    c.dpo.epochs = 1  # released dpo.py CLI: n_epochs 1
    t = c.dpo.train
    t.dpo.beta = 0.1
    t.lora.update(dict(enabled=True, rank=256, alpha=512.0, dropout=0.05, targets=("q", "k", "v")))
    t.optimizer.update(dict(lr=2e-6, warmup_steps=0))
    c.eval = t2.eval_medqa if domain == "medqa" else t2.eval
    c.eval.agents = [{"name": agent}]
    c.eval.policy.path = "stage:dpo"
    c.eval.summarizer.path = base
    c.eval.tuning = "dpo"
    if variant == "shared":
        c.collect.questions.path = t2.eval.datasets[0]["path"]   # the shared HotpotQA dev 500: first 250 train,
        c.collect.questions.select = "first:250"                  # the eval keeps its own selection (see below)
        c.eval.datasets = [dict(d, select="last:250") if d["name"] == "HotpotQA" else d for d in c.eval.datasets]
    elif variant == "smoke":
        smoke(c, agent)
        if domain == "medqa":
            pieces.smoke_medqa(c)
    return c


def smoke(c, agent: str) -> None:
    """A tiny random checkpoint, 4 shared HotpotQA questions, 3 candidates ranked by a stand-in judge with no model
    (jaxrag.testing.ShortestJudge: valid first, then shorter), every trajectory kept, 2 DPO steps, then the eval."""
    from jaxrag.pipelines.rl import tiny_checkpoint_config

    c.stages = ["setup", "collect", "dpo", "eval"]
    c.setup = tiny_checkpoint_config(paper.SAMPLE_CORPUS)
    c.model = "tiny-random"
    c.base_model = "stage:setup"
    c.collect.policy.max_prompt_tokens = 384
    c.collect.retriever.update(dict(index_dir="", corpus=paper.SAMPLE_CORPUS, max_passages=300, kind="bm25"))
    c.collect.questions.update(dict(path=str(paper.SAMPLE / paper.SHARED["HotpotQA"]), select="first:4"))
    c.collect.agent.opts.max_doc_chars = 60
    c.collect.judge = {"kind": "fn", "fn": "jaxrag.testing:shortest_judge"}
    c.collect.ranking.update(dict(n_candidates=3, max_steps=2, k=2, batch_size=8, max_new_tokens=16,
                                  outcome_threshold=-1.0))
    c.dpo.epochs = 0
    t = c.dpo.train
    t.update(dict(steps=2, batch_size=2, grad_accum=1, seq_buckets=(512,), compute_dtype="float32", remat=False))
    t.lora.rank, t.lora.alpha = 4, 8.0
    t.optimizer.lr = 1e-3
    t.checkpoint.update(dict(every_steps=1, async_save=False))
    t.progress = False
    e = c.eval
    e.retriever.update(dict(index_dir="", corpus=paper.SAMPLE_CORPUS, max_passages=300, kind="bm25"))
    e.datasets = [dict(name="HotpotQA", path=str(paper.SAMPLE / paper.SHARED["HotpotQA"]), select="last:2")]
    e.policy.max_prompt_tokens = 384
    e.rollout.update(dict(k=2, max_steps=2, batch_size=8, max_new_tokens=16))
    e.max_doc_chars = 60
    e.judge.base_url = ""
