"""RAG-Gym Table 2, SFT rows (001 §3; released rag_gym/algorithms/prm/sft/sft.py): process-reward collection with a
GPT-4o ranking judge, SFT on the best-ranked action of every state of a kept trajectory, then the Table 2 protocol with
the tuned actor ("<agent>+sft").

    python -m jaxrag.main --config=configs/rag_gym/sft.py --workdir=runs/rag_gym_sft \
        --config.base_model=/models/Llama-3.1-8B-Instruct --config.collect.judge.base_url=https://api.openai.com/v1
    python -m jaxrag.main --config=configs/rag_gym/sft.py:smoke --workdir=/tmp/rg_sft_smoke   # CI: no LLM judge

Stages: collect (as configs/rag_gym/dpo.py) -> sft (LoRA r 256 / α 512 / dropout 0.05 on q, k, v, lr 5e-5, batch 64 =
4 x 16 accumulation, 3 epochs: configs/rag_gym/pieces.py) -> eval (Table 2's open-domain protocol; the Search-o1 /
Re²Search summaries from the untuned base model). The design is the config's argument,
alone or after the variant: `sft.py:react`, `sft.py:shared,cot` (RAG-Gym tunes each of its six; default Re²Search);
`medqa` makes it the row's MedQA column (`sft.py:medqa,cot`; as configs/rag_gym/dpo.py says).
Process rewards (collect, configs/rag_gym/pieces.py:collect): GPT-4o over HTTP ranks a state's 10 candidates (T 1.0)
at T = 0, reward 1/(1+rank); the reply read as the released lm_rerank.py reads it (judge.options.rank_parse
"strict"; "lenient" the option); pairs each (chosen, rejected) text once per state (ranking.pair_dedup, as dpo.py).
RAG-Gym has no tree value: no value scheme. docs/conformance.md lists what differs from the released code.
"""

import ml_collections

from configs.common import paper
from configs.rag_gym import pieces
from configs.rag_gym import table2 as t2_cfg


def get_config(variant: str = ""):
    variant, agent, domain = paper.variant_and_agent("configs/rag_gym/sft.py", variant)
    t2 = t2_cfg.get_config("shared" if variant == "shared" else "")
    base = ml_collections.FieldReference("", field_type=str)
    c = ml_collections.ConfigDict({"paper": "rag_gym", "table": "table2", "model": "Llama-3.1-8B-Instruct"})
    c.base_model = base
    c.stages = ["collect", "sft", "eval"]
    c.collect = pieces.collect(base, t2, agent)
    if domain == "medqa":
        pieces.medqa_collect(c.collect, t2)
    c.sft = pieces.sft(base)
    c.eval = t2.eval_medqa if domain == "medqa" else t2.eval
    c.eval.agents = [{"name": agent}]
    c.eval.policy.path = "stage:sft"
    c.eval.summarizer.path = base
    c.eval.tuning = "sft"
    if variant == "shared":
        c.collect.questions.path = t2.eval.datasets[0]["path"]
        c.collect.questions.select = "first:250"
        c.eval.datasets = [dict(d, select="last:250") if d["name"] == "HotpotQA" else d for d in c.eval.datasets]
    elif variant == "smoke":
        smoke(c)
        if domain == "medqa":
            pieces.smoke_medqa(c)
    return c


def smoke(c) -> None:
    """Tiny random checkpoint, 4 collect questions, SFT for one epoch over collect's rows in batches of 2 (the epochs
    field at work), then the eval on 2 HotpotQA questions."""
    from jaxrag.pipelines.rl import tiny_checkpoint_config

    c.stages = ["setup"] + list(c.stages)
    c.setup = tiny_checkpoint_config(paper.SAMPLE_CORPUS)
    c.model = "tiny-random"
    c.base_model = "stage:setup"
    pieces.smoke_collect(c)
    pieces.smoke_train(c.sft)
    c.sft.epochs = 1
    pieces.smoke_eval(c.eval, ("HotpotQA",), "last:2")
