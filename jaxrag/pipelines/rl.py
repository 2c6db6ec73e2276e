"""Stage `rl`: online GRPO / PPO (jaxrag.rl.train_rl) from a checkpoint, with a live retriever and a named reward.

`rl_stage(config, workdir, name)` reads the stage's section (policy, retriever, questions, agent, reward,
answer_judge, prm, rl, judge, train; examples: configs/arena/grpo.py, configs/smartsearch/grpo.py), trains, and
writes checkpoints/, metrics.jsonl, episodes.jsonl, model/ and summary.json under workdir/<name>/.
`tiny_checkpoint_stage` makes the smoke variants' policy (a random Llama with a small byte-level BPE tokenizer).

Details (every config key, the outputs, the synthetic world's section): docs/running.md, "The RL stage".
"""

from __future__ import annotations

from pathlib import Path

import jax
import ml_collections

from jaxrag.data.qa import load_qa
from jaxrag.env.agents import arena, get_agent, smartsearch
from jaxrag.judge import judge_from_config
from jaxrag.models import ModelConfig, init_params, save_hf
from jaxrag.models.hf import stored_dtype
from jaxrag.pipelines import common
from jaxrag.pipelines.collect import check_judge, make_judge
from jaxrag.pipelines.eval import load_prm
from jaxrag.retrieval import load_corpus
from jaxrag.rl import train_rl
from jaxrag.rl.config import RLConfig, default_rl_config, rl_layout, rl_train_config
from jaxrag.supervision.rewards import reward_fn
from jaxrag.train.config import default_train_config
from jaxrag.train.distributed import barrier, is_lead

STAGE_FN = "rl_stage"


def stage_name(config, fn_name: str, name: str | None) -> str:
    """The stage's own name: given by jaxrag.main, else the one stage whose fn ends with :fn_name."""
    if name is not None:
        return name
    names = [s for s in config.stages if str(config[s].get("fn", "")).endswith(":" + fn_name)]
    if len(names) != 1:
        raise ValueError(f"cannot tell which stage runs {fn_name}: {names}; pass the stage name")
    return names[0]


def stage_config() -> "ml_collections.ConfigDict":
    """The stage section with every key typed (a config file sets what differs; unknown keys fail)."""
    train = default_train_config()
    train.loss = "grpo"
    return ml_collections.ConfigDict({
        "fn": f"jaxrag.pipelines.rl:{STAGE_FN}",
        "policy": {"path": "", "tokenizer": "", "dtype": "", "max_prompt_tokens": 0, "add_bos": True},
        "retriever": {"corpus": "", "max_passages": 0, "backend": "bm25s", "index_dir": "", "kind": "bm25",
                      "encoder": "", "query_encoder": "", "rrf_k": 0, "depth": 0},
        "questions": {"path": "", "select": "all", "limit": 0},
        "agent": {"name": "react", "mode": "chat", "max_docs": 0, "max_doc_chars": 1000, "opts": {}},
        "reward": "em",
        "answer_judge": {"base_url": "", "model": "gpt-4o-2024-11-20", "api_key_env": "OPENAI_API_KEY",
                         "timeout_s": 30.0, "retries": 3, "backoff_s": 0.5, "workers": 8},
        "prm": "",  # a critic checkpoint (dir or stage:<s>): PPO's per-step rewards r_φ(s_t, a_t) (RAG-Gym §2.3)
        "rl": default_rl_config(),
        "train": train,
    })


def tiny_checkpoint_config(corpus: str) -> "ml_collections.ConfigDict":
    """The smoke variants' setup stage: a random 2-layer Llama (d 64) with a 1k byte-level BPE."""
    arch = {"model_type": "llama", "d_model": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "head_dim": 16,
            "d_ff": 128, "max_seq_len": 512, "vocab_size": 0}
    return ml_collections.ConfigDict({"fn": "jaxrag.pipelines.rl:tiny_checkpoint_stage", "arch": arch,
                                      "corpus": corpus, "corpus_lines": 300, "vocab_size": 1024, "seed": 0})


def _fail(name: str, key: str, msg: str):
    common.config_fail(f"{name}.{key}", msg)


def check_config(config, name: str) -> None:
    """Static checks run by jaxrag.main before any stage starts; errors name the key."""
    resolve_section(config, name)


