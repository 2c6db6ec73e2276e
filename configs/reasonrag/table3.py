"""ReasonRAG Table 3 (002 §3.4 "Effectiveness of Different Optimization Strategies"): one base model, four ways to train
it, every row evaluated with Table 2's protocol (configs/reasonrag/table2.py: five benchmarks, BGE top 3 over wiki-18,
the ReasonRAG agent, temperature 0, EM / F1).

    python -m jaxrag.main --config=configs/reasonrag/table3.py --workdir=runs/reasonrag_t3 \
        --config.base_model=/models/Qwen2.5-7B-Instruct
    python -m jaxrag.main --config=configs/reasonrag/table3.py:shared --workdir=runs/rr_t3_shared \
        --config.base_model=/models/Qwen2.5-7B-Instruct      # training files as below; eval on the shared files
    python -m jaxrag.main --config=configs/reasonrag/table3.py:smoke --workdir=/tmp/rr_t3_smoke   # CI

Rows (jaxrag.pipelines.published.METHODS) and the stages behind them:
  ReasonRAG (Base)        eval_base: the untuned base model                                      "reasonrag"
  ReasonRAG (RL-PRL)      mcts -> dpo -> eval_dpo                                                "reasonrag+dpo"
  ReasonRAG (SFT)         mcts -> sft -> eval_sft                                                "reasonrag+sft"
  RL-ORL: 5k queries      orl_5k (outcome GRPO on mcts/questions.jsonl) -> eval_orl_5k           "reasonrag+orl-5k"
  RL-ORL: 10k queries     orl_10k (the same on those + 5k more) -> eval_orl_10k                  "reasonrag+orl-10k"

Stages and their settings:
  mcts     RAG-ProGuide's construction (002 §2.2.3; jaxrag.pipelines.collect_mcts:mcts_stage): 3,000 questions sampled from
           each of PopQA, HotpotQA and 2Wiki train; MCTS over the ReasonRAG agent's Reasoning / Grounding steps with
           the released code's settings and values (data_generation.py + reasonrag_pipeline.py: max_iter 7,
           max_children 2, 64 simulations, UCT Q + 1.414·sqrt(ln N_parent / N), retrieval top 3;
           preference_data_generation.py: SPRE decay 0.9, pairs of siblings with a reward gap >= 0.01 and different
           content). Value scheme "code": selection by the judge's value alone (every new node scored by the
           policy itself with ReasonRAG's evaluation prompt, 0-100 / 100, at T = 1.0, no rollouts; a node's Q = the
           mean of every score in its subtree, its own included), and pairs from the separate bottom-up SPRE over
           the tree's answered leaves (reward F1·0.9^depth; a leaf without a valid answer -- invalid, past max
           depth, a dead end -- gets no reward and is skipped). The paper's value (Eq. 1: SPRE over rollouts, one
           Q for selection and pairs, such leaves scored 0) is the named option:
               --config.mcts.mcts.value_scheme=paper --config.mcts.mcts.rollouts_per_node=1 \
               --config.mcts.mcts.judge_weight=0.0 --config.mcts.mcts.backup=children
           The policy samples at T = 1.0 (the code leaves the OpenAI default). The paper's policy and judge are
           GPT-4o: jaxrag samples and judges with a local checkpoint (`mcts.policy.path`, default the base model);
           no OpenAI-backed Policy exists. Writes dpo.jsonl, sft.jsonl and questions.jsonl (the questions whose
           trees gave a pair: 4,603 of 9,000 in the paper). docs/conformance.md lists what differs from the code.
  dpo      the released training_config/qwen_dpo.yaml (LLaMA-Factory): full fine-tuning, sigmoid DPO with β 0.3,
           lr 1e-6 cosine, 1 epoch, bf16, sequences up to 10,000 tokens; its batch is 1 per device x 2 accumulation
           on a device count it does not state: 8 devices assumed (batch 16). Its warmup ratio 0.2 is left out
           (jaxrag's warmup is a step count, and an epoch's step count follows the data) and so is its 10 % held-out
           eval split (every pair trains).
  sft      "the preferred responses from the RAG-ProGuide preference pairs as ground truth" (002 §3.4): mcts/sft.jsonl,
           one row per distinct preferred response. The paper gives no SFT settings: the DPO yaml's (lr, epoch, batch).
  orl_*    "outcome-level reward training following the Search-R1 protocol" (002 §3.4): Search-R1's train_grpo.sh
           (github PeterGriffinJin/Search-R1): GRPO, EM reward, 5 rollouts per question at T = 1, 512 questions per
           step in 2 minibatches of 256, KL loss 0.001 with k3 ("low_var_kl"), clip 0.2, lr 1e-6 with 28.5 % warmup,
           500 new tokens per action, 1,005 steps; top 3 documents and the ReasonRAG agent's 4 steps (Table 2's
           protocol) instead of Search-R1's own agent. orl_10k's questions (the 5k + 5,000 more sampled from PopQA,
           HotpotQA and 2Wiki train) are a file to prepare: `orl_10k.questions.path`.
  eval_*   Table 2's eval stage with the ReasonRAG agent only; the index's gold recall once (eval_base).
"""

