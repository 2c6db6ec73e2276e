"""The RAG-Gym training stages every tuned config shares (sft.py, ppo.py, table3.py, table4.py, fig4.py; `critic_head`:
the opening of the four critic configs), with the released code's settings (github RAG-Gym/RAG-Gym,
rag_gym/algorithms/prm/{sft,dpo,reward}/*.py, their CLI defaults) and the smoke variant's tiny versions. `base` is the
config's one FieldReference for the base checkpoint.

  collect       the process-reward collection (jaxrag.pipelines.collect:ranking_stage), as configs/rag_gym/dpo.py
  sft           LoRA r 256 / α 512 / dropout 0.05 on q, k, v, lr 5e-5, batch 4 x 16 accumulation = 64, 3 epochs
                (sft.py CLI), sequences up to 4,096 tokens, on collect's sft.jsonl (the best-ranked action per state)
  critic_pairs  collect's records re-rendered and tokenized for the critic (jaxrag.pipelines.collect:critic_pairs_stage)
  medqa_collect the collection of a MedQA row (RAG-Gym's 1,000 MedQA training questions, the medical corpus)
  critic        the Bradley–Terry PRM: Llama-3.1-8B-Instruct + a scalar head, LoRA r 256 / α 2r = 512 / dropout 0.05
                on q, k, v, lr 1e-5, batch 1 x 2 accumulation, 1 epoch, center_rewards_coefficient 0.01, inputs up
                to 4,096 tokens (reward.py CLI; its 10 % held-out eval split is not kept: every pair trains)
"""

import ml_collections

from configs.common import paper
from configs.common.train import train_stage


def critic_head(table: str, stages, agent: str = "re2search", variant: str = ""):
    """The opening every critic config shares (fig4.py, ppo.py, table3.py, table4.py): Table 2's protocol (its "shared"
    variant for "shared"), the FieldReferences `base` (the base checkpoint) and `critic_base` (the critic's), and a
    config with paper/table/model, base_model/critic_model bound to them, `stages`, and collect -> critic_pairs ->
    critic (this module's sections; in "shared", collect on the first 250 shared HotpotQA questions). Returns
    (config, t2, base, critic_base)."""
    from configs.rag_gym import table2 as t2_cfg

    t2 = t2_cfg.get_config("shared" if variant == "shared" else "")
    base = ml_collections.FieldReference("", field_type=str)
    critic_base = ml_collections.FieldReference("", field_type=str)
    c = ml_collections.ConfigDict({"paper": "rag_gym", "table": table, "model": "Llama-3.1-8B-Instruct"})
    c.base_model, c.critic_model = base, critic_base
    c.stages = list(stages)
    c.collect = collect(base, t2, agent)
    c.critic_pairs = critic_pairs(critic_base, agent=agent)
    c.critic = critic(critic_base)
    if variant == "shared":  # the shared HotpotQA dev 500: the first 250 collect, the eval takes the last 250
        c.collect.questions.path = t2.eval.datasets[0]["path"]
        c.collect.questions.select = "first:250"
    return c, t2, base, critic_base


def collect(base, t2, agent: str, judge: dict | None = None) -> ml_collections.ConfigDict:
    """RAG-Gym's ranking collection on the first 1,000 HotpotQA dev questions, as released (rollout.py, lm_rerank.py,
    dpo.py): the judge (GPT-4o over HTTP at T = 0 unless `judge` says otherwise) ranks the 10 candidates of a state,
    reward 1/(1+rank); its reply is read strictly (only a ```json{...}``` block; anything else: no reward for the
    state, where the code gives every action 0); pairs (reward > 0.75, reward < 0.5) once per text pair."""
    judge = dict(judge or {"kind": "http", "base_url": "", "model": "gpt-4o", "api_key_env": "OPENAI_API_KEY",
                           "max_retries": 2, "timeout_s": 120.0, "max_workers": 8})
    judge.setdefault("options", {"rank_parse": "strict"})   # "lenient": any JSON object, a permutation required
    return ml_collections.ConfigDict({
        "fn": "jaxrag.pipelines.collect:ranking_stage",
        "policy": {"path": base, "max_prompt_tokens": 4096},
        "retriever": t2.eval.retriever.to_dict(),
        "questions": {"path": "data/hotpotqa_dev.jsonl", "select": "first:1000"},
        "agent": {"name": agent, "opts": {"max_doc_chars": None}},
        "judge": judge,
        "ranking": {"n_candidates": 10, "temperature": 1.0, "max_steps": 10, "k": 32, "batch_size": 64,
                    "max_new_tokens": 512, "outcome_metric": "f1", "outcome_threshold": 0.75, "seed": 0,
                    "pair_dedup": True},   # False: a candidate sampled twice gives its pairs twice
    })


MEDQA_TRAIN = "data/medqa_train_1000.jsonl"


def medqa_collect(s: ml_collections.ConfigDict, t2) -> None:
    """A collect section made the MedQA column's (001 §4 and App. B; the released scripts' --data medqa): RAG-Gym's
    1,000 sampled MedQA training questions (its dataset/medqa_train_1000.csv; `python -m jaxrag.data.rag_gym_medqa`
    writes MEDQA_TRAIN), textbooks + StatPearls with BM25 + MedCPT (Table 2's eval_medqa retriever), and a
    trajectory kept iff its option is right (the released EMReward on the letter: outcome "acc")."""
    s.questions.update(dict(path=MEDQA_TRAIN, select="all"))
    s.retriever = t2.eval_medqa.retriever.to_dict()
    s.ranking.outcome_metric = "acc"


