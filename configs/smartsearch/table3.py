"""SmartSearch Table 3 (004 §5.3): the ablation of process rewards and query refinement in each stage of the
curriculum (SFT -> DPO -> GRPO), every row evaluated with Table 1's protocol (configs/smartsearch/table1.py: 2Wiki,
HotpotQA, Bamboogle, MuSiQue; E5 top 5 over wiki-18; the SmartSearch agent at T = 0; EM / F1 of the released
evaluation's answer: the last <answer>'s \\boxed{}, an unboxed answer is none; agent opts eval_answer "boxed").

    python -m jaxrag.main --config=configs/smartsearch/table3.py --workdir=runs/smartsearch_t3 \
        --config.base_model=/models/Qwen2.5-3B-Instruct \
        --config.judge.base_url=http://localhost:8001/v1 --config.judge.model=smartsearch-prm-3b
    python -m jaxrag.main --config=configs/smartsearch/table3.py:smoke --workdir=/tmp/ss_t3_smoke   # CI

Rows (jaxrag.pipelines.published.METHODS) and the stages behind them:
  Stage 1 / SmartSearch              s1_data -> s1_sft -> eval_s1                       "smartsearch+sft"
  Stage 1 / w/o process rewards      s1_data -> s1_sft_npr -> eval_s1_npr               "smartsearch+sft-no_process_reward"
  Stage 2 / SmartSearch              s1_sft -> s2_data -> s2_dpo -> eval_s2             "smartsearch+sft+dpo"
  Stage 2 / w/o process rewards      s2_data -> s2_dpo_npr -> eval_s2_npr               "...+sft+dpo-no_process_reward"
  Stage 2 / w/o query refinement     s1_sft -> s2_data_nor -> s2_dpo_nor -> eval_s2_nor  "...+sft+dpo-no_refinement"
  Stage 3 / SmartSearch              s2_dpo -> s3 (GRPO, refinement rollout, composite reward) -> eval_s3
                                                                                        "smartsearch+sft+dpo+grpo"
  Stage 3 / w/o process rewards      s2_dpo -> s3_npr (GRPO, refinement rollout, outcome reward) -> eval_s3_npr
                                                                                        "...+sft+dpo+grpo-no_process_reward"
  Stage 3 / w/o query refinement     s2_dpo -> s3_nor (GRPO, composite reward) -> eval_s3_nor
                                                                                        "...+sft+dpo+grpo-no_refinement"
  Stage 3 / Standard GRPO            s2_dpo -> s3_std (GRPO, outcome reward) -> eval_s3_std
                                                                                        "...+sft+dpo+grpo-standard"
The refinement rollout (s3, s3_npr; 004 §4.4, rl.group_rollout "smartsearch_refine", jaxrag.rl.group_rollout): per
question an initial trajectory y0, its queries credited by the judge (usefulness) and novelty, its S_t = 0 queries
rewritten by the judge and the trajectory regenerated from the first usable one, at most M = 2 episodes per such set
(the released rollout keeps y0 and its first refined trajectory), repeated until G = 8; the refined query's tokens
are trained under the policy's own recomputed log-probs, as verl does. s3's composite reward reads the judge's credit
of every episode of its groups; s3_nor's independent groups are credited by the same judge (every query of every
episode, one batched call per step: jaxrag.rl.group_rollout.independent), as the released reward asks its
process-reward model about every trajectory. Every composite reward scores the trajectory's last \\boxed{} answer
(the released re_call.py; docs/conformance.md).
Stage-3 rewards, judge, temperatures: s3 and s3_nor "smartsearch" (the released reward: the last \\boxed{} answer,
the judge's credit), s3_npr and s3_std "smartsearch_outcome"; the judge is the `judge` section (s3, s3_npr, s3_nor;
none for s3_std, whose reward reads no credit; the smoke's: a rule-based stand-in, SmokeJudge); sampling and
log-prob temperature 1.0 (grpo.py). The outcome reward of s3_npr and s3_std is 004 Eq. 5, r_outcome + λ·r_format ("smartsearch_outcome": correct iff
F1 >= 0.8, λ = 0.1, as the composite reward's parts).

Stages and settings (the released code, github RUC-NLPIR/SmartSearch, README "Training"):
  s1_data / s2_data    jaxrag.pipelines.collect_smartsearch:smartsearch_stage: trajectories on the training questions (ASearcher-
                       Base-35k, `questions.path`: a QA JSONL to prepare) sampled as run_eval.py does (greedy,
                       eval_config.yaml: do_sample False), dual-level credit by the judge (the process-reward model:
                       the paper's Qwen2.5-3B student of Qwen3-32B, an OpenAI-compatible endpoint, `judge`; novelty:
                       more than 1 repeated document is redundant), s2_data with refinement of every S_t = 0 query
                       and regeneration; s2_data from the stage-1 model (README), s1_data from the base model (the
                       README's stage-1 sampler is an unnamed "policy model": set `s1_data.policy.path` if it is
                       another).
  s2_data_nor          "directly generating full trajectories without query refinement" (004 §5.3): 4 trajectories
                       per question at T = 1.0 (the paper gives neither number), preference by the same rule.
  s1_sft*              qwen_full_sft.yaml: full fine-tuning, lr 7e-6 cosine, 3 epochs, sequences up to 16,384 tokens,
                       per device 2 x 8 accumulation; the README's 4 devices (its stage-3 command) assumed: batch 64.
  s2_dpo*              qwen_lora_dpo.yaml: LoRA rank 8 on every projection ("all"; α 16 = LLaMA-Factory's default
                       2 x rank, dropout 0), sigmoid DPO β 0.1, lr 7e-6 cosine, 3 epochs, up to 10,000 tokens, per
                       device 1 x 8 accumulation x 4 devices: batch 32; from the stage-1 model (the reference: it with
                       adapters off).
  s3*                  configs/smartsearch/grpo.py (train.sh) from the stage-2 model on `data/smartsearch_grpo_train.jsonl`
                       (the paper: questions still unsolved after several samples), Table 1's retriever; s3 and
                       s3_npr with the refinement rollout (refine_keep_m 2) and the data stages' `judge` (the
                       process-reward model judges and refines, as the released rollout asks one endpoint for both).
  Both LLaMA-Factory yamls' warmup ratio 0.1 is left out (warmup is a step count; an epoch's count follows the data).
"""

