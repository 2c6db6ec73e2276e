"""ReasonRAG Table 2 (002 §3.1, App. D; METHODS.md §7): five benchmarks on Qwen2.5-7B-Instruct, BGE top-3 over wiki-18.

    python -m jaxrag.main --config=configs/reasonrag/table2.py --workdir=runs/reasonrag_t2 \
        --config.eval.policy.path=/models/ReasonRAG-7B   # the trained row; the base model for the baselines
    python -m jaxrag.main --config=configs/reasonrag/table2.py:shared --workdir=runs/reasonrag_t2_shared  # runs now
    python -m jaxrag.main --config=configs/reasonrag/table2.py:smoke --workdir=/tmp/rr_smoke             # CI

Protocol: PopQA (the questions left after the 704 used for training; 11,267), HotpotQA dev (7,405), 2Wiki dev
(12,576), Bamboogle (125), MuSiQue dev (2,417); EM and F1 by FlashRAG's implementation (jaxrag.metrics is the
official normalization FlashRAG uses). Retrieval: BGE (dense) top 3 over the 2018 Wikipedia dump of FlashRAG,
augmented with the datasets' own paragraphs (002 App. D), whole passages. The ReasonRAG agent: Reasoning steps end in
<query> or <answer>, each query is followed by a Grounding step over its 3 documents; the released code's
max_iter = 7 counts both kinds, so 3 queries and an answer: 4 engine steps. Rows here: ReasonRAG's agent, and the
no-retrieval ("direct") and standard RAG ("rag") baselines on the same model; the other published baselines
(Self-RAG, Search-o1 with its own prompt, ...) are other systems. The "shared" variant's PopQA, 2Wiki and MuSiQue
gold is mostly not in the shared corpus (see the index-recall table).
Evaluation only: no value scheme, reward or judge (the MCTS values are configs/reasonrag/table3.py's); actions at
temperature 0 (the eval stage's).
"""

from configs.common import paper


def get_config(variant: str = ""):
    paper.check_variant("configs/reasonrag/table2.py", variant)
    data = [paper.dataset("PopQA", "data/popqa_test.jsonl"), paper.dataset("HotpotQA", "data/hotpotqa_dev.jsonl"),
            paper.dataset("2Wiki", "data/2wikimultihopqa_dev.jsonl"),
            paper.dataset("Bamboogle", "data/bamboogle_test.jsonl"), paper.dataset("MuSiQue", "data/musique_dev.jsonl")]
    c = paper.table_config("reasonrag", "table2", "Qwen2.5-7B-Instruct", {
        "eval": paper.eval_stage(("reasonrag", "direct", "rag"), data, model_path="",
                                 retriever={"index_dir": "indexes/wiki18_bge", "kind": "dense"},
                                 k=3, max_steps=4, max_new_tokens=512, max_doc_chars=None),
    })
    if variant == "shared":
        paper.use_shared(c)
    elif variant == "smoke":
        paper.smoke(c)
    return c
