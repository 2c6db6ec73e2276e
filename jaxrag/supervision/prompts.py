"""The papers' judge prompts, verbatim, and a parser for each judge reply (parsers never raise).

- rank         RAG-Gym (001 App. H Fig. 10) as sent by the released code (rag_gym/rewards/lm_rerank.py): the
               first sentence is the system message, the rest the user message with markdown headers; the
               history is JSON `[{"query", "documents": [{"id", "title", "content"}]}]` (or `{"query", "answer"}`
               with summaries, as the code's qa_cache); actions `[i] Query: q` / `[i] Answer: a`; the reply
               ```json{"ranked_indices": [...]}```; reward 1/(1+rank).
- step_score   ReasonRAG (002 App. F Fig. 14), system prompt; the user message as the released code builds it
               (pipeline/reasonrag_pipeline.py evaluate_thoughts): `Question: {q}\\nGolden Answer: {g1 or g2}
               \\nAgent Reasoning Process: {thoughts joined by spaces}`. Paper: a score in [0, 1]; code: [0, 100]
               divided by 100 (variant "paper" | "code"); the reply ends "So the score is [Score]" (the code
               reads the last number).
- usefulness   SmartSearch (004 App. A "Prompt for scoring"): one user message; reply `<answer> 0|1 </answer>
               <explanation> ... </explanation>`. Variant "paper" = App. A's words; "code" = the released
               scripts/data_construction/process_reward.py text (adds "and actionable" and emphasis).
- refine       SmartSearch (004 App. A "Prompt for Refining"); reply `<search> q </search> <explanation> ...`.

Every `*_messages` function returns OpenAI chat messages; every `parse_*` returns a `Parsed` whose `failure`
says why a reply is unusable (missing block, not a permutation, out of range ...), with the reply kept by the
caller. Invalid candidate actions are never shown to a judge (judges.py scores them 0 / ranks them last).
"""

from __future__ import annotations

import ast
import dataclasses
import json
import re
from typing import Sequence

from jaxrag.env.mdp import QUERY, Action, Doc, Step
from jaxrag.env.parsing import canon, find_tag, loads_lenient

VARIANTS = ("paper", "code")
RANK_PARSE = ("strict", "lenient")

# ---------------------------------------------------------------------------------------------- RAG-Gym rank
RANK_SYSTEM = (
    "You are a decision-evaluation assistant. Your task is to rank the proposed actions from the most appropriate "
    "to the least appropriate as the next step in a sequential decision-making process aimed at solving a given "
    "question."
)
RANK_USER = """## Original Question:
{question}

## Information-Seeking History:
{curr_history}

## Proposed Next Actions:
{actions_text}

### Important Assumption
The agent has no prior knowledge about the subject matter. It must rely solely on the information-seeking history provided to evaluate and answer the original question. Assumptions not explicitly supported by the history must not influence the ranking of proposed actions.

### Evaluation Criteria for Appropriateness

1. **Sufficiency Check**:
- Determine whether the available information is sufficient to directly answer the original question. If not, the proposed action to "Answer" is inappropriate.
- Prioritize queries that gather specific, missing information essential to solving the question.
- If the history already contains all necessary information, then "Answer" is the most appropriate action, and the correct answer should be ranked highest.

2. **Utility Check**:
- Queries must be precise, actionable, and directly relevant to solving the question.
- Prioritize foundational queries that establish critical context or general knowledge necessary for more specific follow-ups.
- Rank overly narrow or prematurely specific queries lower if they presume knowledge not yet available.
- Avoid irrelevant queries that do not contribute to solving the original question.

3. **Redundancy Check**:
- Queries that duplicate information already covered in the history or repeat previous queries should be ranked lower.
- Proposed actions must add new value to the decision-making process by seeking new or clarifying missing information.

### Expected Output Format
- Output the indices of the ranked actions in JSON format: ```json{{"ranked_indices": [list of indices]}}```.
- Rank actions from most appropriate to least appropriate based on the evaluation criteria above.
- Do not provide additional explanations or reasoning."""

