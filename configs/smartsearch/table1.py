"""SmartSearch Table 1 (004 §5; METHODS.md §7): four knowledge-intensive benchmarks on Qwen2.5-3B-Instruct,
E5-base-v2 top 5 over FlashRAG's 2018 Wikipedia.

    python -m jaxrag.main --config=configs/smartsearch/table1.py --workdir=runs/smartsearch_t1 \
        --config.eval.policy.path=/models/SmartSearch-3B
    python -m jaxrag.main --config=configs/smartsearch/table1.py:shared --workdir=runs/ss_t1_shared  # runs now
    python -m jaxrag.main --config=configs/smartsearch/table1.py:smoke --workdir=/tmp/ss_t1_smoke     # CI

Protocol: 2WikiMultihopQA, HotpotQA, Bamboogle and MuSiQue; EM, word-level F1 and search efficiency SE = mean F1_i /
T_i (T_i = the question's search calls; jaxrag.metrics.search_efficiency). The SmartSearch agent (<think>,
<search>, env-filled <result>, <answer> with \\boxed{}), at most 5 tool calls per question (004 App. B: the
rollout's limit), so 6 steps with the answer; 5 documents per search from E5-base-v2 ("query: " / "passage: "
prefixes) over wiki-18, temperature 0. Rows: the SmartSearch agent and the baselines of the table that are agent
designs here (Direct, CoT, RAG, Search-o1) on the same model. The paper does not say how many questions of each dev set it evaluates; the
data paths are config fields (the "shared" variant: the shared 500-question dev samples and all of Bamboogle).
No reward and no judge (evaluation only). The SmartSearch row's answer is read as the released evaluation reads it
(src/flashrag/pipeline/active_pipeline.py: the last closed <answer>, its \\boxed{}; an <answer> without \\boxed{} is
no answer; agent opts eval_answer "boxed", jaxrag.env.parsing.code_eval_answer, docs/conformance.md). The agent's
own parse (the last <answer>'s \\boxed{}, else its text): opts {"eval_answer": "parsed"}. The baselines' answers are
their agents' parses.
"""

from configs.common import paper

SMARTSEARCH = {"name": "smartsearch", "opts": {"eval_answer": "boxed"}}   # the released evaluation's answer reading


def get_config(variant: str = ""):
    paper.check_variant("configs/smartsearch/table1.py", variant)
    data = [paper.dataset("2Wiki", "data/2wikimultihopqa_dev.jsonl"), paper.dataset("HotpotQA", "data/hotpotqa_dev.jsonl"),
            paper.dataset("Bamboogle", "data/bamboogle_test.jsonl"), paper.dataset("MuSiQue", "data/musique_dev.jsonl")]
    c = paper.table_config("smartsearch", "table1", "Qwen2.5-3B-Instruct", {
        "eval": paper.eval_stage(("direct", "cot", "rag", "search_o1", SMARTSEARCH), data, model_path="",
                                 retriever={"index_dir": "indexes/wiki18_e5", "kind": "dense"},
                                 k=5, max_steps=6, max_new_tokens=1024, max_doc_chars=None),
    })
    if variant == "shared":
        paper.use_shared(c)
    elif variant == "smoke":
        paper.smoke(c)
    return c
