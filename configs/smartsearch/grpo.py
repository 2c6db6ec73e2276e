"""SmartSearch stage 3: online GRPO with the composite reward (004; METHODS.md §4-5; released code:
scripts/train/train.sh over verl, reward src/verl/utils/reward_score/re_call.py).

    python -m jaxrag.main --config=configs/smartsearch/grpo.py --workdir=runs/smartsearch \
        --config.rl.policy.path=runs/smartsearch/dpo/model --config.rl.questions.path=/data/train.jsonl \
        --config.rl.judge.base_url=http://localhost:9001/v1 --config.rl.judge.model=smartsearch-prm
    python -m jaxrag.main --config=configs/smartsearch/grpo.py:smoke --workdir=/tmp/ss_smoke   # CI, tiny, < 1 min

Reward: "smartsearch", r_comp + λ·r_format as the released compute_score_with_format computes it: the answer is the
last \\boxed{} of the trajectory (none: incorrect), correct iff F1 >= 0.8, S_t = novel (at most 1 repeated document)
and not judged "0". Judge: the process-reward model (`judge`, an OpenAI-compatible endpoint serving the paper's
Qwen2.5-3B PRM: set base_url and model) credits every query of every trajectory (independent groups: one batched
call per step, jaxrag.rl.group_rollout.independent), as the released reward manager does; the smoke variant uses a
local judge instead (the tiny policy itself: its replies rarely parse, so S_t then rests on novelty). Temperatures:
sampling 1.0, log-probs scored at the same 1.0 (verl's actor divides the logits by the rollout temperature).
Other settings (code): G = 8 rollouts per question, KL loss β = 0.001 with k3 ("low_var_kl") clamped to ±10, clip
0.2, lr 1e-6 constant, weight decay 0.01, gradient clip 1.0, 256 questions per RL step split into 4 minibatches of
64 (one epoch: 4 optimizer steps per RL step), token-mean aggregation, up to 5 searches per episode (5 turns + the
answer), E5 top-5 over wiki-18 in the paper (here: BM25 top-5 over the corpus file), the SmartSearch agent
(<think>/<search>/<answer> with \\boxed{}). Not reproduced: verl's entropy bonus (0.001) and its 8k-token response
budget across turns (here 1024 new tokens per action). configs/smartsearch/table3.py's s3 row adds the query
refinement rollout.
"""

import ml_collections

from jaxrag.paths import BENCHMARKS, SAMPLE
from jaxrag.pipelines.rl import stage_config, tiny_checkpoint_config


def get_config(variant: str = "") -> ml_collections.ConfigDict:
    if variant not in ("", "smoke"):
        raise ValueError(f"configs/smartsearch/grpo.py: unknown variant {variant!r} (use '' or 'smoke')")
    c = ml_collections.ConfigDict()
    c.stages = ["rl"]
    c.rl = s = stage_config()
    s.policy.path = "dpo/model"  # the stage-2 (DPO) policy under the workdir; override with --config.rl.policy.path
    s.policy.max_prompt_tokens = 16384 - 1024  # rows (prompt + one action) must fit the largest sequence bucket
    s.questions.path = "data/smartsearch_grpo_train.jsonl"  # the paper's training questions (not shipped)
    s.retriever.corpus = str(BENCHMARKS / "corpus_multihop_contexts.jsonl")
    s.agent.name, s.agent.mode = "smartsearch", "chat"
    s.agent.max_doc_chars = 0  # no cut: the papers show whole paragraphs
    s.reward = "smartsearch"
    s.rl.update(dict(steps=200, questions_per_step=256, group_size=8, inner_steps=1, minibatches=4,
                     temperature=1.0, max_new_tokens=1024, max_steps=6, k=5))
    t = s.train
    t.loss = "grpo"
    t.compute_dtype = "bfloat16"
    t.remat = True
    t.grad_accum = 8
    t.seq_buckets = (2048, 4096, 8192, 16384)
    t.optimizer.update(dict(lr=1e-6, warmup_steps=0, min_lr_ratio=1.0, weight_decay=0.01, clip_norm=1.0))
    t.grpo.update(dict(beta=0.001, kl_estimator="k3", kl_clamp=10.0, clip_eps=0.2, aggregation="token_mean",
                       adv_eps=1e-6, std_ddof=1))
    t.checkpoint.every_steps = 10
    # the process-reward model (usefulness of every query): an OpenAI-compatible endpoint (the released code serves
    # its PRM with sglang on port 9001); HttpJudge keys (jaxrag.pipelines.collect.make_judge)
    s.judge = {"kind": "http", "base_url": "http://localhost:9001/v1", "model": "smartsearch-prm", "api_key_env": "",
               "max_retries": 2, "timeout_s": 120.0, "max_workers": 16}
    if variant == "smoke":
        smoke(c)
    return c


def smoke(c: ml_collections.ConfigDict) -> None:
    """A tiny random checkpoint (setup stage), 4 HotpotQA dev questions, BM25 over a 300-passage corpus slice,
    2 RL steps of 2 questions x 2 episodes, two minibatches, the paper's reward "smartsearch"; the judge is local
    (the tiny policy itself, kind "local": no PRM model in CI)."""
    c.stages = ["setup", "rl"]
    c.setup = tiny_checkpoint_config(str(SAMPLE / "corpus_multihop_contexts.jsonl"))
    s = c.rl
    s.policy.path = "stage:setup"
    s.policy.max_prompt_tokens = 384
    s.judge = {"kind": "local", "max_retries": 1, "max_new_tokens": 8}
    s.questions.path = str(SAMPLE / "hotpotqa_dev_500.jsonl")
    s.questions.select = "first:4"
    s.retriever.corpus = str(SAMPLE / "corpus_multihop_contexts.jsonl")
    s.retriever.max_passages = 300
    s.agent.max_doc_chars = 60
    s.rl.update(dict(steps=2, questions_per_step=2, group_size=2, minibatches=2, max_new_tokens=16, max_steps=2,
                     k=2))
    t = s.train
    t.grad_accum = 1
    t.compute_dtype = "float32"
    t.remat = False
    t.seq_buckets = (512,)
    t.optimizer.update(dict(lr=1e-3, min_lr_ratio=0.0))
    t.checkpoint.update(dict(every_steps=1, async_save=False))
    t.progress = False