# ------------------------------------------------------------------------------------ ReasonRAG step score
STEP_SCORE_SYSTEM = {
    # 002 Fig. 14
    "paper": (
        "An agent is tasked with answering a question using a retrieval tool. Critically assess its intermediate "
        "reasoning process to determine if it leads to the correct answer. Identify all flaws, inconsistencies, and "
        "mistakes in the thought process. Every imperfection, no matter how small, must be acknowledged. Evaluate "
        "how effectively the reasoning supports the final answer and the overall accuracy of the response. Ensure "
        "the evaluation is extremely harsh, leaving no leniency. Even if the answer seems close to correct, do not "
        "award full marks to maintain strict grading standards. Assign a score between [0, 1] based on the "
        "severity of flaws and the reasoning’s accuracy in leading to the golden answer. Respond briefly and "
        "conclude with: So the score is [Score]."
    ),
    # released code (EVALUATION_PROMPT), its line breaks and indentation kept
    "code": """An agent is tasked with answering a question using a retrieval tool. 
    Critically assess its intermediate reasoning process to determine if it leads to the correct answer. 
    Identify all flaws, inconsistencies, and mistakes in the thought process. 
    Every imperfection, no matter how small, must be acknowledged. 
    Evaluate how effectively the reasoning supports the final answer and the overall accuracy of the response. 
    Ensure the evaluation is extremely harsh, leaving no leniency. 
    Even if the answer seems close to correct, do not award full marks to maintain strict grading standards. 
    Assign a score between [0, 100] based on the severity of flaws and the reasoning\u2019s accuracy in leading to the golden answer.
Respond briefly and conclude with: So the score is [Score].
""",
}
STEP_SCORE_SCALE = {"paper": 1.0, "code": 100.0}

# ------------------------------------------------------------------------------------- SmartSearch (App. A)
USEFULNESS_USER = {
    "paper": """You are a query-evaluation assistant. Your task is to assess the quality of a search agent’s query of the current search round according to the user’s question, the golden answer and the agent’s search process up to the current search round.

If the agent’s query intent of the current search round is necessary , and the corresponding query result includes the answer for the query, the score for query should be 1. Otherwise, the score for the query should be 0. The details of the assessment are in the Evaluation Guideline, please read it carefully.

### User’s question
{question}

### Golden answer
{answer}

### Agent’s search process up to the current search round
{context}

### Evaluation Guideline
1. Identify the agent’s query intent of the current search round accurately.
2. The query result doesn’t need to solve the user’s question directly; but it must include the information that address the agent’s query intent completely, related entities alone is not enough.
3. The intended entity and the one found in the query result must be exactly the same, otherwise, the score should be 0.

### Output Format:
<answer> score for the query </answer>
<explanation> explanation for the score </explanation>""",
    "code": """You are a query-evaluation assistant. Your task is to assess the quality of a search agent's query of the current search round according to the user's question, the golden answer and the agent's search process up to the current search round.

If the agent's query intent of the current search round is necessary and actionable, and the corresponding query result includes the answer for the query, the score for query should be 1. Otherwise, the score for the query should be 0. The details of the assessment are in the Evaluation Guideline, please read it carefully.

### User's question
{question}

### Golden answer
{answer}

### Agent's search process up to the current search round
{context}

### Evaluation Guideline
1. Identify the agent's query intent of the current search round accurately (**last round** in the agent's search process up to the current search round).
2. The query result **doesn't need to solve the user's question directly**; but it must include the information that address the agent's query intent completely (check/seek for information), related entities alone is not enough.
3. The intended entity and the one found in the query result **must be exactly the same (don't assume typos or other excuses)**, otherwise, the score should be 0.

### Output Format:
<answer> score for the query </answer>
<explanation> explanation for the score </explanation>""",
}
REFINE_USER = {
    "paper": """You are a query-refine assistant. Your task is to refine a search agent’s query of the current search round within <search> </search> according to the user’s question, the agent’s search process up to the current search round and the issues of the query.

The details of the refinement are in the Refine Guideline, please read it carefully.

### User’s question
{question}

### Agent’s search process up to the current search round
{context}

### Issues of the query
{explanation}

### Refine Guideline
1. The refined query is meant to replace the query of the current round, so don’t rely on any query result within <result> </result> from the current round when refining the query.
2. If the issues of the query indicate that the query intent is unreasonable, the refined query should serve for a more necessary and actionable query intent.
3. The refined query can be expressed as a complete semantic question or a keyphrase-based query, and you may add or remove information from the original query. All depends on which option best serves the agent’s query intent, ensuring that the query result contains the answer to the agent’s query intent.

### Output format:
<search> refined query </search>
<explanation> explanation for the refined query </explanation>""",
    "code": """You are a query-refine assistant. Your task is to refine a search agent's query of the current search round within <search> </search> according to the user's question, the agent's search process up to the current search round and the issues of the query.

The details of the refinement are in the Refine Guideline, please read it carefully.

### User's question
{question}

### Agent's search process up to the current search round
{context}

### Issues of the query
{explanation}

### Refine Guideline
1. The refined query is meant to replace the query of the current round, so **don't rely on any query result within <result> </result> from the current round** when refining the query.
2. If the issues of the query indicate that the query intent is unreasonable, the refined query should **serve for a more necessary and actionable query intent**.
3. The refined query can be expressed as **a complete semantic question or a keyphrase-based query**, and you may **add or remove information from the original query**. All depends on which option best serves the agent's query intent, ensuring that the query result contains the answer to the agent's query intent (not the user's question).

### Output format:
<search> refined query </search>
<explanation> explanation for the refined query </explanation>
""",
}
# SmartSearch code (query_refinement.py): appended to the judge's explanation when the novelty check fails.
REDUNDANT_EXPLANATION = (" The agent's query of the current search round is redundant, meaning that the query "
                         "result duplicates information from previous search rounds.")


