"""ARENA's Naive-GRPO baseline (003 §4.3, Fig. 3): the same one generation over the dataset's numbered references,
in the two sections of the original GRPO recipe, <think>…</think><answer>…</answer>, with no cited references.

The prompt is the released code's naive-GRPO template (src/data_generator.py, left there commented out), one user
message: the instructions, then **References** (numbered "1. text" lines, a single reference unnumbered, as that
code joins them) and **Question**. Its reward is "arena_naive" (jaxrag.supervision.arena_reward: format +
accuracy)."""
import dataclasses

from jaxrag.env.agents import base
from jaxrag.env.agents.arena import Arena
from jaxrag.env.mdp import ANSWER, INVALID, Action, State
from jaxrag.env.parsing import find_tag

TEMPLATE = """Answer the question based on the given information. Your response MUST strictly follow this format:

<think>
[Analyze the question and reason step-by-step. If references help, explain how the information is used. If references are irrelevant, clarify that and try to answer the question based on your knowledge.]
</think>
<answer>
[Answer with ONLY a short phrase or single word. No explanations.]
</answer>

**References**:
{references}

**Question**: 
{question}
"""


@dataclasses.dataclass
class ArenaNaive(Arena):
    name = "arena_naive"

    def references_block(self, state: State) -> str:
        texts = [f"{d.title}: {self.clip(d.text)}" for d in state.references]
        return texts[0] if len(texts) == 1 else "\n".join(f"{i}. {t}" for i, t in enumerate(texts, 1))

    def render_chat(self, state: State) -> str:
        user = TEMPLATE.format(references=self.references_block(state), question=base.question_block(state))
        messages = [{"role": "user", "content": user}]
        if self.tokenizer is not None and hasattr(self.tokenizer, "chat"):
            return self.tokenizer.chat(messages)
        return user + "\n"

    def parse_chat(self, text: str) -> Action:
        answer = find_tag(text, "answer")
        if not answer:
            return Action.invalid(text, "no <answer> section")
        think = find_tag(text, "think", last=False)
        return Action(ANSWER, answer, text, {"analysis": think} if think is not None else {})

    def format_chat(self, action: Action) -> str:
        if action.kind == INVALID:
            return action.raw
        return f"<think>\n{action.extra.get('analysis', '')}\n</think>\n<answer>\n{action.text}\n</answer>"

    def format_plain(self, action: Action) -> str:
        return self.format_chat(action).replace("\n", "")


AGENT = ArenaNaive
