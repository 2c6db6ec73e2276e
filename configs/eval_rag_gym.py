"""RAG-Gym Table 2 style evaluation: agents x (HotpotQA, 2Wiki, Bamboogle, MedQA) -> workdir/eval/table.md.

python -m jaxrag.main --config=configs/eval_rag_gym.py --workdir=runs/eval --config.eval.policy.path=/path/to/hf_dir
"""
import ml_collections

from jaxrag.paths import BENCHMARKS

B = str(BENCHMARKS)


def get_config():
    c = ml_collections.ConfigDict()
    c.stages = ["eval"]
    c.eval = ml_collections.ConfigDict({
        "fn": "jaxrag.pipelines.eval:eval_stage",
        "agents": [{"name": n} for n in ("direct", "cot", "rag", "react", "search_o1", "re2search")],
        "datasets": [
            {"name": "HotpotQA", "path": f"{B}/hotpotqa_dev_500.jsonl", "select": "last:250"},
            {"name": "2Wiki", "path": f"{B}/2wikimultihopqa_dev_500_r1searcher_qonly.jsonl", "select": "all"},
            {"name": "Bamboogle", "path": f"{B}/bamboogle_test.jsonl", "select": "all"},
            {"name": "MedQA", "path": f"{B}/medqa_usmle_4opt_test_1273.jsonl", "select": "all"},
        ],
        "policy": {"fn": "jaxrag.pipelines.common:load_policy", "path": "", "max_prompt_tokens": None},
        # Search-o1 / Re²Search summaries: None = the policy; RAG-Gym keeps the untuned base model here
        # (e.g. {"path": "/path/to/Llama-3.1-8B-Instruct"} when the policy is a tuned one)
        "summarizer": None,
        "max_doc_chars": None,        # per-document cut; None: whole passages, as RAG-Gym's released code
        "retriever": {"fn": "jaxrag.pipelines.common:load_retriever", "corpus": f"{B}/corpus_multihop_contexts.jsonl",
                      "index_dir": "", "kind": "bm25", "backend": "bm25s"},
        "rollout": {"k": 32, "max_steps": 10, "batch_size": 32, "temperature": 0.0, "max_new_tokens": 512},
        "judge": {"base_url": "", "model": "gpt-4o", "api_key_env": "OPENAI_API_KEY"},
    })
    return c