@dataclasses.dataclass(frozen=True)
class PromptOptions:
    """How judge prompts are filled: paper vs released-code variants, and document clipping."""

    step_score_variant: str = "paper"  # "paper": [0, 1] | "code": [0, 100] / 100
    smartsearch_variant: str = "paper"  # "paper": 004 App. A | "code": process_reward.py / query_refinement.py
    max_docs: int | None = None  # documents per search shown to the judge (None: all; RAG-Gym shows all k)
    max_doc_chars: int | None = None  # per document (None: whole)
    rank_parse: str = "strict"  # "strict": RAG-Gym's lm_rerank.py reading | "lenient": any JSON object (parse_rank)

    def __post_init__(self):
        for key in ("step_score_variant", "smartsearch_variant"):
            if getattr(self, key) not in VARIANTS:
                raise ValueError(f"PromptOptions.{key}={getattr(self, key)!r}: choose one of {VARIANTS}")
        if self.rank_parse not in RANK_PARSE:
            raise ValueError(f"PromptOptions.rank_parse={self.rank_parse!r}: choose one of {RANK_PARSE}")


@dataclasses.dataclass
class Parsed:
    """A judge reply read: scores (step_score/usefulness: one), ranks (rank), text (refine), or a failure."""

    scores: list[float] | None = None
    ranks: list[int] | None = None
    text: str | None = None
    rationale: str = ""
    failure: str = ""

    @property
    def ok(self) -> bool:
        return not self.failure


# ------------------------------------------------------------------------------------------------ rendering
def _docs(docs: Sequence[Doc], opts: PromptOptions) -> list[Doc]:
    return list(docs if opts.max_docs is None else docs[: opts.max_docs])


def _clip(text: str, opts: PromptOptions) -> str:
    if opts.max_doc_chars is None or len(text) <= opts.max_doc_chars:
        return text
    return text[: opts.max_doc_chars].rstrip() + " ..."


def action_line(action: Action) -> str:
    """RAG-Gym's rendering of a candidate: `Query: q` or `Answer: a`."""
    return f"Query: {action.text}" if action.kind == QUERY else f"Answer: {action.text}"


def rank_history(history: Sequence[Step], opts: PromptOptions = PromptOptions()) -> str:
    """The executed searches as RAG-Gym's JSON (indent 2): documents, or the summary as `answer` when the agent
    summarizes (Search-o1 / Re²Search qa_cache)."""
    rows = []
    for s in history:
        if s.action.kind != QUERY:
            continue
        if s.summary is not None:
            rows.append({"query": s.action.text, "answer": s.summary})
        else:
            rows.append({"query": s.action.text, "documents": [
                {"id": d.doc_id, "title": d.title, "content": _clip(d.text, opts)} for d in _docs(s.docs, opts)]})
    return json.dumps(rows, indent=2, ensure_ascii=False)


def rank_messages(question: str, history: Sequence[Step], candidates: Sequence[Action],
                  opts: PromptOptions = PromptOptions()) -> list[dict]:
    actions_text = "\n".join(f"[{i}] {action_line(a)}" for i, a in enumerate(candidates))
    user = RANK_USER.format(question=question, curr_history=rank_history(history, opts), actions_text=actions_text)
    return [{"role": "system", "content": RANK_SYSTEM}, {"role": "user", "content": user}]