import ml_collections

from configs.common import paper
from configs.common.train import train_stage
from configs.smartsearch import grpo as grpo_cfg
from configs.smartsearch import table1 as t1_cfg

# eval stage -> (the model's stage, tuning, variant)
ROWS = {
    "eval_s1": ("s1_sft", "sft", ""),
    "eval_s1_npr": ("s1_sft_npr", "sft", "no_process_reward"),
    "eval_s2": ("s2_dpo", "sft+dpo", ""),
    "eval_s2_npr": ("s2_dpo_npr", "sft+dpo", "no_process_reward"),
    "eval_s2_nor": ("s2_dpo_nor", "sft+dpo", "no_refinement"),
    "eval_s3": ("s3", "sft+dpo+grpo", ""),
    "eval_s3_npr": ("s3_npr", "sft+dpo+grpo", "no_process_reward"),
    "eval_s3_nor": ("s3_nor", "sft+dpo+grpo", "no_refinement"),
    "eval_s3_std": ("s3_std", "sft+dpo+grpo", "standard"),
}


def data_stage(policy, t1, judge, *, refine: bool, samples: int = 1, temperature: float = 0.0):
    return ml_collections.ConfigDict({
        "fn": "jaxrag.pipelines.collect_smartsearch:smartsearch_stage",
        "policy": {"path": policy, "max_prompt_tokens": 16384 - 1024},
        "retriever": t1.eval.retriever.to_dict(),
        "questions": {"path": "data/asearcher_base_35k.jsonl", "select": "all"},
        "agent": {"name": "smartsearch", "opts": {"max_doc_chars": None}},
        "judge": judge,
        "rollout": {"k": 5, "max_steps": 6, "batch_size": 64, "temperature": temperature, "max_new_tokens": 1024,
                    "seed": 0},
        "samples": samples,
        "refine": refine,
        "smartsearch": {"overlap_threshold": 1, "correct_f1": 0.8, "gamma": 0.1, "phi_min": 0.7, "phi_max": 0.3,
                        "format_weight": 0.1, "explanations": "paper", "pairs": "paper", "require_judged": True},
    })


def sft(init, base, data: str) -> ml_collections.ConfigDict:
    s = train_stage("jaxrag.pipelines.train:train_stage", data, loss="sft", batch_size=64, grad_accum=16,
                    seq_buckets=(2048, 4096, 8192, 16384), compute_dtype="bfloat16", remat=True)
    s.init, s.tokenizer, s.epochs = init, base, 3
    s.train.optimizer.update(dict(lr=7e-6, warmup_steps=0))
    return s


