"""RAG-Gym Table 3 (001 §3.4): Re²Search++ = Re²Search with the DPO-tuned actor and the trained critic's best-of-N,
beside the zero-shot ReAct and Search-o1 rows, on HotpotQA, 2WikiMultihopQA and Bamboogle (no MedQA): EM, CEM, F1
(metrics.jsonl's em / cem / f1; table.md prints EM / F1).

    python -m jaxrag.main --config=configs/rag_gym/table3.py --workdir=runs/rag_gym_t3 \
        --config.base_model=/models/Llama-3.1-8B-Instruct --config.critic_model=/models/Llama-3.1-8B-Instruct \
        --config.collect.judge.base_url=https://api.openai.com/v1
    python -m jaxrag.main --config=configs/rag_gym/table3.py:smoke --workdir=/tmp/rg_t3_smoke   # CI

Stages: collect (GPT-4o ranking on the first 1,000 HotpotQA dev questions) -> dpo (configs/rag_gym/dpo.py's
settings, one epoch) -> critic_pairs -> critic (the PRM: configs/rag_gym/pieces.py) -> eval_zs (ReAct, Search-o1 with
the base model at T = 0: Table 2's protocol) -> eval (Re²Search, the DPO actor, 10 candidates at T = 1.0 per step,
the critic's argmax: "re2search+dpo+critic"; summaries from the untuned base model). The Qwen-2.5-7B block is the
same config with both `base_model` and `model` set to Qwen2.5-7B-Instruct (the critic stays Llama-3.1-8B: the paper
reuses its critic across actors, §3.3).
Process rewards (collect, configs/rag_gym/pieces.py:collect): GPT-4o over HTTP ranks a state's 10 candidates (T 1.0)
at T = 0, reward 1/(1+rank); the reply read as the released lm_rerank.py reads it (judge.options.rank_parse
"strict"; "lenient" the option); pairs each (chosen, rejected) text once per state (ranking.pair_dedup, as dpo.py).
RAG-Gym has no tree value: no value scheme. docs/conformance.md lists what differs from the released code.
"""

import ml_collections

from configs.common import paper
from configs.rag_gym import dpo as dpo_cfg
from configs.rag_gym import pieces

DATASETS = ("HotpotQA", "2Wiki", "Bamboogle")


def get_config(variant: str = ""):
    paper.check_variant("configs/rag_gym/table3.py", variant)
    d = dpo_cfg.get_config("shared" if variant == "shared" else "")
    c, _, base, _ = pieces.critic_head("table3", ["collect", "dpo", "critic_pairs", "critic", "eval_zs", "eval"],
                                       variant=variant)
    c.dpo = d.dpo
    c.dpo.init, c.dpo.tokenizer = base, base
    c.dpo.epochs = 1                       # dpo.py CLI: n_epochs 1 (steps = ceil(pairs / 32))
    keep = [x for x in d.eval.datasets if x["name"] in DATASETS]
    c.eval_zs = ml_collections.ConfigDict(d.eval.to_dict())
    c.eval_zs.update(dict(agents=[{"name": "react"}, {"name": "search_o1"}], datasets=keep, tuning=""))
    c.eval_zs.policy.path = base
    c.eval_zs.summarizer.path = ""
    c.eval = d.eval
    c.eval.datasets = keep
    c.eval.agents = [pieces.critic_entry("re2search")]
    c.eval.policy.path = "stage:dpo"
    c.eval.summarizer.path = base
    c.eval.tuning = "dpo"
    if variant == "smoke":
        smoke(c)
    return c


def smoke(c) -> None:
    """Tiny random checkpoints as actor and critic (setup, setup_critic), 4 collect questions, 2 steps each of DPO
    and critic, then both evals on 2 questions per dataset with 2 candidates per step."""
    from jaxrag.pipelines.rl import tiny_checkpoint_config

    c.stages = ["setup", "setup_critic"] + list(c.stages)
    c.setup = tiny_checkpoint_config(paper.SAMPLE_CORPUS)
    c.model = "tiny-random"
    c.base_model = "stage:setup"
    pieces.smoke_collect(c)
    pieces.smoke_train(c.dpo)
    pieces.smoke_critic(c)
    for e in (c.eval_zs, c.eval):
        pieces.smoke_eval(e, DATASETS, "last:2")
    c.eval.agents[0]["n"] = 2