def _thought(step: Step, opts: PromptOptions) -> list[str]:
    """ReasonRAG thoughts of one executed step: the generated text, then the grounding output (evidence), or,
    for designs without grounding, the documents in ReasonRAG's reference format."""
    a = step.action
    if a.raw.strip():
        out = [canon(a.raw)]
    elif a.kind == QUERY:
        out = [f"So the next query is <query>{a.text}</query>"]
    else:
        out = [f"So the answer is <answer>{a.text}</answer>"]
    if a.kind == QUERY:
        if step.summary_raw.strip():
            out.append(canon(step.summary_raw))
        elif step.summary is not None:
            out.append(f"<evidence>{step.summary}</evidence>")
        elif step.docs:
            out.append(" ".join(f"Wikipedia Title: {d.title}\n{_clip(d.text, opts)}" for d in _docs(step.docs, opts)))
    return out


def step_score_messages(question: str, gold: Sequence[str], history: Sequence[Step], judged: Step,
                        opts: PromptOptions = PromptOptions()) -> list[dict]:
    """ReasonRAG process evaluation of the node reached by the `judged` step after `history` (its evidence or
    documents are shown when the step was executed; a candidate not yet executed shows its text only)."""
    thoughts = [t for s in (*history, judged) for t in _thought(s, opts)]
    user = (f"Question: {question}\nGolden Answer: " + " or ".join(gold) + "\nAgent Reasoning Process: "
            + " ".join(thoughts))
    return [{"role": "system", "content": STEP_SCORE_SYSTEM[opts.step_score_variant]},
            {"role": "user", "content": user}]


def search_process(history: Sequence[Step], current: Action | None = None, current_docs: Sequence[Doc] = (),
                   opts: PromptOptions = PromptOptions()) -> str:
    """SmartSearch's transcript up to (and including) the current round: `<think>..</think> <search> q </search>`
    then `<result>` with one `"title" text` line per document."""
    rounds = [(s.action, s.docs) for s in history if s.action.kind == QUERY]
    if current is not None:
        rounds.append((current, list(current_docs)))
    out = []
    for a, docs in rounds:
        think = a.extra.get("think") or a.extra.get("reasoning")
        head = f"<think> {think} </think>\n" if think else ""
        result = "\n".join(f'"{d.title}" {_clip(d.text, opts)}' for d in _docs(docs, opts))
        out.append(f"{head}<search> {a.text} </search>\n<result>\n{result}\n</result>")
    return "\n".join(out)


def usefulness_messages(question: str, gold: Sequence[str], history: Sequence[Step], judged: Step,
                        opts: PromptOptions = PromptOptions()) -> list[dict]:
    """SmartSearch usefulness of the `judged` search step (its query and the documents it retrieved) after
    `history`. The golden answer is the first gold (the released code uses golden_answers[0])."""
    context = search_process(history, judged.action, judged.docs, opts)
    user = USEFULNESS_USER[opts.smartsearch_variant].format(question=question, answer=gold[0] if gold else "",
                                                            context=context)
    return [{"role": "user", "content": user}]


def refine_messages(question: str, history: Sequence[Step], judged: Step, explanation: str,
                    opts: PromptOptions = PromptOptions()) -> list[dict]:
    """SmartSearch refinement of the `judged` search step's query, given why it was judged bad."""
    context = search_process(history, judged.action, judged.docs, opts)
    user = REFINE_USER[opts.smartsearch_variant].format(question=question, context=context, explanation=explanation)
    return [{"role": "user", "content": user}]


# -------------------------------------------------------------------------------------------------- parsing
_JSON_FENCE = re.compile(r"```json\s*(\{.*?\})\s*`?", re.S)


def parse_rank(reply: str, n: int, mode: str = "strict") -> Parsed:
    """A ranking reply -> ranks (0 = best) and scores 1/(1+rank) of the n actions, or a failure (no scores: the
    state's candidates then take part in no pair, as the released code's all-zero rewards take part in none).

    strict (RAG-Gym's lm_rerank.py, the default): only the first ```json{...}``` block counts (the object up to its
    first closing brace), read as a Python literal; action i's rank is the first position of i in its
    "ranked_indices" (extra or repeated entries are allowed, a missing action is a failure).
    lenient: the fenced object or else any JSON object in the reply; the list must be a permutation of 0..n-1."""
    if mode == "strict":
        return _parse_rank_strict(reply or "", n)
    if mode != "lenient":
        raise ValueError(f"parse_rank mode={mode!r}: choose one of {RANK_PARSE}")
    return _parse_rank_lenient(reply or "", n)


