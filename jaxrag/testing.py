"""Stand-ins that implement jaxrag's protocols (sampling.policy.Policy, jaxrag.tokenizer.Tokenizer) without a trained
model: scripted / random / fixed-latency policies, a byte tokenizer and a tiny random JaxPolicy. The tests (through
tests/fakes.py, which adds the retrieval fakes) and the benches (benchmarks.rollout) use these same classes.
"""

from __future__ import annotations

import random
import time
from typing import Callable, Sequence

import jax

from jaxrag.env.mdp import INVALID
from jaxrag.models.config import ModelConfig
from jaxrag.models.transformer import init_params
from jaxrag.sampling import Completion, JaxPolicy
from jaxrag.supervision.judge_protocol import JudgeResult


def completion(text: str, finish_reason: str = "stop") -> Completion:
    ids = [ord(c) % 256 for c in text]
    return Completion(text, ids, [-0.5] * len(ids), finish_reason)


def cut_at_stop(text: str, stop: Sequence[str] | None) -> str:
    """What a sampler does with stop strings: keep the text up to and including the first stop string."""
    if not stop:
        return text
    hits = [(text.find(s), s) for s in stop if s and text.find(s) >= 0]
    if not hits:
        return text
    i, s = min(hits)
    return text[:i + len(s)]


class ScriptedPolicy:
    """Answers each prompt with respond(prompt, sample_index) (cut at the stop strings); records every call."""

    def __init__(self, respond: Callable[[str, int], str]):
        self.respond = respond
        self.calls: list[dict] = []

    def generate(self, prompts, *, n=1, temperature=0.0, max_new_tokens=128, stop=None, seed=0):
        self.calls.append({"prompts": list(prompts), "n": n, "stop": stop, "temperature": temperature, "seed": seed})
        return [[completion(cut_at_stop(self.respond(p, j), stop)) for j in range(n)] for p in prompts]


class QueuePolicy(ScriptedPolicy):
    """Replies from a fixed list in order (cycling), whatever the prompt."""

    def __init__(self, texts: Sequence[str]):
        it = iter(list(texts) * 10_000)
        super().__init__(lambda p, j: next(it))


class RandomTextPolicy(ScriptedPolicy):
    """Garbage: random printable strings (what an untrained model emits)."""

    def __init__(self, seed: int = 0):
        rng = random.Random(seed)
        alphabet = "abc <>/{}[]\"':,\n#*`qryansw"
        super().__init__(lambda p, j: "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 60))))


class LatencyPolicy:
    """sleep(call_s + token_s * tokens * batch): a fixed launch cost + per-sequence compute, i.e. a device that
    saturates with batch; the text comes from respond(prompt, sample_index)."""

    def __init__(self, respond: Callable[[str, int], str], call_s: float = 0.02, token_s: float = 2e-5,
                 tokens: int = 32):
        self.respond, self.call_s, self.token_s, self.tokens = respond, call_s, token_s, tokens

    def generate(self, prompts, *, n=1, temperature=0.0, max_new_tokens=128, stop=None, seed=0):
        time.sleep(self.call_s + self.token_s * self.tokens * len(prompts) * n)
        return [[completion(cut_at_stop(self.respond(p, j), stop)) for j in range(n)] for p in prompts]


class ByteTokenizer:
    """UTF-8 bytes as tokens: 0 pad, 1 bos, 2 eos, byte b -> b + 3 (vocab 259); `seconds` = time spent in it."""

    pad_id, bos_id, eos_id, vocab_size = 0, 1, 2, 259
    eos_ids = (2,)

    def __init__(self):
        self.seconds = 0.0

    def encode(self, text, add_bos=False):
        t0 = time.perf_counter()
        ids = ([1] if add_bos else []) + [b + 3 for b in text.encode("utf-8")]
        self.seconds += time.perf_counter() - t0
        return ids

    def decode(self, ids):
        t0 = time.perf_counter()
        text = bytes(int(i) - 3 for i in ids if int(i) >= 3).decode("utf-8", errors="replace")
        self.seconds += time.perf_counter() - t0
        return text

    def chat(self, messages, add_generation_prompt=True):
        return "\n\n".join(m["content"] for m in messages) + ("\n\n" if add_generation_prompt else "")


def tiny_jax_policy(seed: int = 0, max_seq_len: int = 384, *, d_model: int = 32, n_layers: int = 1, n_heads: int = 2,
                    n_kv_heads: int = 1, d_ff: int | None = None, std: float = 0.5,
                    max_prompt_tokens: int | None = None):
    """A JaxPolicy over a random Llama with the byte tokenizer (garbage in, garbage out)."""
    cfg = ModelConfig(vocab_size=259, d_model=d_model, n_layers=n_layers, n_heads=n_heads, n_kv_heads=n_kv_heads,
                      head_dim=d_model // n_heads, d_ff=d_ff or 2 * d_model, max_seq_len=max_seq_len, bos_id=1,
                      eos_ids=(2,), pad_id=0)
    return JaxPolicy(cfg, init_params(cfg, jax.random.PRNGKey(seed), std=std), ByteTokenizer(),
                     max_prompt_tokens=max_prompt_tokens)


class ShortestJudge:
    """A judge stand-in with no model (the smoke variants of the collection configs): ranks a state's candidates
    valid actions first, then by length (shorter first), ties in candidate order; scores 1/(1+rank). Not a paper's
    judge: it only lets a pipeline run end to end where no LLM judge is reachable."""

    name = "shortest"

    def judge(self, requests):
        out = []
        for req in requests:
            order = sorted(range(len(req.candidates)),
                           key=lambda i: (req.candidates[i].kind == INVALID, len(req.candidates[i].raw), i))
            ranks = [0] * len(order)
            for r, i in enumerate(order):
                ranks[i] = r
            out.append(JudgeResult([1.0 / (1 + r) for r in ranks], ranks))
        return out


def shortest_judge(judge_section=None, workdir=None) -> ShortestJudge:
    """config `judge: {kind: "fn", fn: "jaxrag.testing:shortest_judge"}`."""
    return ShortestJudge()