def dpo(init, base, data: str) -> ml_collections.ConfigDict:
    s = train_stage("jaxrag.pipelines.train:train_stage", data, loss="dpo", batch_size=32, grad_accum=32,
                    seq_buckets=(2048, 4096, 8192, 10240), compute_dtype="bfloat16", remat=True)
    s.init, s.tokenizer, s.epochs = init, base, 3
    s.train.dpo.update(dict(beta=0.1, loss_type="sigmoid"))
    s.train.lora.update(dict(enabled=True, rank=8, alpha=16.0, dropout=0.0,
                             targets=("q", "k", "v", "o", "gate", "up", "down")))
    s.train.optimizer.update(dict(lr=7e-6, warmup_steps=0))
    return s


def grpo(t1, reward: str, judge=None, refine: bool = False) -> ml_collections.ConfigDict:
    """A stage-3 row. `judge` (the process-reward model's section) credits every query of every episode (the
    composite reward's S_t); None = no judge (the outcome-reward rows, which read no credit). refine: the groups come
    from the refinement rollout (004 §4.4; released: y0 + its first refined trajectory per set, M = 2)."""
    s = grpo_cfg.get_config("").rl
    s.policy.path = "stage:s2_dpo"
    s.retriever.update({k: v for k, v in t1.eval.retriever.to_dict().items() if k in s.retriever})
    s.reward = reward
    del s["judge"]
    if judge is not None:
        s.judge = judge
    if refine:
        s.rl.update(dict(group_rollout="smartsearch_refine", refine_keep_m=2, refine_query_loss=True))
    return s


def get_config(variant: str = ""):
    paper.check_variant("configs/smartsearch/table3.py", variant)
    t1 = t1_cfg.get_config("shared" if variant == "shared" else "")
    base = ml_collections.FieldReference("", field_type=str)
    c = ml_collections.ConfigDict({"paper": "smartsearch", "table": "table3", "model": "Qwen2.5-3B-Instruct"})
    c.base_model = base
    c.judge = {"kind": "http", "base_url": "", "model": "", "api_key_env": "", "max_retries": 2, "timeout_s": 120.0,
               "max_workers": 16}
    judge = c.get_ref("judge")
    c.s1_data = data_stage(base, t1, judge, refine=False)
    c.s1_sft = sft(base, base, "s1_data/sft.jsonl")
    c.s1_sft_npr = sft(base, base, "s1_data/sft_outcome.jsonl")
    c.s2_data = data_stage("stage:s1_sft", t1, judge, refine=True)
    c.s2_data_nor = data_stage("stage:s1_sft", t1, judge, refine=False, samples=4, temperature=1.0)
    c.s2_dpo = dpo("stage:s1_sft", base, "s2_data/dpo.jsonl")
    c.s2_dpo_npr = dpo("stage:s1_sft", base, "s2_data/dpo_outcome.jsonl")
    c.s2_dpo_nor = dpo("stage:s1_sft", base, "s2_data_nor/dpo.jsonl")
    c.s3 = grpo(t1, "smartsearch", judge, refine=True)
    c.s3_npr = grpo(t1, "smartsearch_outcome", judge, refine=True)
    c.s3_nor = grpo(t1, "smartsearch", judge)
    c.s3_std = grpo(t1, "smartsearch_outcome")
    train = ["s1_data", "s1_sft", "s1_sft_npr", "s2_data", "s2_data_nor", "s2_dpo", "s2_dpo_npr", "s2_dpo_nor",
             "s3", "s3_npr", "s3_nor", "s3_std"]
    c.stages = train + list(ROWS)
    for name, (model, tuning, v) in ROWS.items():
        e = c[name] = ml_collections.ConfigDict(t1.eval.to_dict())
        e.agents = [{"name": "smartsearch", "opts": {"eval_answer": "boxed"}, **({"variant": v} if v else {})}]
        e.policy.path = f"stage:{model}"
        e.tuning = tuning
        e.index_recall = name == "eval_s1"
    if variant == "smoke":
        smoke(c)
    return c