def _parse_rank_strict(text: str, n: int) -> Parsed:
    m = _JSON_FENCE.search(text)
    if m is None:
        return Parsed(failure='no ```json{"ranked_indices": [...]}``` block in the reply')
    try:
        obj = ast.literal_eval(m.group(1))
        idx = obj["ranked_indices"]
        ranks = [idx.index(i) for i in range(n)]
    except (ValueError, SyntaxError, TypeError, KeyError, AttributeError, MemoryError, RecursionError) as e:
        return Parsed(failure=f"the fenced ranking cannot be read ({type(e).__name__}: {str(e)[:80]})")
    return Parsed(scores=[1.0 / (1 + r) for r in ranks], ranks=ranks)


def _parse_rank_lenient(text: str, n: int) -> Parsed:
    m = _JSON_FENCE.search(text)
    obj = loads_lenient(m.group(1)) if m else None
    if obj is None or "ranked_indices" not in obj:
        obj = loads_lenient(text)
    if not isinstance(obj, dict) or "ranked_indices" not in obj:
        return Parsed(failure='no {"ranked_indices": [...]} object in the reply')
    idx = obj["ranked_indices"]
    if not isinstance(idx, list):
        return Parsed(failure=f"ranked_indices is {type(idx).__name__}, not a list")
    try:
        order = [int(x) for x in idx]
    except (TypeError, ValueError):
        return Parsed(failure=f"ranked_indices holds non-integers: {idx!r}")
    if any(isinstance(x, float) and not float(x).is_integer() for x in idx) or any(isinstance(x, bool) for x in idx):
        return Parsed(failure=f"ranked_indices holds non-integers: {idx!r}")
    bad = [i for i in order if not 0 <= i < n]
    if bad:
        return Parsed(failure=f"ranked_indices out of range 0..{n - 1}: {bad}")
    if len(set(order)) != len(order):
        return Parsed(failure=f"ranked_indices repeats an index: {order}")
    if len(order) != n:
        return Parsed(failure=f"ranked_indices misses {sorted(set(range(n)) - set(order))} of {n} actions")
    ranks = [0] * n
    for r, i in enumerate(order):
        ranks[i] = r
    return Parsed(scores=[1.0 / (1 + r) for r in ranks], ranks=ranks)


_NUMBER = re.compile(r"[+-]?\d+(?:\.\d+)?")
_SCORE_IS = re.compile(r"score\s+is\s*[:\[\(]*\s*([+-]?\d+(?:\.\d+)?)", re.I)


def parse_step_score(reply: str, variant: str = "paper") -> Parsed:
    """"So the score is X" (else the last number, as the code's extract_last_number) / scale -> [0, 1]."""
    text = reply or ""
    hits = _SCORE_IS.findall(text)
    raw = hits[-1] if hits else (_NUMBER.findall(text) or [None])[-1]
    if raw is None:
        return Parsed(failure="no score in the reply")
    scale = STEP_SCORE_SCALE[variant]
    value = float(raw) / scale
    if not 0.0 <= value <= 1.0:
        return Parsed(failure=f"score {raw} out of range [0, {scale:g}]")
    return Parsed(scores=[value], rationale=text.strip())


def parse_usefulness(reply: str) -> Parsed:
    """`<answer> 0|1 </answer>` (+ `<explanation>`): S_useful and its explanation."""
    text = reply or ""
    ans = find_tag(text, "answer", last=False)
    if ans is None:
        return Parsed(failure="no <answer> score </answer> in the reply")
    explanation = find_tag(text, "explanation") or ""
    try:
        value = float(ans)
    except ValueError:
        return Parsed(failure=f"score {ans!r} is not a number")
    if value not in (0.0, 1.0):
        return Parsed(failure=f"score {ans} out of range (0 or 1)")
    return Parsed(scores=[value], rationale=explanation)


def parse_refine(reply: str) -> Parsed:
    """`<search> refined query </search>` (a missing closing tag tolerated: the sampler stops on it)."""
    text = reply or ""
    q = find_tag(text, "search", last=False)
    if not q:
        return Parsed(failure="no <search> refined query </search> in the reply")
    return Parsed(text=q, rationale=find_tag(text, "explanation") or "")