import ml_collections

from configs.common import paper
from configs.common.train import train_stage
from configs.reasonrag import table2 as t2_cfg
from jaxrag.pipelines.rl import stage_config

TRAIN = (("PopQA", "data/popqa_train.jsonl"), ("HotpotQA", "data/hotpotqa_train.jsonl"),
         ("2Wiki", "data/2wikimultihopqa_train.jsonl"))
ROWS = (("eval_base", "base", ""), ("eval_dpo", "stage:dpo", "dpo"), ("eval_sft", "stage:sft", "sft"),
        ("eval_orl_5k", "stage:orl_5k", "orl-5k"), ("eval_orl_10k", "stage:orl_10k", "orl-10k"))


def mcts(base, t2) -> ml_collections.ConfigDict:
    return ml_collections.ConfigDict({
        "fn": "jaxrag.pipelines.collect_mcts:mcts_stage",
        "policy": {"path": base, "max_prompt_tokens": 8192},
        "retriever": t2.eval.retriever.to_dict(),
        "questions": [{"path": p, "select": "sample:3000:0"} for _, p in TRAIN],
        "agent": {"name": "reasonrag", "opts": {"max_doc_chars": None}},
        "mcts": {"uct": "code", "c": 1.414, "max_children": 2, "max_rollouts": 64, "max_iterations": 64,
                 "max_depth": 7, "rollouts_per_node": 0, "alpha": 0.9, "judge_weight": 1.0, "backup": "all",
                 "min_margin": 0.01, "value_scheme": "code"},
        "env": {"k": 3, "temperature": 1.0, "rollout_temperature": 1.0, "max_new_tokens": 512,
                "summary_max_new_tokens": 512, "batch_size": 64, "seed": 0},
        "trees_per_round": 64,
        # the code's evaluate_thoughts: the policy's own generator with the evaluation prompt, a 0-100 score
        "judge": {"kind": "local", "path": "", "name": "policy", "temperature": 1.0, "max_new_tokens": 512,
                  "options": {"step_score_variant": "code"}},
    })


def trained(base, loss: str, data: str) -> ml_collections.ConfigDict:
    """qwen_dpo.yaml's trainer: full fine-tuning, lr 1e-6 cosine, 1 epoch, batch 16 (1 x 2 accumulation x 8)."""
    s = train_stage("jaxrag.pipelines.train:train_stage", data, loss=loss, batch_size=16, grad_accum=2,
                    seq_buckets=(1024, 2048, 4096, 8192, 10240), compute_dtype="bfloat16", remat=True)
    s.init, s.tokenizer, s.epochs = base, base, 1
    s.train.optimizer.update(dict(lr=1e-6, warmup_steps=0))
    if loss == "dpo":
        s.train.dpo.update(dict(beta=0.3, loss_type="sigmoid"))
    return s


def orl(base, t2, questions: str) -> ml_collections.ConfigDict:
    """Outcome GRPO with Search-R1's settings (train_grpo.sh) on the ReasonRAG agent."""
    s = stage_config()
    s.policy.path = base
    s.policy.max_prompt_tokens = 4096
    s.retriever.update({k: v for k, v in t2.eval.retriever.to_dict().items() if k in s.retriever})
    s.questions.update(dict(path=questions, select="all"))
    s.agent.update(dict(name="reasonrag", mode="chat", max_doc_chars=0))
    s.reward = "em"
    s.rl.update(dict(steps=1005, questions_per_step=512, group_size=5, minibatches=2, temperature=1.0,
                     max_new_tokens=500, summary_max_new_tokens=500, max_steps=4, k=3))
    t = s.train
    t.loss = "grpo"
    t.update(dict(compute_dtype="bfloat16", remat=True, grad_accum=8, seq_buckets=(1024, 2048, 4096, 4608)))
    # verl steps its schedule once per RL step (warmup 0.285 x 1,005 = 286); jaxrag once per optimizer step (2 per
    # RL step): the same fraction of 2,010
    t.steps = 2010   # what rl_train_config sets (rl.steps x 2 minibatches); here so that the warmup checks against it
    t.optimizer.update(dict(lr=1e-6, warmup_steps=573, min_lr_ratio=1.0))
    t.grpo.update(dict(beta=0.001, kl_estimator="k3", clip_eps=0.2, aggregation="token_mean"))
    return s


