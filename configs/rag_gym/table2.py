"""RAG-Gym Table 2, zero-shot rows (001 §4; METHODS.md §1, §3, §7): six agents on Llama-3.1-8B-Instruct.

    python -m jaxrag.main --config=configs/rag_gym/table2.py --workdir=runs/rag_gym_t2 \
        --config.eval.policy.path=/models/Llama-3.1-8B-Instruct --config.eval_medqa.policy.path=/models/Llama-3.1-8B-Instruct
    python -m jaxrag.main --config=configs/rag_gym/table2.py:shared --workdir=runs/rag_gym_t2_shared  # runs now
    python -m jaxrag.main --config=configs/rag_gym/table2.py:smoke --workdir=/tmp/t2_smoke            # CI

Protocol: HotpotQA dev (the last 1,000; the first 1,000 train), 2WikiMultihopQA dev (the last 1,000), Bamboogle (all
125): EM / F1; MedQA (the 1,273 US test questions): accuracy. Actions at temperature 0, at most 10 per question,
32 documents per search from BM25 (Lucene parameters) and a dense retriever fused by RRF (k 60, each list 100 deep),
whole passages: BGE-Base for the open-domain sets (001 App. C: build `indexes/wiki` with `prepare --encoder
$WORKDIR/models/bge-base-en-v1.5 --pooling cls`, BGE's CLS vectors), MedCPT for MedQA. Wikipedia for the three
open-domain sets; MedQA searches textbooks + StatPearls (MedRAG's corpora) in its own stage. The Search-o1 and
Re²Search summaries come from the policy itself (the untuned base model, as in RAG-Gym; a tuned row sets
`summarizer` to the base model). MedQA's dense side is MedCPT, as in MedRAG: the article
encoder embeds each snippet as the pair (title, content), the query encoder each query, CLS vectors, no normalization,
inner product. Build `indexes/medcorp` from MedRAG's chunk files (id, title, content) with the encoders under models/:
    cat textbooks/chunk/*.jsonl statpearls/chunk/*.jsonl > medcorp.jsonl
    python -m jaxrag.retrieval.prepare --corpus medcorp.jsonl --out $WORKDIR/indexes/medcorp --bm25 bm25s \
        --encoder $WORKDIR/models/MedCPT-Article-Encoder --max-len 512 --pair-input --pooling cls --no-normalize \
        --query-encoder $WORKDIR/models/MedCPT-Query-Encoder --query-max-len 64
Tuned rows (SFT / DPO / PPO) are the same config with `policy.path` at the tuned checkpoint, `summarizer.path` at the
base model and `tuning` naming the method ("--config.eval.tuning=dpo": rows "react+dpo", ...).
Zero-shot rows: no process reward, no value scheme; actions at T = 0; the LLM-judge metric (LJ: GPT-4o over HTTP,
T = 0) only when `judge.base_url` is set.
"""

from configs.common import paper

AGENTS = paper.RAG_GYM_AGENTS


def get_config(variant: str = ""):
    paper.check_variant("configs/rag_gym/table2.py", variant)
    judge = {"base_url": "", "model": "gpt-4o", "api_key_env": "OPENAI_API_KEY"}  # LJ, when base_url is set
    common = dict(model_path="", k=32, max_steps=10, max_new_tokens=512, max_doc_chars=None, judge=judge)
    # RRF as the released environment runs it: env.py passes rrf_k 60 (every script's --rrf_k default; IR.py's own
    # default of 100 is never used), and IR.retrieve asks each retriever for max(2k, 100) = 100 documents
    fusion = {"kind": "hybrid", "backend": "bm25s", "rrf_k": 60, "depth": 100}
    wiki = {"index_dir": "indexes/wiki", **fusion}
    med = {"index_dir": "indexes/medcorp", **fusion,
           "encoder": "models/MedCPT-Article-Encoder", "query_encoder": "models/MedCPT-Query-Encoder"}
    c = paper.table_config("rag_gym", "table2", "Llama-3.1-8B-Instruct", {
        "eval": paper.eval_stage(AGENTS, [paper.dataset("HotpotQA", "data/hotpotqa_dev.jsonl", "last:1000"),
                                          paper.dataset("2Wiki", "data/2wikimultihopqa_dev.jsonl", "last:1000"),
                                          paper.dataset("Bamboogle", "data/bamboogle_test.jsonl")],
                                 retriever=wiki, **common),
        "eval_medqa": paper.eval_stage(AGENTS, [paper.dataset("MedQA", "data/medqa_usmle_4opt_test.jsonl")],
                                       retriever=med, **common),
    })
    if variant == "shared":
        paper.use_shared(c)
    elif variant == "smoke":
        paper.smoke(c)
    return c