def _lora(t, rank: int = 256, alpha: float = 512.0) -> None:
    t.lora.update(dict(enabled=True, rank=rank, alpha=alpha, dropout=0.05, targets=("q", "k", "v")))


def sft(base, data: str = "collect/sft.jsonl") -> ml_collections.ConfigDict:
    s = train_stage("jaxrag.pipelines.train:train_stage", data, loss="sft", batch_size=64, grad_accum=16,
                    seq_buckets=(1024, 2048, 4096, 4608), compute_dtype="bfloat16", remat=True)
    s.init, s.tokenizer, s.epochs = base, base, 3
    _lora(s.train)
    s.train.optimizer.update(dict(lr=5e-5, warmup_steps=0))
    return s


def critic_pairs(critic_base, records: str = "collect/records.jsonl",
                 agent: str = "re2search") -> ml_collections.ConfigDict:
    return ml_collections.ConfigDict({"fn": "jaxrag.pipelines.collect:critic_pairs_stage", "records": records,
                                      "agent": {"name": agent, "opts": {"max_doc_chars": None}},
                                      "tokenizer": critic_base, "max_len": 4096})


def critic(critic_base, data: str = "critic_pairs/pairs.jsonl") -> ml_collections.ConfigDict:
    s = train_stage("jaxrag.pipelines.train:train_stage", data, loss="bt", batch_size=2, grad_accum=2,
                    seq_buckets=(1024, 2048, 4096), compute_dtype="bfloat16", remat=True)
    s.init, s.tokenizer, s.epochs = critic_base, critic_base, 1
    _lora(s.train)
    s.train.bt.center_coef = 0.01
    s.train.optimizer.update(dict(lr=1e-5, warmup_steps=0))
    return s


def critic_entry(agent: str, critic: str = "stage:critic", n: int = 10, **extra) -> dict:
    """An eval agent entry with PRM-guided best-of-N (001 App. E.3: 10 actions at T = 1.0 per step)."""
    return {"name": agent, "critic": critic, "n": n, "temperature": 1.0, **extra}


# ---- smoke -----------------------------------------------------------------------------------------------
def smoke_collect(c: ml_collections.ConfigDict, name: str = "collect") -> None:
    """4 shared HotpotQA questions, 3 candidates ranked by a stand-in judge (jaxrag.testing.shortest_judge)."""
    s = c[name]
    s.policy.max_prompt_tokens = 384
    s.retriever.update(dict(index_dir="", corpus=paper.SAMPLE_CORPUS, max_passages=300, kind="bm25"))
    s.questions.update(dict(path=str(paper.SAMPLE / paper.SHARED["HotpotQA"]), select="first:4"))
    s.agent.opts.max_doc_chars = 60
    s.judge = {"kind": "fn", "fn": "jaxrag.testing:shortest_judge"}
    s.ranking.update(dict(n_candidates=3, max_steps=2, k=2, batch_size=8, max_new_tokens=16, outcome_threshold=-1.0))


def smoke_critic(c: ml_collections.ConfigDict) -> None:
    """The smoke critic: its own tiny checkpoint (stage setup_critic: the same 2-layer Llama shape with room for
    1,024-token inputs, seed 1), pairs up to 1,024 tokens, 2 steps."""
    from jaxrag.pipelines.rl import tiny_checkpoint_config

    c.setup_critic = tiny_checkpoint_config(paper.SAMPLE_CORPUS)
    c.setup_critic.arch.max_seq_len = 1024
    c.setup_critic.seed = 1
    c.critic_model = "stage:setup_critic"
    c.critic_pairs.max_len = 1024
    smoke_train(c.critic)
    c.critic.train.seq_buckets = (1024,)


def smoke_train(s: ml_collections.ConfigDict, batch_size: int = 2) -> None:
    """A train stage in 2 float32 steps of `batch_size` rows (epochs off), LoRA r 4, sequences up to 512."""
    t = s.train
    s.epochs = 0
    t.update(dict(steps=2, batch_size=batch_size, grad_accum=1, seq_buckets=(512,), compute_dtype="float32",
                  remat=False))
    t.lora.rank, t.lora.alpha = 4, 8.0
    t.optimizer.lr = 1e-3
    t.checkpoint.update(dict(every_steps=1, async_save=False))
    t.progress = False


def smoke_medqa(c: ml_collections.ConfigDict) -> None:
    """A smoke config's MedQA column: every stage that samples questions (collections, PPO) takes the first 4 shared
    MedQA test questions over the shared corpus (there is no medical one here), the eval the last 2."""
    medqa = str(paper.SAMPLE / paper.SHARED["MedQA"])
    for name in c.stages:
        if "questions" in c[name]:
            c[name].questions.update(dict(path=medqa, select="first:4"))
    smoke_eval(c.eval, ("MedQA",), "last:2")


def smoke_eval(e: ml_collections.ConfigDict, datasets=("HotpotQA",), select: str = "last:2") -> None:
    e.retriever.update(dict(index_dir="", corpus=paper.SAMPLE_CORPUS, max_passages=300, kind="bm25"))
    e.datasets = [dict(name=d, path=str(paper.SAMPLE / paper.SHARED[d]), select=select) for d in datasets]
    e.policy.max_prompt_tokens = 384
    e.rollout.update(dict(k=2, max_steps=2, batch_size=8, max_new_tokens=16))
    e.max_doc_chars = 60
    e.index_recall = False
    if e.judge is not None:
        e.judge.base_url = ""
