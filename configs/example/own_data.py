"""Your own model, questions and corpus: one eval stage (one-shot RAG and ReAct) over a BM25 index, greedy.

    python -m jaxrag.retrieval.build --corpus my_corpus.jsonl --out runs/mine/indexes/mine --bm25 bm25s --no-dense
    python -m jaxrag.main --config=configs/example/own_data.py --workdir=runs/mine \\
        --config.eval.policy.path=/models/Qwen2.5-7B-Instruct "--config.eval.datasets[0].path=/data/my_qa.jsonl"

Paths are absolute or relative to the workdir. The QA and corpus formats: README.md, "Your own model and data".
Outputs: runs/mine/eval/table.md (EM / F1 per agent and dataset, then the index's own recall), metrics.jsonl and
one episodes JSONL per agent and dataset.
"""

from configs.common import paper


def get_config():
    return paper.table_config("mine", "own_data", "my-model", {
        "eval": paper.eval_stage(
            ["rag", "react"], [paper.dataset("MyQA", "data/my_qa.jsonl", "first:200")],
            model_path="", retriever={"index_dir": "indexes/mine", "kind": "bm25", "backend": "bm25s"},
            k=5, max_steps=8, max_new_tokens=256),
    })
