"""RAG-Gym Table 2, PPO rows (001 §2.3 "Proximal policy optimization", App. E.2): the collected process data trains
a reward model r_φ(s, a) (the critic of configs/rag_gym/pieces.py); PPO then maximizes that process reward of newly
generated actions (full-parameter tuning, in the paper with OpenRLHF), then the Table 2 protocol ("<agent>+ppo").

    python -m jaxrag.main --config=configs/rag_gym/ppo.py --workdir=runs/rag_gym_ppo \
        --config.base_model=/models/Llama-3.1-8B-Instruct --config.critic_model=/models/Llama-3.1-8B-Instruct \
        --config.collect.judge.base_url=https://api.openai.com/v1
    python -m jaxrag.main --config=configs/rag_gym/ppo.py:smoke --workdir=/tmp/rg_ppo_smoke   # CI

Stages: collect -> critic_pairs -> critic -> ppo (jaxrag.pipelines.rl:rl_stage, loss ppo, `prm` = the critic: each
executed action's reward is r_φ(s_t, a_t) at its last token, GAE over the trajectory; training questions = the
collection's, the first 1,000 HotpotQA dev) -> eval. The released code has no PPO script and the paper gives no PPO
hyperparameters: the PPO settings below are OpenRLHF's defaults where it has them (clip 0.2, value clip 0.2, γ 1,
λ 0.95, actor lr 5e-7) and jaxrag's elsewhere; one pass over the 1,000 questions at 8 per step. Say so beside any
number this config produces. The design is the config's argument, alone or after the variant: `ppo.py:react`,
`ppo.py:shared,rag` (default Re²Search); `medqa` makes it the row's MedQA column (`ppo.py:medqa`; as
configs/rag_gym/dpo.py says; the PPO questions are collect's).
Process rewards (collect, configs/rag_gym/pieces.py:collect): GPT-4o over HTTP ranks a state's 10 candidates (T 1.0)
at T = 0, reward 1/(1+rank); the reply read as the released lm_rerank.py reads it (judge.options.rank_parse
"strict"; "lenient" the option); pairs each (chosen, rejected) text once per state (ranking.pair_dedup, as dpo.py).
RAG-Gym has no tree value: no value scheme. docs/conformance.md lists what differs from the released code.
"""

from configs.common import paper
from configs.rag_gym import pieces
from jaxrag.pipelines.rl import stage_config


def get_config(variant: str = ""):
    variant, agent, domain = paper.variant_and_agent("configs/rag_gym/ppo.py", variant)
    c, t2, base, _ = pieces.critic_head("table2", ["collect", "critic_pairs", "critic", "ppo", "eval"], agent, variant)
    if domain == "medqa":
        pieces.medqa_collect(c.collect, t2)
    c.ppo = s = stage_config()
    s.policy.path = base
    s.policy.max_prompt_tokens = 4096
    s.retriever.update({k: v for k, v in c.collect.retriever.to_dict().items() if k in s.retriever})
    s.questions.update(dict(path=c.collect.questions.path, select=c.collect.questions.select))
    s.agent.update(dict(name=agent, mode="chat", max_doc_chars=0))
    s.reward = "acc" if domain == "medqa" else "f1"   # logged beside the PRM's rewards, which PPO maximizes
    s.prm = "stage:critic"
    s.rl.update(dict(steps=125, questions_per_step=8, group_size=1, temperature=1.0, max_new_tokens=512,
                     max_steps=10, k=32))
    t = s.train
    t.loss = "ppo"
    t.update(dict(compute_dtype="bfloat16", remat=True, seq_buckets=(1024, 2048, 4096, 4608)))
    t.optimizer.update(dict(lr=5e-7, warmup_steps=0))
    t.ppo.update(dict(clip_eps=0.2, value_clip_eps=0.2, gamma=1.0, lam=0.95))
    c.eval = t2.eval_medqa if domain == "medqa" else t2.eval
    c.eval.agents = [{"name": agent}]
    c.eval.policy.path = "stage:ppo"
    c.eval.summarizer.path = base
    c.eval.tuning = "ppo"
    if variant == "shared":   # collect and PPO on the first 250 shared HotpotQA questions, eval on the last 250
        c.eval.datasets = [dict(d, select="last:250") if d["name"] == "HotpotQA" else d for d in c.eval.datasets]
    elif variant == "smoke":
        smoke(c)
        if domain == "medqa":
            pieces.smoke_medqa(c)
    return c


def smoke(c) -> None:
    """Tiny random actor and critic, 4 collect questions, 2 critic steps, 2 PPO steps of 2 episodes rewarded by the
    critic, then the eval on 2 HotpotQA questions."""
    from jaxrag.pipelines.rl import tiny_checkpoint_config

    c.stages = ["setup", "setup_critic"] + list(c.stages)
    c.setup = tiny_checkpoint_config(paper.SAMPLE_CORPUS)
    c.model = "tiny-random"
    c.base_model = "stage:setup"
    pieces.smoke_collect(c)
    pieces.smoke_critic(c)
    s = c.ppo
    s.policy.max_prompt_tokens = 384
    s.retriever.update(dict(index_dir="", corpus=paper.SAMPLE_CORPUS, max_passages=300, kind="bm25"))
    s.questions.update(dict(path=str(paper.SAMPLE / paper.SHARED["HotpotQA"]), select="first:4"))
    s.agent.max_doc_chars = 60
    s.rl.update(dict(steps=2, questions_per_step=2, group_size=1, max_new_tokens=16, max_steps=2, k=2))
    t = s.train
    t.update(dict(grad_accum=1, compute_dtype="float32", remat=False, seq_buckets=(512,), progress=False))
    t.optimizer.update(dict(lr=1e-3, warmup_steps=0))
    t.checkpoint.update(dict(every_steps=1, async_save=False))
    pieces.smoke_eval(c.eval, ("HotpotQA",), "last:2")
