"""ARENA Table 2 (003 §4; METHODS.md §7): the ARENA generator over each question's own paragraphs.

    python -m jaxrag.main --config=configs/arena/table2.py --workdir=runs/arena_t2 \
        --config.eval.policy.path=/models/ARENA-7B --config.eval.judge.base_url=https://api.openai.com/v1
    python -m jaxrag.main --config=configs/arena/table2.py:shared --workdir=runs/arena_t2_shared  # runs now
    python -m jaxrag.main --config=configs/arena/table2.py:smoke --workdir=/tmp/arena_t2_smoke     # CI

Protocol: 500 dev questions each of HotpotQA, 2WikiMultihopQA and MuSiQue with the paragraphs the dataset gives
each question (10 to 20) as numbered references; one generation at temperature 0 (ARENA's
<relevance>/<analysis>/<answer> format), no search. Metrics: EM, F1, LLM-as-a-judge (GPT-4o 2024-11-20 at temperature
0, "yes" when the response agrees with a gold answer; set `judge.base_url` and the key in OPENAI_API_KEY; without one
LJ is not computed), and the Format and Relevance scores of the reward. The shared files with paragraphs hold 500
HotpotQA, 164 2Wiki and 200 MuSiQue questions; the "shared" variant uses those. Models: Qwen2.5-7B-Instruct and
Llama-3.1-8B-Instruct (their base and ARENA-trained rows).
Scoring (no reward: evaluation only): EM and F1 of the first closed <answer> under ARENA's normalization, Format and
Relevance by its released rules (src/evaluate.py; jaxrag.evaluate.episode_metrics, docs/conformance.md); judge
GPT-4o for LJ only; sampling temperature 0.
"""

from configs.common import paper
from jaxrag.paths import BENCHMARKS


def get_config(variant: str = ""):
    paper.check_variant("configs/arena/table2.py", variant)
    data = [paper.dataset("HotpotQA", "data/hotpotqa_dev_500.jsonl"), paper.dataset("2Wiki", "data/2wiki_dev_500.jsonl"),
            paper.dataset("MuSiQue", "data/musique_dev_500.jsonl")]
    judge = {"base_url": "", "model": "gpt-4o-2024-11-20", "api_key_env": "OPENAI_API_KEY"}
    c = paper.table_config("arena", "table2", "Qwen2.5-7B-Instruct", {
        "eval": paper.eval_stage(("arena",), data, model_path="",
                                 retriever={"corpus": paper.SHARED_CORPUS}, k=10, max_steps=1, max_new_tokens=256,
                                 max_doc_chars=None, judge=judge),
    })
    if variant in ("shared", "smoke"):
        own = {"HotpotQA": "hotpotqa_dev_500.jsonl", "2Wiki": "2wikimultihopqa_dev_164.jsonl",
               "MuSiQue": "musique_ans_dev_200.jsonl"}  # the shared files that carry each question's paragraphs
        c.eval.datasets = [dict(d, path=str(BENCHMARKS / own[d["name"]])) for d in c.eval.datasets]
        c.eval.judge.base_url = ""
    if variant == "smoke":
        paper.smoke(c)
        c.eval.datasets = [dict(d, path=str(BENCHMARKS / own[d["name"]])) for d in c.eval.datasets]
        c.eval.rollout.max_steps = 1
    return c
