"""SmartSearch (004 App. A): <think>…</think> then <search>q</search> (the environment appends
<result>…</result>) or <answer>… \\boxed{a} </answer>. The prompt continues the assistant's transcript.

The answer evaluation scores (`eval_answer`): "boxed" (the default) reads it as the released evaluation does
(active_pipeline.py: the last closed <answer> of the trajectory, its \\boxed{}; an unboxed answer is no answer:
jaxrag.env.parsing.code_eval_answer); "parsed" scores the agent's parse (the last <answer>'s \\boxed{}, else its
text). The reading changes what is scored, never the rollout."""
import dataclasses
import re

from jaxrag.env.agents import base
from jaxrag.env.mdp import ANSWER, INVALID, QUERY, Action, Episode, State
from jaxrag.env.parsing import canon, code_eval_answer, find_tag, tag_positions

SYSTEM = ("You are a helpful assistant that can solve the given question step by step with the help of the "
          "wikipedia search tool. Given a question, you need to first think about the reasoning process in the "
          "mind and then provide the answer. During thinking, you can invoke the wikipedia search tool to search "
          "for fact information about specific topics if needed. The reasoning process and answer are enclosed "
          "within <think> </think> and <answer> </answer> tags respectively, and the search query and result are "
          "enclosed within <search> </search> and <result> </result> tags respectively. For example, <think> This "
          "is the reasoning process. </think> <search> search query here </search> <result> search result here "
          "</result> <think> This is the reasoning process. </think> <answer> The final answer is \\boxed{answer "
          "here} </answer>. In the last part of the answer, the final exact answer is enclosed within \\boxed{} "
          "with latex format.")


def boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} (nested braces balanced; \\text{x} unwrapped; unclosed: to the end)."""
    i = text.rfind("\\boxed{")
    if i < 0:
        return None
    j, depth = i + len("\\boxed{"), 1
    k = j
    while k < len(text) and depth:
        depth += {"{": 1, "}": -1}.get(text[k], 0)
        k += 1
    body = text[j:k - 1] if depth == 0 else text[j:]
    body = re.sub(r"\\text\{([^{}]*)\}", r"\1", body)
    return canon(body)


@dataclasses.dataclass
class SmartSearch(base.Agent):
    name = "smartsearch"
    chat_stop = ("</search>", "</answer>")
    eval_answer: str = "boxed"   # "boxed" (released evaluation) | "parsed" (the agent's answer)

    def __post_init__(self):
        super().__post_init__()
        if self.eval_answer not in ("boxed", "parsed"):
            raise ValueError(f"smartsearch: eval_answer must be 'boxed' (the released evaluation) or 'parsed', "
                             f"got {self.eval_answer!r}")

    def scored_answer(self, episode: Episode) -> str | None:
        """"boxed": the released evaluation's prediction, read from the episode's generations (chat mode; the plain
        line format has no tags, so its parsed answer is scored); "parsed": the executed answer's text."""
        if self.eval_answer == "parsed" or self.mode == "plain":
            return episode.answer
        return code_eval_answer(generated_text(episode))

    def result_block(self, state_docs) -> str:
        return "\n".join(f'"{d.title}" {self.clip(d.text)}' for d in self.shown(state_docs))

    def render_chat(self, state: State) -> str:
        """The released code has no last-step prompt (it stops after 10 turns); with must_answer_prompt the
        user message ends with jaxrag's base.MUST_ANSWER_NOTE on the last allowed step."""
        transcript = "".join(f"{self.format_chat(s.action)}\n<result>\n{self.result_block(s.docs)}\n</result>\n"
                             for s in state.searches)
        user = f"Question: {base.question_block(state)}"
        if self.must_answer_now(state):
            user += f"\n\n{base.MUST_ANSWER_NOTE}"
        return self.chat(SYSTEM, user, prefix=transcript)

    def render_plain(self, state: State) -> str:
        out = [base.plain_question(state)]
        for s in state.searches:
            out.append(self.format_plain(s.action) + "\n")
            out.append("result: " + " | ".join(f"{canon(d.title)}: {self.clip(d.text)}" for d in self.shown(s.docs)) + "\n")
        return "".join(out)

    def parse_chat(self, text: str) -> Action:
        tags = tag_positions(text, ("search", "answer"))
        think = find_tag(text, "think")
        extra = {"think": think} if think else {}
        if tags:
            _, tag = tags[-1]
            body = find_tag(text, tag) or ""
            if tag == "search":
                return Action(QUERY, body, text, extra) if body else Action.invalid(text, "empty <search>")
            value = boxed(body)
            value = value if value else re.sub(r"^the final answer is\s*", "", body, flags=re.I)
            return Action(ANSWER, canon(value), text, extra) if canon(value) else Action.invalid(text, "empty <answer>")
        value = boxed(text)
        if value:
            return Action(ANSWER, value, text, extra)
        return Action.invalid(text, "no <search>, <answer> or \\boxed{}")

    def format_chat(self, action: Action) -> str:
        if action.kind == INVALID:
            return action.raw
        think = f"<think> {action.extra['think']} </think>\n" if action.extra.get("think") else ""
        if action.kind == QUERY:
            return f"{think}<search> {action.text} </search>"
        return f"{think}<answer> The final answer is \\boxed{{{action.text}}} </answer>"


def generated_text(episode: Episode) -> str:
    """The trajectory's generations in order, an empty <result> block after each search (the retrieved text is the
    environment's, not the model's: a tag inside a document is never read as the answer)."""
    return "".join(s.action.raw + ("\n<result>\n</result>\n" if s.action.kind == QUERY else "") for s in episode.steps)


AGENT = SmartSearch