def get_config(variant: str = ""):
    paper.check_variant("configs/reasonrag/table3.py", variant)
    t2 = t2_cfg.get_config("shared" if variant == "shared" else "")
    base = ml_collections.FieldReference("", field_type=str)
    c = ml_collections.ConfigDict({"paper": "reasonrag", "table": "table3", "model": "Qwen2.5-7B-Instruct"})
    c.base_model = base
    c.mcts = mcts(base, t2)
    c.dpo = trained(base, "dpo", "mcts/dpo.jsonl")
    c.sft = trained(base, "sft", "mcts/sft.jsonl")
    c.orl_5k = orl(base, t2, "mcts/questions.jsonl")
    c.orl_10k = orl(base, t2, "data/reasonrag_orl_10k_train.jsonl")
    c.stages = ["mcts", "dpo", "sft", "orl_5k", "orl_10k"] + [name for name, _, _ in ROWS]
    for name, path, tuning in ROWS:
        e = c[name] = ml_collections.ConfigDict(t2.eval.to_dict())
        tuning, _, size = tuning.partition("-")
        e.agents = [{"name": "reasonrag", **({"variant": size} if size else {})}]
        e.policy.path = base if path == "base" else path
        e.tuning = tuning
        e.index_recall = name == "eval_base"
    if variant == "smoke":
        smoke(c)
    return c


# ---- smoke -----------------------------------------------------------------------------------------------------
def smoke_actor(section=None, workdir=None):
    """The smoke MCTS's actor: a scripted ReasonRAG policy (a random tiny model never writes a well-formed action,
    so its trees would hold no pair). Sample j of a Reasoning prompt: even j a query, odd j the answer "the
    question's last two words" (F1 > 0 on the smoke questions), and every Grounding prompt an evidence line."""
    import re

    from jaxrag.testing import ScriptedPolicy

    def respond(prompt: str, j: int) -> str:
        if "extract relevant evidence" in prompt:
            return "Based on the query, the relevant evidence is <evidence>a fact</evidence>"
        m = re.search(r"Question: ([^\n]*)", prompt)
        words = (m.group(1) if m else "").replace("?", "").split()
        if j % 2 == 0 and "final answer" not in prompt:
            return f"So the next query is <query>{' '.join(words[:4])}</query>"
        return f"So the answer is <answer>{' '.join(words[-2:])}</answer>"

    return ScriptedPolicy(respond)


class SmokeJudge:
    """The smoke MCTS's judge stand-in (no model): every judged step scores 0.5. Not ReasonRAG's judge."""

    name = "smoke"

    def judge(self, requests):
        from jaxrag.supervision.judge_protocol import JudgeResult

        return [JudgeResult([0.5] * len(r.candidates)) for r in requests]


def smoke_judge(section=None, workdir=None) -> SmokeJudge:
    return SmokeJudge()


def smoke(c) -> None:
    """A tiny random checkpoint; MCTS with the scripted actor and a constant stand-in judge on 2 shared HotpotQA
    questions (whose last two words overlap the gold), 8 simulations a tree; 2 steps each of DPO and SFT on its rows
    (text, tokenized by the tiny checkpoint's tokenizer); 2 outcome-GRPO steps of 1 question x 2 episodes on
    mcts/questions.jsonl for both ORL rows; every eval on 2 HotpotQA questions."""
    from configs.rag_gym import pieces
    from jaxrag.pipelines.rl import tiny_checkpoint_config

    c.stages = ["setup"] + list(c.stages)
    c.setup = tiny_checkpoint_config(paper.SAMPLE_CORPUS)
    c.model = "tiny-random"
    c.base_model = "stage:setup"
    m = c.mcts
    m.policy = {"fn": "configs.reasonrag.table3:smoke_actor"}
    m.judge = {"kind": "fn", "fn": "configs.reasonrag.table3:smoke_judge"}
    m.retriever.update(dict(index_dir="", corpus=paper.SAMPLE_CORPUS, max_passages=300, kind="bm25",
                            backend="bm25s"))
    m.questions = [{"path": str(paper.SAMPLE / paper.SHARED["HotpotQA"]), "select": "range:6:8"}]
    m.agent.opts.max_doc_chars = 60
    m.mcts.update(dict(max_rollouts=8, max_iterations=8, max_depth=5))
    m.env.update(dict(k=2, max_new_tokens=16, summary_max_new_tokens=16, batch_size=8))
    m.trees_per_round = 2
    for name in ("dpo", "sft"):
        pieces.smoke_train(c[name], batch_size=1)   # the smoke trees give a pair or two
    c.orl_10k.questions.path = "mcts/questions.jsonl"
    for name in ("orl_5k", "orl_10k"):
        s = c[name]
        s.policy.max_prompt_tokens = 384
        s.retriever.update(dict(index_dir="", corpus=paper.SAMPLE_CORPUS, max_passages=300, kind="bm25"))
        s.agent.max_doc_chars = 60
        s.rl.update(dict(steps=2, questions_per_step=1, group_size=2, minibatches=1, max_new_tokens=16,
                         summary_max_new_tokens=16, max_steps=2, k=2))
        t = s.train
        t.update(dict(grad_accum=1, compute_dtype="float32", remat=False, seq_buckets=(512,), progress=False))
        t.steps = 2
        t.optimizer.update(dict(lr=1e-3, warmup_steps=0))
        t.checkpoint.update(dict(every_steps=1, async_save=False))
    for name, _, _ in ROWS:
        pieces.smoke_eval(c[name], ("HotpotQA",), "last:2")
