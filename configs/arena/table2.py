"""ARENA Table 2 (003 §4; METHODS.md §7): the ARENA generator over each question's own paragraphs.

    python -m jaxrag.main --config=configs/arena/table2.py --workdir=runs/arena_t2 \
        --config.eval.policy.path=/models/ARENA-7B --config.eval.judge.base_url=https://api.openai.com/v1
    python -m jaxrag.main --config=configs/arena/table2.py:shared --workdir=runs/arena_t2_shared  # runs now
    python -m jaxrag.main --config=configs/arena/table2.py:smoke --workdir=/tmp/arena_t2_smoke     # CI

Protocol: 500 dev questions each of HotpotQA, 2WikiMultihopQA and MuSiQue with the paragraphs the dataset gives
each question (10 to 20) as numbered references; one generation (ARENA's <relevance>/<analysis>/<answer> format), no
search, sampled as the released inference samples (src/vllm_inference.py: temperature 0.9, up to 1,024 new tokens,
no stop string: the reply runs to the end-of-sequence token, and text after </answer> costs the Format point; the
agent's stop_at "eos"). Greedy decoding, the other papers' setting: --config.eval.rollout.temperature=0; the old stop
at </answer>: agents [{"name": "arena", "opts": {"stop_at": "answer"}}]. Metrics: EM, F1, LLM-as-a-judge (GPT-4o 2024-11-20 at temperature
0, "yes" when the response agrees with a gold answer; set `judge.base_url` and the key in OPENAI_API_KEY; without one
LJ is not computed), and the Format and Relevance scores of the reward. The shared files with paragraphs hold 500
HotpotQA, 164 2Wiki and 200 MuSiQue questions; the "shared" variant uses those. Models: Qwen2.5-7B-Instruct and
Llama-3.1-8B-Instruct (their base and ARENA-trained rows).
Scoring (no reward: evaluation only): EM and F1 of the first closed <answer> under ARENA's normalization, Format and
Relevance by its released rules (src/evaluate.py; jaxrag.evaluate.episode_metrics, docs/conformance.md); judge
GPT-4o for LJ only; sampling temperature 0.9 (the released inference's; one sample per question, seeded).
"""

from configs.common import paper
from jaxrag.paths import SAMPLE, require_benchmarks


def get_config(variant: str = ""):
    paper.check_variant("configs/arena/table2.py", variant)
    data = [paper.dataset("HotpotQA", "data/hotpotqa_dev_500.jsonl"), paper.dataset("2Wiki", "data/2wiki_dev_500.jsonl"),
            paper.dataset("MuSiQue", "data/musique_dev_500.jsonl")]
    judge = {"base_url": "", "model": "gpt-4o-2024-11-20", "api_key_env": "OPENAI_API_KEY"}
    c = paper.table_config("arena", "table2", "Qwen2.5-7B-Instruct", {
        "eval": paper.eval_stage(({"name": "arena", "opts": {"stop_at": "eos"}},), data, model_path="",
                                 retriever={"corpus": paper.SHARED_CORPUS}, k=10, max_steps=1, max_new_tokens=1024,
                                 max_doc_chars=None, judge=judge),
    })
    c.eval.rollout.temperature = 0.9   # src/vllm_inference.py's sampling (no stop string: the agent's stop_at "eos")
    if variant == "shared":
        own_files(c, require_benchmarks("configs/arena/table2.py:shared"))
    if variant == "smoke":
        paper.smoke(c)
        own_files(c, SAMPLE)
        c.eval.rollout.max_steps = 1
    return c


def own_files(c, root) -> None:
    """The "shared" and "smoke" datasets: the benchmark files under `root` that carry each question's paragraphs,
    BM25 over their corpus, no LJ judge endpoint."""
    own = {"HotpotQA": "hotpotqa_dev_500.jsonl", "2Wiki": "2wikimultihopqa_dev_164.jsonl",
           "MuSiQue": "musique_ans_dev_200.jsonl"}
    c.eval.datasets = [dict(d, path=str(root / own[d["name"]])) for d in c.eval.datasets]
    c.eval.retriever.corpus = str(root / paper.CORPUS)
    c.eval.judge.base_url = ""