def resolve_section(config, name: str):
    """The stage's section checked and resolved, in one place for jaxrag.main's check and for the stage itself:
    returns (RLConfig, the reward spec as configured, the reward function with its answer judge)."""
    sc = config[name]
    for key in ("policy", "retriever", "questions", "agent", "reward", "rl", "train"):
        if key not in sc:
            _fail(name, key, "missing")
    if not sc.policy.get("path"):
        _fail(name, "policy.path", "needs a checkpoint dir (HF or jaxrag params) or 'stage:<name>'")
    if not (sc.retriever.get("corpus") or sc.retriever.get("index_dir")):
        _fail(name, "retriever", "needs 'corpus' (JSONL) or 'index_dir'")
    if not sc.questions.get("path"):
        _fail(name, "questions.path", "needs a QA JSONL file")
    opts = common.plain(sc.agent.get("opts", None) or {})
    try:
        get_agent(str(sc.agent.get("name", "")), **opts, mode=sc.agent.get("mode", "chat"))
    except TypeError as e:   # an option of another design (e.g. ARENA's stop_at after a change of agent.name)
        _fail(name, "agent.opts", f"{sorted(opts)}: not all fields of agent {sc.agent.get('name')!r} ({e}); "
                                  f"clear them with agent.opts = {{}}")
    except (KeyError, ValueError) as e:
        _fail(name, "agent", str(e).strip("'\""))
    try:
        rc = RLConfig.from_dict(sc.rl.to_dict())
    except (KeyError, ValueError, TypeError) as e:
        _fail(name, "rl", str(e).strip("'\""))
    try:
        rl_train_config(rc, sc.train)
    except (KeyError, ValueError, TypeError) as e:
        _fail(name, "train", str(e).strip("'\""))
    try:
        judge = answer_judge(sc)
    except ValueError as e:
        _fail(name, "answer_judge", str(e))
    reward = sc.reward.to_dict() if hasattr(sc.reward, "to_dict") else sc.reward
    try:
        reward_f = reward_fn(reward, answer_judge=judge)
    except (KeyError, ValueError) as e:
        _fail(name, "reward", str(e))
    if sc.get("prm") and rl_layout(sc.train) != "ppo":   # rl_train_config above checked the loss resolves
        _fail(name, "prm", f"per-step PRM rewards need a loss of PPO's layout, train.loss 'ppo' (got "
                           f"{sc.train.loss!r})")
    if rc.group_rollout == "smartsearch_refine" and not sc.get("judge"):
        _fail(name, "judge", "rl.group_rollout 'smartsearch_refine' needs a judge section (the query refiner and "
                             "usefulness judge: kind http | local | fn)")
    if sc.get("judge"):
        check_judge(name, common.plain(sc.judge), "the process-reward model's endpoint")
    return rc, reward, reward_f


def answer_judge(sc):
    """The stage's answer judge (jaxrag.judge.OpenAIJudge), None without an answer_judge.base_url."""
    return judge_from_config(common.plain(sc.answer_judge)) if sc.get("answer_judge") else None


def rl_stage(config, workdir: str, name: str | None = None) -> None:
    name = stage_name(config, STAGE_FN, name)
    rc, reward, reward_f = resolve_section(config, name)
    sc = config[name]
    out = common.stage_dir(workdir, name)
    policy = common.load_policy(sc.policy, workdir)
    retriever = common.load_retriever(sc.retriever, workdir)
    agent = common.load_agent(sc.agent, policy.tokenizer)
    questions = load_qa(common.resolve(sc.questions.path, workdir), sc.questions.get("select") or None,
                        limit=sc.questions.get("limit") or None)
    common.log(name, f"{sc.train.loss} over {len(questions)} questions, agent {sc.agent.name}, reward {reward}")
    judge = None
    if sc.get("judge"):   # the refinement rollout's refiner and judge, or the usefulness judge of independent groups

        judge = make_judge(common.plain(sc.judge), workdir, policy)
    step_rewards = None
    if sc.get("prm"):
        step_rewards = load_prm(sc.prm, f"config.{name}.prm", workdir, sc.agent)
    result = train_rl(policy, retriever, agent, questions, reward_f, rc, sc.train, out, step_rewards=step_rewards,
                      judge=judge, refiner=judge)

    # every process (sharded params are gathered; process 0 writes), in the dtype the policy checkpoint is stored in
    common.save_checkpoint(common.model_dir(workdir, name), policy.cfg, result.params, policy.tokenizer_path,
                           head=result.head, dtype=stored_dtype(common.resolve(sc.policy.path, workdir)))
    if not is_lead():
        return
    history = result.history
    summary = {"stage": name, "rl_steps": result.step, "optimizer_steps": result.step * rc.updates_per_step,
               "loss": sc.train.loss, "agent": sc.agent.name, "reward": reward, "questions": len(questions),
               "reward_first": history[0]["reward/mean"] if history else None,
               "reward_last": history[-1]["reward/mean"] if history else None, "metrics": result.metrics}
    common.write_json(out / "summary.json", summary)


rl_stage.check_config = check_config


# ---- the smoke variants' tiny checkpoint ------------------------------------------------------------------------
def train_byte_bpe(texts: list[str], vocab_size: int, out_dir: Path):
    """A byte-level BPE (every string encodable) trained on `texts`, saved as a transformers tokenizer dir with
    <s> (bos, id 1), </s> (eos, id 2), <pad> (id 0)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<pad>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    fast.save_pretrained(str(out_dir))
    return fast


def tiny_checkpoint_stage(config, workdir: str, name: str | None = None) -> None:
    """config.<name>: arch (ModelConfig fields), corpus (JSONL), corpus_lines, vocab_size, seed."""
    name = stage_name(config, "tiny_checkpoint_stage", name)
    sc = config[name]
    out = common.model_dir(workdir, name)
    if is_lead():  # one writer; the others wait for the finished checkpoint
        _tiny_checkpoint(sc, workdir, out)
    barrier(f"tiny_checkpoint:{out}")


def _tiny_checkpoint(sc, workdir: str, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    texts = [p.title + "\n" + p.text for p in load_corpus(common.resolve(sc.corpus, workdir), sc.corpus_lines)]
    texts += [arena.SYSTEM, smartsearch.SYSTEM]
    tok = train_byte_bpe(texts, sc.vocab_size, out)
    arch = dict(sc.arch.to_dict())
    # the tokenizer's size and special ids win over arch's
    cfg = ModelConfig(**{**arch, "vocab_size": len(tok), "bos_id": tok.bos_token_id, "eos_ids": (tok.eos_token_id,),
                         "pad_id": tok.pad_token_id})
    save_hf(cfg, init_params(cfg, jax.random.PRNGKey(sc.seed)), out)
