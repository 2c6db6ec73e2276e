"""The papers' published numbers, typed in from their own tables (../shared/papers), for the paper-table notebook.

Scale: percentages as printed (21.10 means 21.10 %); jaxrag's metrics.jsonl holds fractions, compare.py multiplies
them by 100. Each `PaperTable` is one printed table: its columns (dataset, metric) in printed order and its rows
(label as printed, model, values in column order; None where the table prints "–" or where the value was left out
as ambiguous, see `LEFT_OUT`). `METHODS` maps every typed-in row label to jaxrag's method name in one explicit
table; rows of methods jaxrag does not implement (FLARE, Search-R1, ...) are not typed in. `PUBLISHED` is the flat
tuple of `Entry` (one printed number each) that compare.py reads.

Method names: the agent ("direct", "re2search", ...) for a zero-shot row, `<agent>+<tuning>[+<tuning>...]` for a
tuned one, in training order (SmartSearch's curriculum is "smartsearch+sft+dpo+grpo"), and `-<variant>` for an
ablation or a variant the paper names (e.g. "smartsearch+sft+dpo-no_refinement"): see `is_known_method`.
Dataset names as in the configs (2WikiMultihopQA -> "2Wiki", Musique -> "MuSiQue"); "Average" is the paper's own
average column. Metric names as jaxrag's metrics.jsonl keys ("em", "f1", "cem", "acc", "lj", "arena_format",
"arena_relevance"), plus "agree" (RAG-Gym Table 4: agreement with human annotators).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

PAPERS = {"rag_gym": "RAG-Gym", "reasonrag": "ReasonRAG", "arena": "ARENA", "smartsearch": "SmartSearch"}
AGENTS = ("direct", "cot", "rag", "react", "search_o1", "re2search", "reasonrag", "arena", "arena_naive", "smartsearch")
TUNINGS = ("sft", "dpo", "ppo", "grpo", "critic", "orm", "orl")  # orm: outcome reward model; orl: outcome-reward RL

LLAMA8, QWEN7, QWEN3 = "Llama-3.1-8B-Instruct", "Qwen2.5-7B-Instruct", "Qwen2.5-3B-Instruct"


@dataclass(frozen=True)
class Entry:
    paper: str      # key of PAPERS
    table: str      # "table2"
    row: str        # the row label as printed ("<section> / <label>" where the table repeats labels per section)
    method: str     # jaxrag's method name (METHODS)
    model: str      # the policy checkpoint
    dataset: str
    metric: str
    value: float    # percent, as printed
    where: str      # where the table is in the paper's text


@dataclass(frozen=True)
class PaperTable:
    paper: str
    table: str
    title: str
    where: str
    columns: tuple[tuple[str, str], ...]                   # (dataset, metric) in printed order
    rows: tuple[tuple[str, str, tuple[float | None, ...]], ...]  # (label, model, values by column)
    decimals: int = 1                                      # as printed (RAG-Gym: 2)


def _cols(datasets: str, metrics: str) -> tuple[tuple[str, str], ...]:
    return tuple((d, m) for d in datasets.split() for m in metrics.split())


_RG_T2_COLS = _cols("HotpotQA 2Wiki Bamboogle", "em f1") + (("MedQA", "acc"),) + _cols("Average", "em f1")
_RG_SECTIONS = ("Zero-shot Learning", "RAG-Gym Supervised Fine-tuning", "RAG-Gym Direct Preference Optimization",
                "RAG-Gym Proximal Policy Optimization")
_RR_COLS = _cols("PopQA HotpotQA 2Wiki Bamboogle MuSiQue Average", "em f1")
_SS_COLS = _cols("2Wiki HotpotQA Bamboogle MuSiQue Average", "em f1")

TABLES: tuple[PaperTable, ...] = (
    # 001_359c0775caa2b2e7.txt lines 115-142, "Table 2: Agent performance with Llama-3.1-8B backbone" (the backbone
    # is Llama-3.1-8B-Instruct, App. C line 451). The converted text prints "Search-01" for Search-o1.
    PaperTable("rag_gym", "table2", "Agent performance with Llama-3.1-8B backbone",
               "001_359c0775caa2b2e7.txt lines 115-142", _RG_T2_COLS, (
        (f"{_RG_SECTIONS[0]} / Direct", LLAMA8, (21.10, 27.93, 24.10, 27.68, 9.60, 14.89, 61.82, 29.16, 33.08)),
        (f"{_RG_SECTIONS[0]} / CoT", LLAMA8, (27.10, 35.17, 25.70, 30.08, 37.60, 49.50, 69.60, 40.00, 46.09)),
        (f"{_RG_SECTIONS[0]} / RAG", LLAMA8, (38.30, 48.57, 32.00, 36.91, 22.40, 33.73, 66.85, 39.89, 46.51)),
        (f"{_RG_SECTIONS[0]} / ReAct", LLAMA8, (30.70, 41.09, 28.90, 35.03, 32.00, 41.35, 62.37, 38.49, 44.96)),
        (f"{_RG_SECTIONS[0]} / Search-o1", LLAMA8, (35.30, 47.33, 34.00, 41.29, 44.80, 52.50, 66.14, 45.06, 51.82)),
        (f"{_RG_SECTIONS[0]} / Re²Search", LLAMA8, (34.00, 44.91, 41.50, 49.06, 44.80, 55.33, 70.31, 47.65, 54.90)),
        (f"{_RG_SECTIONS[1]} / Direct", LLAMA8, (22.80, 31.67, 28.00, 33.17, 20.00, 27.21, 63.63, 33.61, 38.92)),
        (f"{_RG_SECTIONS[1]} / CoT", LLAMA8, (26.50, 35.60, 27.30, 32.10, 42.40, 53.89, 69.68, 41.47, 47.82)),
        (f"{_RG_SECTIONS[1]} / RAG", LLAMA8, (41.50, 52.26, 38.00, 42.74, 28.80, 40.76, 67.79, 44.02, 50.89)),
        (f"{_RG_SECTIONS[1]} / ReAct", LLAMA8, (35.50, 46.06, 31.00, 36.79, 34.40, 44.17, 66.69, 41.90, 48.43)),
        (f"{_RG_SECTIONS[1]} / Search-o1", LLAMA8, (38.20, 50.02, 39.00, 45.91, 46.40, 57.18, 67.64, 47.81, 55.19)),
        (f"{_RG_SECTIONS[1]} / Re²Search", LLAMA8, (37.60, 49.16, 44.00, 50.54, 44.80, 56.78, 69.52, 48.98, 56.50)),
        (f"{_RG_SECTIONS[2]} / Direct", LLAMA8, (20.80, 28.79, 25.20, 29.45, 12.00, 20.67, 62.37, 30.09, 35.32)),
        (f"{_RG_SECTIONS[2]} / CoT", LLAMA8, (26.30, 35.06, 28.20, 32.84, 40.80, 51.67, 71.33, 41.66, 47.73)),
        (f"{_RG_SECTIONS[2]} / RAG", LLAMA8, (38.00, 49.38, 37.60, 42.88, 28.80, 39.57, 67.79, 43.05, 49.91)),
        (f"{_RG_SECTIONS[2]} / ReAct", LLAMA8, (33.00, 43.96, 32.20, 39.24, 44.80, 54.35, 68.89, 44.72, 51.61)),
        (f"{_RG_SECTIONS[2]} / Search-o1", LLAMA8, (42.20, 54.34, 44.10, 52.66, 42.40, 55.59, 70.23, 49.73, 58.21)),
        (f"{_RG_SECTIONS[2]} / Re²Search", LLAMA8, (42.20, 55.22, 44.30, 51.36, 48.00, 56.57, 72.11, 51.65, 58.82)),
        (f"{_RG_SECTIONS[3]} / Direct", LLAMA8, (19.20, 26.17, 25.60, 28.84, 7.20, 12.17, 61.12, 28.28, 32.08)),
        (f"{_RG_SECTIONS[3]} / CoT", LLAMA8, (25.50, 33.68, 24.20, 29.02, 43.20, 52.54, 68.50, 40.35, 45.94)),
        # Average F1 printed 41.44, but its four F1/Acc cells average to 48.04: left out (LEFT_OUT)
        (f"{_RG_SECTIONS[3]} / RAG", LLAMA8, (37.70, 47.60, 32.00, 36.29, 28.80, 40.24, 68.03, 41.63, None)),
        (f"{_RG_SECTIONS[3]} / ReAct", LLAMA8, (35.80, 47.56, 33.20, 40.06, 36.80, 46.79, 67.32, 43.28, 50.43)),
        (f"{_RG_SECTIONS[3]} / Search-o1", LLAMA8, (38.30, 50.24, 32.60, 39.34, 50.40, 59.92, 70.15, 47.86, 54.91)),
        (f"{_RG_SECTIONS[3]} / Re²Search", LLAMA8, (38.40, 50.30, 41.40, 48.06, 49.60, 62.06, 71.72, 50.28, 58.04)),
    ), decimals=2),
    # 001 lines 157-169, "Table 3: Comparison of Re²Search++ and other methods" (LLM column: Llama-3.1-8B, then
    # Qwen-2.5-7B; the instruct checkpoints per App. C line 451). The last row lost its LLM cell in the
    # conversion; it sits in the Qwen block.
    PaperTable("rag_gym", "table3", "Comparison of Re²Search++ and other methods",
               "001_359c0775caa2b2e7.txt lines 157-169", _cols("HotpotQA 2Wiki Bamboogle Average", "em cem f1"), (
        ("Llama-3.1-8B / ReAct", LLAMA8,
         (30.70, 38.40, 41.09, 28.90, 38.00, 35.03, 32.00, 36.80, 41.35, 30.57, 37.73, 39.16)),
        ("Llama-3.1-8B / Search-o1", LLAMA8,
         (35.30, 43.80, 47.33, 34.00, 45.80, 41.29, 44.80, 48.80, 52.50, 38.03, 46.13, 47.04)),
        ("Llama-3.1-8B / Re²Search++", LLAMA8,
         (46.50, 57.80, 60.19, 48.90, 60.50, 56.85, 55.20, 63.20, 66.37, 50.20, 60.50, 61.14)),
        ("Qwen-2.5-7B / ReAct", QWEN7,
         (36.00, 40.10, 45.84, 38.60, 44.50, 45.02, 35.20, 38.40, 44.94, 36.60, 41.00, 45.27)),
        ("Qwen-2.5-7B / Search-o1", QWEN7,
         (40.70, 46.60, 52.15, 38.90, 46.20, 45.79, 40.80, 44.80, 52.91, 40.17, 45.87, 50.28)),
        ("Qwen-2.5-7B / Re²Search++", QWEN7,
         (44.40, 50.30, 56.47, 47.00, 56.50, 54.35, 52.94, 56.30, 63.51, 48.11, 54.37, 58.11)),
    ), decimals=2),
    # 001 lines 177-184, "Table 4: Comparison of various reward sources": cells "EM / F1", MedQA "Acc / Agree".
    # The paper does not name the actor these reward models guide (§4.1; assumed: zero-shot Re²Search, Llama).
    PaperTable("rag_gym", "table4", "Comparison of various reward sources",
               "001_359c0775caa2b2e7.txt lines 177-184",
               _cols("HotpotQA 2Wiki Bamboogle", "em f1") + (("MedQA", "acc"), ("MedQA", "agree")), (
        ("ORM", LLAMA8, (41.10, 53.35, 47.70, 55.59, 43.20, 57.46, 66.77, None)),   # Agree printed "–"
        ("PRM (Random)", LLAMA8, (32.20, 42.83, 35.70, 42.00, 38.40, 47.86, 68.26, 50.00)),
        ("PRM (Rollout)", LLAMA8, (39.60, 51.85, 42.94, 49.57, 48.80, 56.05, 68.34, 71.03)),
        ("PRM (Llama)", LLAMA8, (40.30, 51.74, 40.70, 48.22, 44.80, 54.36, 68.50, 65.99)),
        ("PRM (GPT)", LLAMA8, (44.10, 56.84, 50.20, 57.94, 51.20, 63.15, 71.96, 85.85)),
    ), decimals=2),
    # 002_a8aad330eed26826.txt lines 158-175, "Table 2: Main Results (%) on Five benchmarks"; Qwen2.5-7B-Instruct
    # backbone for every row (§3.1). Significance stars dropped.
    PaperTable("reasonrag", "table2", "Main Results (%) on Five benchmarks",
               "002_a8aad330eed26826.txt lines 158-175", _RR_COLS, (
        ("Zero-shot / Naïve Generation", QWEN7, (12.7, 16.5, 15.7, 24.8, 20.2, 28.0, 6.4, 17.4, 2.7, 10.2, 11.5, 19.4)),
        ("Zero-shot / Standard RAG", QWEN7, (38.4, 44.7, 29.3, 39.9, 29.4, 36.3, 17.6, 24.1, 6.7, 15.1, 24.3, 32.0)),
        ("Reasoning / Search-o1", QWEN7, (33.2, 40.3, 24.8, 38.1, 16.4, 27.1, 30.4, 40.6, 6.3, 13.7, 22.2, 31.96)),
        ("Reasoning / ReasonRAG(5k)", QWEN7, (41.5, 46.2, 38.4, 48.9, 43.6, 50.4, 36.0, 45.5, 12.8, 20.6, 34.4, 42.3)),
    )),
    # 002 lines 196-204, "Table 3: Impact of different optimization strategies on ReasonRAG's effectiveness"
    # (§3.4: RL-PRL is the default, process-level DPO; RL-ORL follows Search-R1 with outcome rewards).
    PaperTable("reasonrag", "table3", "Impact of different optimization strategies",
               "002_a8aad330eed26826.txt lines 196-204", _RR_COLS, (
        ("ReasonRAG (Base)", QWEN7, (35.6, 42.7, 23.7, 38.2, 15.2, 28.9, 28.0, 38.7, 7.7, 15.4, 22.0, 32.8)),
        ("ReasonRAG (SFT)", QWEN7, (31.6, 37.4, 26.8, 38.7, 35.1, 40.9, 17.6, 27.3, 8.6, 15.5, 23.9, 32.0)),
        ("ReasonRAG (RL-ORL): 5k queries", QWEN7,
         (23.0, 30.9, 28.1, 32.6, 32.0, 43.8, 17.5, 24.1, 5.9, 13.1, 21.3, 28.9)),
        ("ReasonRAG (RL-ORL): 10k queries", QWEN7,
         (39.5, 45.7, 36.7, 46.7, 40.5, 47.2, 30.7, 40.6, 12.6, 19.5, 32.0, 39.9)),
        ("ReasonRAG (RL-PRL)", QWEN7, (41.5, 46.2, 38.4, 48.9, 43.6, 50.4, 36.0, 45.5, 12.8, 20.6, 34.5, 42.3)),
    )),
    # 003_5246a32dcbbd2702.txt lines 78-100: the main results table under §4.2 (its caption was lost in the
    # conversion; §5.1 line 112 calls it Table 2). Prompt-based rows: the instruct models answering with the
    # dataset's references (§4.3); ARENA rows: GRPO-trained.
    PaperTable("arena", "table2", "Main results (EM, F1, LLM-as-a-Judge)",
               "003_5246a32dcbbd2702.txt lines 78-100", _cols("HotpotQA 2Wiki MuSiQue", "em f1 lj"), (
        ("Llama3.1-8B-Instruct", LLAMA8, (52.8, 67.6, 73.8, 39.8, 47.8, 48.4, 24.8, 37.0, 32.4)),
        ("Qwen2.5-7B-Instruct", QWEN7, (48.4, 62.8, 66.0, 33.4, 42.4, 41.2, 25.2, 35.4, 30.6)),
        ("ARENA-Llama3.1-8B", LLAMA8, (55.2, 70.3, 78.0, 62.2, 71.0, 73.5, 35.8, 44.5, 46.6)),
        ("ARENA-Qwen2.5-7B", QWEN7, (62.8, 76.2, 81.2, 66.0, 75.2, 78.6, 40.0, 52.0, 50.8)),
    )),
    # 003 lines 105-109: Format and Relevance scores (§5.1 "Transparency", line 113 calls it Table 3; caption lost).
    PaperTable("arena", "table3", "Format and Relevance scores", "003_5246a32dcbbd2702.txt lines 105-109",
               _cols("HotpotQA 2Wiki MuSiQue", "arena_format arena_relevance"), (
        ("Qwen2.5-7B-Instruct", QWEN7, (91.6, 68.3, 97.8, 67.3, 80.2, 48.4)),
        ("ARENA-7B", QWEN7, (100.0, 91.3, 100.0, 90.8, 100.0, 59.5)),
    )),
    # 003 lines 321-329, App. I "Ablation on the Bonus Reward", Table 10 (caption lost; line 323 names it): the
    # model trained without the bonus (configs/arena/fig3.py's eval_nobonus) on HotpotQA; Format and Relevance in
    # percent as Table 3 prints them. Its checkpoints at steps 25/50/75 are NOT_TYPED (fig3.py evaluates the final one).
    PaperTable("arena", "table10", "Ablation of the bonus reward (HotpotQA)",
               "003_5246a32dcbbd2702.txt lines 321-329", _cols("HotpotQA", "em f1 arena_format arena_relevance"), (
        ("ARENA-7B-nobonus (step 95)", QWEN7, (60.4, 74.5, 86.0, 13.6)),
    )),
    # 004_7581ae3297a71a16.txt lines 213-231, "Table 1. Performance comparison of SmartSearch and existing
    # approaches on four knowledge-intensive benchmarks"; Qwen2.5-3B-Instruct for every row (§5.1 Implementation
    # Details). The "(↑n%)" improvements after SmartSearch's cells dropped.
    PaperTable("smartsearch", "table1", "Performance on four knowledge-intensive benchmarks",
               "004_7581ae3297a71a16.txt lines 213-231", _SS_COLS, (
        ("Direct Inference", QWEN3, (19.3, 24.7, 14.6, 24.5, 4.0, 11.6, 2.3, 7.9, 10.1, 17.2)),
        ("CoT", QWEN3, (18.1, 24.9, 12.8, 24.0, 14.4, 25.5, 2.2, 7.8, 11.9, 20.6)),
        ("RAG", QWEN3, (22.5, 31.4, 24.3, 36.7, 7.2, 17.2, 4.5, 12.2, 14.6, 24.4)),
        ("Search-o1", QWEN3, (20.9, 29.4, 22.0, 33.6, 28.8, 36.1, 5.1, 12.6, 19.2, 27.9)),
        ("ReasonRag", QWEN3, (36.5, 43.2, 32.2, 41.7, 30.4, 39.1, 11.3, 18.6, 27.6, 35.7)),
        ("SmartSearch (Ours)", QWEN3, (45.3, 52.3, 40.7, 52.4, 44.8, 56.1, 19.1, 27.8, 37.5, 47.2)),
    )),
    # 004 lines 260-274, "Table 3. Ablation study results for the two core mechanisms in SmartSearch across all
    # three stages of curriculum learning" (Stage 1 SFT, Stage 2 DPO, Stage 3 GRPO: §4).
    PaperTable("smartsearch", "table3", "Ablation of process rewards and query refinement per curriculum stage",
               "004_7581ae3297a71a16.txt lines 260-274", _SS_COLS, (
        ("Stage 1 / SmartSearch", QWEN3, (38.2, 45.3, 35.3, 45.5, 38.4, 51.0, 14.7, 21.6, 31.7, 40.9)),
        ("Stage 1 / w/o process rewards", QWEN3, (33.8, 40.6, 32.5, 42.8, 36.0, 48.7, 12.6, 20.8, 28.7, 38.2)),
        ("Stage 2 / SmartSearch", QWEN3, (41.4, 48.7, 37.9, 48.5, 39.2, 51.8, 15.4, 23.6, 33.5, 43.2)),
        ("Stage 2 / w/o process rewards", QWEN3, (40.2, 47.4, 36.5, 47.2, 37.6, 50.1, 14.4, 22.3, 32.2, 41.8)),
        ("Stage 2 / w/o query refinement", QWEN3, (39.2, 46.7, 35.6, 46.1, 36.0, 49.6, 14.6, 22.9, 31.4, 41.3)),
        ("Stage 3 / SmartSearch", QWEN3, (45.3, 52.3, 40.7, 52.4, 44.8, 56.1, 19.1, 27.8, 37.5, 47.2)),
        ("Stage 3 / w/o process rewards", QWEN3, (43.3, 50.6, 40.0, 51.5, 39.2, 51.6, 17.9, 26.7, 35.1, 45.1)),
        ("Stage 3 / w/o query refinement", QWEN3, (44.1, 51.2, 39.9, 51.6, 41.6, 54.2, 17.5, 26.4, 35.8, 45.9)),
        ("Stage 3 / Standard GRPO", QWEN3, (43.6, 50.8, 39.0, 50.6, 40.8, 52.5, 15.9, 24.8, 34.8, 44.7)),
    )),
)

# Every typed-in row label -> jaxrag's method name: the one place where the papers' names meet jaxrag's.
_RG_AGENTS = {"Direct": "direct", "CoT": "cot", "RAG": "rag", "ReAct": "react", "Search-o1": "search_o1",
              "Re²Search": "re2search"}
_RG_TUNING = dict(zip(_RG_SECTIONS, ("", "+sft", "+dpo", "+ppo")))
METHODS: dict[tuple[str, str, str], str] = {
    **{("rag_gym", "table2", f"{s} / {label}"): agent + _RG_TUNING[s]
       for s in _RG_SECTIONS for label, agent in _RG_AGENTS.items()},
    **{("rag_gym", "table3", f"{llm} / {label}"): method for llm in ("Llama-3.1-8B", "Qwen-2.5-7B")
       for label, method in (("ReAct", "react"), ("Search-o1", "search_o1"), ("Re²Search++", "re2search+dpo+critic"))},
    ("rag_gym", "table4", "ORM"): "re2search+orm",
    ("rag_gym", "table4", "PRM (Random)"): "re2search+critic-random",
    ("rag_gym", "table4", "PRM (Rollout)"): "re2search+critic-rollout",
    ("rag_gym", "table4", "PRM (Llama)"): "re2search+critic-llama",
    ("rag_gym", "table4", "PRM (GPT)"): "re2search+critic",
    ("reasonrag", "table2", "Zero-shot / Naïve Generation"): "direct",
    ("reasonrag", "table2", "Zero-shot / Standard RAG"): "rag",
    ("reasonrag", "table2", "Reasoning / Search-o1"): "search_o1",
    ("reasonrag", "table2", "Reasoning / ReasonRAG(5k)"): "reasonrag+dpo",
    ("reasonrag", "table3", "ReasonRAG (Base)"): "reasonrag",
    ("reasonrag", "table3", "ReasonRAG (SFT)"): "reasonrag+sft",
    ("reasonrag", "table3", "ReasonRAG (RL-ORL): 5k queries"): "reasonrag+orl-5k",
    ("reasonrag", "table3", "ReasonRAG (RL-ORL): 10k queries"): "reasonrag+orl-10k",
    ("reasonrag", "table3", "ReasonRAG (RL-PRL)"): "reasonrag+dpo",
    ("arena", "table2", "Llama3.1-8B-Instruct"): "arena",
    ("arena", "table2", "Qwen2.5-7B-Instruct"): "arena",
    ("arena", "table2", "ARENA-Llama3.1-8B"): "arena+grpo",
    ("arena", "table2", "ARENA-Qwen2.5-7B"): "arena+grpo",
    ("arena", "table3", "Qwen2.5-7B-Instruct"): "arena",
    ("arena", "table3", "ARENA-7B"): "arena+grpo",
    ("arena", "table10", "ARENA-7B-nobonus (step 95)"): "arena+grpo-no_bonus",
    ("smartsearch", "table1", "Direct Inference"): "direct",
    ("smartsearch", "table1", "CoT"): "cot",
    ("smartsearch", "table1", "RAG"): "rag",
    ("smartsearch", "table1", "Search-o1"): "search_o1",
    ("smartsearch", "table1", "ReasonRag"): "reasonrag+dpo",
    ("smartsearch", "table1", "SmartSearch (Ours)"): "smartsearch+sft+dpo+grpo",
    ("smartsearch", "table3", "Stage 1 / SmartSearch"): "smartsearch+sft",
    ("smartsearch", "table3", "Stage 1 / w/o process rewards"): "smartsearch+sft-no_process_reward",
    ("smartsearch", "table3", "Stage 2 / SmartSearch"): "smartsearch+sft+dpo",
    ("smartsearch", "table3", "Stage 2 / w/o process rewards"): "smartsearch+sft+dpo-no_process_reward",
    ("smartsearch", "table3", "Stage 2 / w/o query refinement"): "smartsearch+sft+dpo-no_refinement",
    ("smartsearch", "table3", "Stage 3 / SmartSearch"): "smartsearch+sft+dpo+grpo",
    ("smartsearch", "table3", "Stage 3 / w/o process rewards"): "smartsearch+sft+dpo+grpo-no_process_reward",
    ("smartsearch", "table3", "Stage 3 / w/o query refinement"): "smartsearch+sft+dpo+grpo-no_refinement",
    ("smartsearch", "table3", "Stage 3 / Standard GRPO"): "smartsearch+sft+dpo+grpo-standard",
}

# Printed values not typed in (None above), and why.
LEFT_OUT: tuple[tuple[str, str, str, str, str], ...] = (
    ("rag_gym", "table2", "RAG-Gym Proximal Policy Optimization / RAG", "Average f1",
     "printed 41.44, but its HotpotQA/2Wiki/Bamboogle F1 and MedQA Acc average to 48.04 (a misprint?)"),
)

# Printed rows not typed in: methods jaxrag does not implement (or, where said, whose setting the paper leaves open).
NOT_TYPED: dict[tuple[str, str], tuple[str, ...]] = {
    ("rag_gym", "table3"): ("Llama-3.1-8B / R1-Searcher", "Qwen-2.5-7B / Search-R1", "Qwen-2.5-7B / R1-Searcher"),
    ("reasonrag", "table2"): ("FLARE", "Self-RAG(146k)", "AdaptiveRAG(3k)", "Iter-Retgen", "IRCoT", "RECOMP",
                              "LongLLMLingua", "Selective-Context", "AutoRAG(10k)", "Search-R1(90k)"),
    ("arena", "table2"): ("DeepSeek-R1-Distill-Qwen-7B", "Qwen3-8B", "SuRe-GPT-4o", "SuRe-Qwen-7B", "self-ask-GPT-4o",
                          "Qwen-7B-SFT-direct", "Qwen-7B-SFT-reasoning", "SimpleDeepSearcher-7B",
                          "Naive-GRPO (its backbone is not stated)", "R1-Searcher-7B", "Search-R1-7B",
                          "ZeroSearch-7B", "ReSearch-7B"),
    ("arena", "table10"): ("ARENA-7B-nobonus_checkpoint-25", "ARENA-7B-nobonus_checkpoint-50",
                           "ARENA-7B-nobonus_checkpoint-75"),
    ("smartsearch", "table1"): ("IRCoT", "ReSearch", "ZeroSearch", "R1-Searcher", "Search-R1", "PPR", "StepSearch"),
}

_METHOD = re.compile(r"^(?P<agent>[a-z0-9_]+)(?P<tunings>(\+[a-z]+)*)(-(?P<variant>[a-z0-9_]+))?$")


def is_known_method(name: str) -> bool:
    """`agent`, `agent+tuning[+tuning...]`, each optionally `-variant`: agent in AGENTS, tunings in TUNINGS."""
    m = _METHOD.match(name)
    if not m or m["agent"] not in AGENTS:
        return False
    return all(t in TUNINGS for t in m["tunings"].split("+")[1:])


def _entries() -> tuple[Entry, ...]:
    out = []
    for t in TABLES:
        for label, model, values in t.rows:
            if len(values) != len(t.columns):
                raise ValueError(f"{t.paper} {t.table} {label!r}: {len(values)} values for {len(t.columns)} columns")
            method = METHODS[(t.paper, t.table, label)]
            out += [Entry(t.paper, t.table, label, method, model, d, m, v, t.where)
                    for (d, m), v in zip(t.columns, values) if v is not None]
    return tuple(out)


PUBLISHED: tuple[Entry, ...] = _entries()
TABLE_INFO: dict[tuple[str, str], PaperTable] = {(t.paper, t.table): t for t in TABLES}
