"""Shared pieces of the papers' table configs (configs/<paper>/<table>.py): the datasets, an eval stage section and the
three variants every table config has.

Variants (`--config=configs/<paper>/<table>.py:<variant>`):
  ""        the paper's protocol: its model, retriever, k, step budget and dataset selections; the data and index
            paths are config fields (relative to the workdir, or absolute), e.g. `indexes/wiki18` built by
            `python -m jaxrag.retrieval.prepare` and the full dev sets in the shared record format.
  "shared"  the same protocol over the full benchmark files in $JAXRAG_BENCHMARKS (default data/benchmarks_full;
            data/benchmarks/NOTICE.md lists them and their sources): their question files and their 11k-paragraph
            multi-hop corpus with BM25 built on the fly, with no index to build; without that folder the config stops
            at once naming the variable. That corpus
            holds HotpotQA's gold paragraphs but mostly not 2Wiki's, Bamboogle's, MuSiQue's or PopQA's, and no medical
            text: each eval table reports the index's gold recall beside EM, so read a low one as a retrieval gap.
  "smoke"   what CI runs: a tiny random checkpoint (setup stage), 2 questions per dataset, BM25 over 300
            paragraphs, 2 steps of 16 tokens, on the slices of those files that ship in the repository
            (data/benchmarks). It checks the wiring, not the numbers.

Every config has top-level `paper`, `table` and `model` (what notebooks/paper_tables.ipynb matches against the
published tables) and one eval stage per retrieval corpus. The policy path is empty: set it to a local Hugging Face
checkpoint (`--config.eval.policy.path=...`), and `model` to its name when it is not the paper's.
"""

import ml_collections

from jaxrag.paths import BENCHMARKS, SAMPLE, require_benchmarks

VARIANTS = ("", "shared", "smoke")

# The benchmark file of each dataset (data/benchmarks/NOTICE.md says what each is): in BENCHMARKS in full, in SAMPLE
# its first questions.
SHARED = {
    "HotpotQA": "hotpotqa_dev_500.jsonl",                      # 500 dev, distractor setting, with paragraphs
    "2Wiki": "2wikimultihopqa_dev_500_r1searcher_qonly.jsonl",  # 500 dev, question and answer only
    "Bamboogle": "bamboogle_test.jsonl",                       # all 125
    "MedQA": "medqa_usmle_4opt_test_1273.jsonl",               # the full 4-option US test set
    "MuSiQue": "musique_ans_dev_500_r1searcher_qonly.jsonl",   # 500 dev, question only
    "PopQA": "popqa_2000.jsonl",                               # 2,000 PopQA questions
}
CORPUS = "corpus_multihop_contexts.jsonl"
SHARED_CORPUS = str(BENCHMARKS / CORPUS)
SAMPLE_CORPUS = str(SAMPLE / CORPUS)


def check_variant(path: str, variant: str) -> None:
    if variant not in VARIANTS:
        raise ValueError(f"{path}: unknown variant {variant!r} (use one of {', '.join(map(repr, VARIANTS))})")


RAG_GYM_AGENTS = ("direct", "cot", "rag", "react", "search_o1", "re2search")   # the six designs RAG-Gym tunes
TUNED_DOMAINS = ("medqa",)   # a tuned row's other column: RAG-Gym collects on 1,000 MedQA training questions for it


def variant_and_agent(path: str, arg: str, default: str = "re2search") -> tuple[str, str, str]:
    """A RAG-Gym tuned-row config's argument: a variant, an agent design and/or the domain "medqa", comma-separated
    in any order ("shared,react", "medqa,cot"): (variant, agent, domain). The agent is one of RAG-Gym's six
    (default Re²Search, its best), so each of Table 2's tuned rows is `--config=configs/rag_gym/dpo.py:react` and so
    on; "medqa" is the row's MedQA column (RAG-Gym tunes on MedQA train for it), "" the open-domain sets."""
    variant, agents, domain = _split_argument(path, arg, with_agent=True)
    return variant, (agents[0] if agents else default), domain


def variant_and_domain(path: str, arg: str) -> tuple[str, str]:
    """A RAG-Gym critic config's argument (table4.py, fig4.py): a variant and/or "medqa" -> (variant, domain)."""
    variant, _, domain = _split_argument(path, arg, with_agent=False)
    return variant, domain