# ---- smoke -----------------------------------------------------------------------------------------------------
def smoke_actor(section=None, workdir=None):
    """The smoke data stages' actor: a scripted SmartSearch policy (a random tiny model never writes a well-formed
    search). Its first action searches the question's first words (3 on every other call, 5 on the others); once a
    result is in, it answers, boxed, with the question's last two words if one of its queries had more than 3 words
    (one the stand-in judge calls useful; F1 > 0 on the smoke questions) and with its first two words otherwise."""
    import itertools
    import re

    from jaxrag.env.agents.smartsearch import SYSTEM
    from jaxrag.testing import ScriptedPolicy

    calls = itertools.count()

    def respond(prompt: str, j: int) -> str:
        q = re.search(r"Question: ([^\n]*)", prompt)
        words = (q.group(1) if q else "").replace("?", "").split()
        queries = re.findall(r"<search>(.*?)</search>", prompt)[SYSTEM.count("<search>"):]
        if not queries:
            return f"<think> I need a fact. </think> <search> {' '.join(words[:3 + 2 * (next(calls) % 2)])} </search>"
        answer = words[-2:] if any(len(x.split()) > 3 for x in queries) else words[:2]
        return f"<think> Done. </think> <answer> The final answer is \\boxed{{{' '.join(answer)}}} </answer>"

    return ScriptedPolicy(respond)


class SmokeJudge:
    """The smoke's stand-in process-reward model (no model): a query is useful iff it has more than 3 words; a
    refinement appends "biography" to the query. Not a paper's judge: it lets the curriculum run end to end in CI."""

    name = "smoke"

    def judge(self, requests):
        from jaxrag.supervision.judge_protocol import JudgeResult

        out = []
        for r in requests:
            q = r.candidates[0].text
            if r.kind == "refine":
                out.append(JudgeResult([1.0], texts=[f"{q} biography"], rationale="stand-in"))
            else:
                out.append(JudgeResult([float(len(q.split()) > 3)], rationale="stand-in usefulness"))
        return out


def smoke_judge(section=None, workdir=None) -> SmokeJudge:
    return SmokeJudge()


def smoke(c) -> None:
    """A tiny random checkpoint for every trained stage; the data stages' trajectories from the scripted actor on 4
    shared HotpotQA questions, credited and refined by the stand-in judge; 2 steps per train stage (text rows in the
    tiny checkpoint's tokens, up to 1,024 of them); 2 GRPO steps of 1 question x 2 episodes per stage-3 row (s3 and
    s3_npr: the refinement rollout with the stand-in judge); evals on 2 questions."""
    from configs.rag_gym import pieces
    from jaxrag.pipelines.rl import tiny_checkpoint_config

    c.stages = ["setup"] + list(c.stages)
    c.setup = tiny_checkpoint_config(paper.SAMPLE_CORPUS)
    c.model = "tiny-random"
    c.base_model = "stage:setup"
    c.judge.kind = "fn"                              # every data stage's judge is this one section
    c.judge.fn = "configs.smartsearch.table3:smoke_judge"
    for name in ("s1_data", "s2_data", "s2_data_nor"):
        s = c[name]
        s.policy = {"fn": "configs.smartsearch.table3:smoke_actor"}
        s.retriever.update(dict(index_dir="", corpus=paper.SAMPLE_CORPUS, max_passages=300, kind="bm25",
                                backend="bm25s"))
        s.questions.update(dict(path=str(paper.SAMPLE / paper.SHARED["HotpotQA"]), select="range:6:10"))
        s.agent.opts.max_doc_chars = 60
        s.rollout.update(dict(k=2, max_steps=3, batch_size=8, max_new_tokens=32))
    c.s1_data.samples = c.s2_data_nor.samples = 2   # two trajectories a question: a 3-word and a 5-word query
    c.setup.arch.max_seq_len = 1024   # a whole trajectory after the system prompt: ~700 tokens of the tiny BPE
    for name in ("s1_sft", "s1_sft_npr", "s2_dpo", "s2_dpo_npr", "s2_dpo_nor"):
        pieces.smoke_train(c[name], batch_size=1)
        c[name].train.seq_buckets = (1024,)
    for name in ("s3", "s3_npr", "s3_nor", "s3_std"):
        s = c[name]
        s.policy.max_prompt_tokens = 384
        s.questions.update(dict(path=str(paper.SAMPLE / paper.SHARED["HotpotQA"]), select="first:2"))
        s.retriever.update(dict(index_dir="", corpus=paper.SAMPLE_CORPUS, max_passages=300, kind="bm25"))
        s.agent.max_doc_chars = 60
        s.rl.update(dict(steps=2, questions_per_step=1, group_size=2, minibatches=1, max_new_tokens=16,
                         max_steps=2, k=2))
        t = s.train
        t.update(dict(grad_accum=1, compute_dtype="float32", remat=False, seq_buckets=(512,), progress=False))
        t.optimizer.update(dict(lr=1e-3, min_lr_ratio=0.0))
        t.checkpoint.update(dict(every_steps=1, async_save=False))
    for name in ROWS:
        pieces.smoke_eval(c[name], ("HotpotQA",), "last:2")
