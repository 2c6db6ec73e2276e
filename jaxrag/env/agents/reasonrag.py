"""ReasonRAG (002 App. F): a Reasoning stage ends in <query>…</query> or <answer>…</answer>; after a query
the Grounding stage extracts <evidence>…</evidence> from its documents; an answer is Terminal.
The prompt continues the assistant's own transcript (query, evidence, query, evidence, ...)."""
import dataclasses
import re
from typing import Sequence

from jaxrag.env.agents import base
from jaxrag.env.mdp import ANSWER, INVALID, QUERY, Action, Doc, State
from jaxrag.env.parsing import canon, find_marker, find_tag, tag_positions

REASONING_SYSTEM = """You are a question-answering assistant with access to a retrieval tool. Your goal is to provide a concise and accurate reasoning process.

Instructions:
* Error Reflection: If errors exist in previous thoughts, identify and correct them. Skip this step if no errors are present.
* Information Sufficiency: Evaluate whether the current information is sufficient to fully and accurately answer the question. If additional retrieval is needed, deconstruct the question and generate the next query. Avoid repeating previous queries. If no meaningful new query can be generated, explain why and provide an answer based on the current information.
* Conciseness: Ensure both queries and answers are concise, using nouns or short phrases whenever possible.
* Conclusion:
If generating an answer: "So the answer is <answer>{answer_format}</answer>". If more retrieval is needed: "So the next query is <query>query</query>"."""

GROUNDING_SYSTEM = """You are an information retrieval assistant. Your task is to extract relevant evidence from the provided Wikipedia documents based on the latest query.

Instructions:
* Identify key terms or concepts in the query.
* Search the documents for evidence that supports the query.
* Response format: If relevant evidence is found, output: Based on the query, the relevant evidence is <evidence>evidence</evidence>. If no relevant evidence is found, output: <evidence>None</evidence>."""

# The last allowed step (released pipeline/reasonrag_pipeline.py, ANSWER_GENERATION_PROMPT, used once
# `iteration_count >= max_iter - 1`), verbatim.
ANSWER_GENERATION_SYSTEM = """You are a reasoning assistant with retrieval. Give a precise and very concise final answer for the given question, conclude with 'So the answer is <answer>{answer_format}</answer>'. Keep your final answer brief and to the point, followed without any explanation.
"""

_LEADS = r"\s*(?:so\s+)?(?:the\s+)?(?:next\s+query\s+is|answer\s+is)\s*:?\s*$"


@dataclasses.dataclass
class ReasonRAG(base.Agent):
    name = "reasonrag"
    chat_stop = ("</query>", "</answer>")
    summarizes: bool = True     # the Grounding stage

    def transcript(self, state: State) -> str:
        return "".join(self.format_chat(s.action) + " " + self.format_summary(s.summary or "None") + " "
                       for s in state.searches)

    def render_chat(self, state: State) -> str:
        template = ANSWER_GENERATION_SYSTEM if self.must_answer_now(state) else REASONING_SYSTEM
        system = template.format(answer_format=("option letter" if state.choices else "short answer"))
        return self.chat(system, f"Question: {base.question_block(state)}", prefix=self.transcript(state))

    def parse_chat(self, text: str) -> Action:
        tags = tag_positions(text, ("query", "answer"))
        if not tags:
            return Action.invalid(text, "no <query> or <answer> tag")
        pos, tag = tags[-1]
        value = find_tag(text, tag)
        if not value:
            return Action.invalid(text, f"empty <{tag}>")
        reasoning = canon(re.sub(_LEADS, "", text[:pos], flags=re.I))
        return Action(QUERY if tag == "query" else ANSWER, value, text, {"reasoning": reasoning} if reasoning else {})

    def format_chat(self, action: Action) -> str:
        if action.kind == INVALID:
            return action.raw
        lead = "So the next query is <query>{}</query>" if action.kind == QUERY else "So the answer is <answer>{}</answer>"
        s = lead.format(action.text)
        return f"{action.extra['reasoning']} {s}" if action.extra.get("reasoning") else s

    # ---- Grounding stage ------------------------------------------------------------------------------
    def summary_prompt(self, state: State, query: str, docs: Sequence[Doc]) -> str:
        if self.mode == "plain":
            return (base.plain_question(state) + base.plain_history(state, self, summaries=True, summary_tag="evidence")
                    + f"search: {canon(query)}\n" + base.plain_docs(docs, self))
        user = (f"Question: {base.question_block(state)}\nQuery: {query}\n"
                f"Documents:\n{self.docs_block(docs) or '(no documents)'}")
        return self.chat(GROUNDING_SYSTEM, user)

    def parse_summary(self, text: str) -> str | None:
        if self.mode == "plain":
            hit = find_marker(text or "", ("evidence",))
            return hit[1] if hit else None
        return find_tag(text or "", "evidence") or None

    def format_summary(self, evidence: str) -> str:
        if self.mode == "plain":
            return f"evidence: {evidence}"
        if canon(evidence) == "None":
            return "<evidence>None</evidence>"
        return f"Based on the query, the relevant evidence is <evidence>{evidence}</evidence>"

    @property
    def summary_stop(self) -> tuple[str, ...]:
        return base.PLAIN_STOP if self.mode == "plain" else ("</evidence>",)

    def render_plain(self, state: State) -> str:
        return base.plain_question(state) + base.plain_history(state, self, summaries=True, summary_tag="evidence")


AGENT = ReasonRAG
