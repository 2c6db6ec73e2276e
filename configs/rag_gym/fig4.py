"""RAG-Gym Figure 4 (001 §4.3, inference-time scaling): Re²Search with the trained critic choosing among N actions
sampled per step (T = 1.0), for several N, on HotpotQA, 2WikiMultihopQA and Bamboogle.

    python -m jaxrag.main --config=configs/rag_gym/fig4.py --workdir=runs/rag_gym_fig4 \
        --config.base_model=/models/Llama-3.1-8B-Instruct --config.critic_model=/models/Llama-3.1-8B-Instruct \
        --config.collect.judge.base_url=https://api.openai.com/v1
    python -m jaxrag.main --config=configs/rag_gym/fig4.py:smoke --workdir=/tmp/rg_fig4_smoke   # CI

Stages: collect (GPT-4o ranking, the first 1,000 HotpotQA dev questions) -> critic_pairs -> critic (the PRM of
configs/rag_gym/pieces.py) -> eval: the zero-shot Re²Search actor (the base model) with the critic at each N in `NS`,
one row per N named "re2search+critic-n<N>" (N = 1: one sample at T = 1.0, nothing to choose). The paper's text does
not print the N values on the figure's axis: NS is a guess spanning the paper's N = 10 (set it to the figure's axis
when known). MedQA (in the figure) is the argument `medqa` (`fig4.py:medqa`): the collection and critic on RAG-Gym's
1,000 MedQA training questions over the medical corpus (configs/rag_gym/pieces.py:medqa_collect), the curve on MedQA
test.
Process rewards (collect, configs/rag_gym/pieces.py:collect): GPT-4o over HTTP ranks a state's 10 candidates (T 1.0)
at T = 0, reward 1/(1+rank); the reply read as the released lm_rerank.py reads it (judge.options.rank_parse
"strict"; "lenient" the option); pairs each (chosen, rejected) text once per state (ranking.pair_dedup, as dpo.py).
RAG-Gym has no tree value: no value scheme. docs/conformance.md lists what differs from the released code.
"""

from configs.common import paper
from configs.rag_gym import pieces

NS = (1, 2, 4, 8, 10)
DATASETS = ("HotpotQA", "2Wiki", "Bamboogle", "MedQA")   # MedQA: in the medqa variant's own eval


def get_config(variant: str = ""):
    variant, domain = paper.variant_and_domain("configs/rag_gym/fig4.py", variant)
    agent = "re2search"
    c, t2, base, _ = pieces.critic_head("fig4", ["collect", "critic_pairs", "critic", "eval"], agent, variant)
    if domain == "medqa":
        pieces.medqa_collect(c.collect, t2)
    c.eval = t2.eval_medqa if domain == "medqa" else t2.eval
    c.eval.datasets = [d for d in c.eval.datasets if d["name"] in DATASETS]
    c.eval.agents = [pieces.critic_entry(agent, n=n, variant=f"n{n}") for n in NS]
    c.eval.policy.path = base
    if variant == "shared":   # collect on the first 250 shared HotpotQA questions (pieces.critic_head), eval the last
        c.eval.datasets = [dict(d, select="last:250") if d["name"] == "HotpotQA" else d for d in c.eval.datasets]
    elif variant == "smoke":
        smoke(c)
        if domain == "medqa":
            pieces.smoke_medqa(c)
    return c


def smoke(c) -> None:
    """Tiny random actor and critic, 4 collect questions, 2 critic steps, N in (1, 2) on 2 HotpotQA questions."""
    from jaxrag.pipelines.rl import tiny_checkpoint_config

    c.stages = ["setup", "setup_critic"] + list(c.stages)
    c.setup = tiny_checkpoint_config(paper.SAMPLE_CORPUS)
    c.model = "tiny-random"
    c.base_model = "stage:setup"
    pieces.smoke_collect(c)
    pieces.smoke_critic(c)
    pieces.smoke_eval(c.eval, ("HotpotQA",), "last:2")
    c.eval.agents = [pieces.critic_entry("re2search", n=n, variant=f"n{n}") for n in (1, 2)]