def _split_argument(path: str, arg: str, with_agent: bool) -> tuple[str, list, str]:
    parts = [p for p in arg.split(",") if p] if arg else []
    agents = [p for p in parts if with_agent and p in RAG_GYM_AGENTS]
    domains = [p for p in parts if p in TUNED_DOMAINS]
    rest = [p for p in parts if p not in agents and p not in TUNED_DOMAINS]
    if len(agents) > 1 or len(domains) > 1 or len(rest) > 1 or (rest and rest[0] not in VARIANTS):
        what = f", an agent of {', '.join(RAG_GYM_AGENTS)}" if with_agent else ""
        raise ValueError(f"{path}: unknown argument {arg!r} (a variant of {', '.join(map(repr, VARIANTS))}{what} "
                         f"and/or the domain {', '.join(TUNED_DOMAINS)}, e.g. "
                         f"{'shared,react' if with_agent else 'smoke,medqa'!r})")
    variant, domain = (rest[0] if rest else ""), (domains[0] if domains else "")
    if domain == "medqa" and variant == "shared":
        raise ValueError(f"{path}: 'medqa' has no 'shared' variant: the shared benchmarks hold neither MedQA's "
                         "training questions nor a medical corpus (see configs/rag_gym/pieces.py:medqa_collect)")
    return variant, agents, domain


def dataset(name: str, path: str, select: str = "all") -> dict:
    """One dataset of an eval stage: a QA JSONL (absolute, or relative to the workdir) and its selection."""
    return {"name": name, "path": path, "select": select}


def eval_stage(agents, datasets, *, model_path: str, retriever: dict, k: int, max_steps: int, max_new_tokens: int,
               max_doc_chars=None, max_prompt_tokens=None, batch_size: int = 32, judge=None) -> ml_collections.ConfigDict:
    """An eval stage section (jaxrag.pipelines.eval:eval_stage) at temperature 0, the papers' inference setting."""
    return ml_collections.ConfigDict({
        "fn": "jaxrag.pipelines.eval:eval_stage",
        "agents": [a if isinstance(a, dict) else {"name": a} for a in agents],
        "datasets": list(datasets),
        "policy": {"fn": "jaxrag.pipelines.common:load_policy", "path": model_path,
                   "max_prompt_tokens": max_prompt_tokens},
        "summarizer": {"fn": "jaxrag.pipelines.common:load_policy", "path": ""},  # "": the policy summarizes
        "max_doc_chars": max_doc_chars,
        "retriever": {"fn": "jaxrag.pipelines.common:load_retriever", "index_dir": "", "corpus": "",
                      "max_passages": 0, "kind": "bm25", "backend": "bm25s", **retriever},
        "rollout": {"k": k, "max_steps": max_steps, "batch_size": batch_size, "temperature": 0.0,
                    "max_new_tokens": max_new_tokens},
        "judge": judge,
        "tuning": "",  # "sft" | "dpo" | "ppo" | ...: the methods become "<agent>+<tuning>" (a tuned row of the table)
        "index_recall": True,
    })


def table_config(paper: str, table: str, model: str, stages: dict) -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict({"paper": paper, "table": table, "model": model, "stages": list(stages)})
    for name, section in stages.items():
        c[name] = section
    return c


def use_shared(c: ml_collections.ConfigDict, root=None) -> None:
    """The "shared" variant: every eval stage reads the benchmark files under `root` (default: the full files,
    required) and BM25 over its corpus."""
    root = require_benchmarks(f"configs/{c.paper}/{c.table}.py:shared") if root is None else root
    for name in c.stages:
        e = c[name]
        e.datasets = [dict(d, path=str(root / SHARED[d["name"]])) if d["name"] in SHARED else d
                      for d in e.datasets]
        e.retriever.update(dict(index_dir="", corpus=str(root / CORPUS), kind="bm25", backend="bm25s"))


def smoke(c: ml_collections.ConfigDict) -> None:
    """The "smoke" variant (see the module doc): "shared" over the repository's slices."""
    from jaxrag.pipelines.rl import tiny_checkpoint_config

    use_shared(c, SAMPLE)
    evals = list(c.stages)
    c.stages = ["setup"] + evals
    c.setup = tiny_checkpoint_config(SAMPLE_CORPUS)
    c.model = "tiny-random"
    for name in evals:
        e = c[name]
        e.policy.path = "stage:setup"
        e.policy.max_prompt_tokens = 384
        e.datasets = [dict(d, select="first:2") for d in e.datasets]
        e.retriever.max_passages = 300
        e.rollout.update(dict(k=2, max_steps=2, batch_size=8, max_new_tokens=16))
        e.max_doc_chars = 60
        if e.judge is not None:
            e.judge.base_url = ""
