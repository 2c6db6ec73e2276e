"""ARENA (003 Table 1): one generation over the dataset's own numbered references, in three sections
<relevance>[ids]</relevance><analysis>…</analysis><answer>…</answer>.

Where generation stops (`stop_at`): "eos" (the default, the released code: its GRPO trainer's and its inference's
vLLM sampling has no stop string, so a reply runs to the end-of-sequence token or the token limit, and text after
</answer> is scored by the reward: format 0 when on the same line) or "answer" (a stop at </answer>: no text after
it is ever sampled, and the end-of-sequence token after it is never trained)."""
import dataclasses
import re

from jaxrag.env.agents import base
from jaxrag.env.mdp import ANSWER, INVALID, Action, State
from jaxrag.env.parsing import canon, find_tag

SYSTEM = """A conversation between User and Assistant. The user asks a question and gives some references. The assistant should answer the question based on the references.
User's input will always contain:
<question>[ the question to answer ]</question>
<references>[ references starting with numbers ]</references>
Assistant's response must contain EXACTLY three sections:
<relevance> [list ONLY reference numbers that provide useful information in square brackets, e.g. [1,5]]</relevance>
<analysis>[ combine information from relevant references to build the answer. Explicitly mention which references support each claim ]</analysis>
<answer>[ answer with ONLY a short phrase or single word. no explanations ]</answer>"""

# chat-mode stop strings per `stop_at` (the model's end-of-sequence ids always stop the sampler)
STOP_AT = {"eos": (), "answer": ("</answer>",)}


@dataclasses.dataclass
class Arena(base.Agent):
    name = "arena"
    uses_references = True
    stop_at: str = "eos"   # "eos" (released: no stop string) | "answer" (stop at </answer>)

    def __post_init__(self):
        super().__post_init__()
        if self.stop_at not in STOP_AT:
            raise ValueError(f"{self.name}: stop_at must be one of {', '.join(map(repr, STOP_AT))}, "
                             f"got {self.stop_at!r}")

    @property
    def chat_stop(self) -> tuple[str, ...]:
        return STOP_AT[self.stop_at]

    def references_block(self, state: State) -> str:
        return "\n".join(f"{i}. {d.title}: {self.clip(d.text)}" for i, d in enumerate(state.references, 1))

    def render_chat(self, state: State) -> str:
        user = (f"<question>{base.question_block(state)}</question>\n"
                f"<references>\n{self.references_block(state)}\n</references>")
        return self.chat(SYSTEM, user)

    def shorter_views(self, state: State) -> list[State]:
        """Over budget: drop references from the end (the others keep their numbers). ARENA answers in one
        generation, so it has no last-step variant."""
        refs = tuple(state.references)
        return [dataclasses.replace(state, references=refs[:n]) for n in range(len(refs) - 1, -1, -1)]

    def render_plain(self, state: State) -> str:
        return base.plain_question(state) + "".join(
            f"doc {i}: {canon(d.title)}: {self.clip(d.text)}\n" for i, d in enumerate(state.references, 1))

    def parse_chat(self, text: str) -> Action:
        answer = find_tag(text, "answer")
        if not answer:
            return Action.invalid(text, "no <answer> section")
        extra = {}
        rel = find_tag(text, "relevance", last=False)
        if rel is not None:
            extra["relevance"] = [int(x) for x in re.findall(r"\d+", rel)][:64]
        analysis = find_tag(text, "analysis", last=False)
        if analysis is not None:
            extra["analysis"] = analysis
        return Action(ANSWER, answer, text, extra)

    def format_chat(self, action: Action) -> str:
        if action.kind == INVALID:
            return action.raw
        ids = ", ".join(str(i) for i in action.extra.get("relevance", []))
        return (f"<relevance>[{ids}]</relevance>\n<analysis>{action.extra.get('analysis', '')}</analysis>\n"
                f"<answer>{action.text}</answer>")

    # plain mode: the same three tags on one line (short prompt, no instructions)
    def parse_plain(self, text: str) -> Action:
        return self.parse_chat(text)

    def format_plain(self, action: Action) -> str:
        return self.format_chat(action).replace("\n", "")


AGENT = Arena
