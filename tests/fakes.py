"""Reusable test fakes: scripted / random / fixed-latency policies, a term-overlap retriever, a byte tokenizer.

They implement the same protocols as the real things (jaxrag.policy.Policy, jaxrag.retrieval.Retriever,
jaxrag.tokenizer.Tokenizer) so the rollout engine and the eval job can be tested without a model or index.
"""
from __future__ import annotations

import collections
import json
import random
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from jaxrag.paths import BENCHMARKS

BENCH = BENCHMARKS
CORPUS = BENCH / "corpus_multihop_contexts.jsonl"

try:
    from jaxrag.policy import Completion
except Exception:  # the real module pulls JAX; the engine only needs these four fields
    @dataclass
    class Completion:
        text: str
        token_ids: list = field(default_factory=list)
        logprobs: list = field(default_factory=list)
        finish_reason: str = "stop"


def completion(text: str, finish_reason: str = "stop") -> "Completion":
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
    """Fixed per-call latency + per-token cost (per sequence): models a device that saturates with batch."""

    def __init__(self, respond: Callable[[str, int], str], call_s: float = 0.02, token_s: float = 2e-5,
                 tokens: int = 32):
        self.respond, self.call_s, self.token_s, self.tokens = respond, call_s, token_s, tokens

    def generate(self, prompts, *, n=1, temperature=0.0, max_new_tokens=128, stop=None, seed=0):
        time.sleep(self.call_s + self.token_s * self.tokens * len(prompts) * n)
        return [[completion(cut_at_stop(self.respond(p, j), stop)) for j in range(n)] for p in prompts]


_WORD = re.compile(r"\w+")


def _terms(text: str) -> list[str]:
    return [w for w in _WORD.findall(text.lower()) if len(w) > 2]


@dataclass
class Passage:
    doc_id: str
    title: str
    text: str


def load_passages(path: Path = CORPUS, limit: int | None = None) -> list[Passage]:
    out = []
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f):
            if limit is not None and i >= limit:
                break
            r = json.loads(line)
            out.append(Passage(r["id"], r["title"], r["contents"]))
    return out


class OverlapRetriever:
    """Pure-python term-overlap search (idf-weighted) over passages; Retriever protocol."""

    def __init__(self, passages: Sequence[Passage]):
        self.passages = list(passages)
        self.index: dict[str, list[int]] = collections.defaultdict(list)
        for i, p in enumerate(self.passages):
            for t in set(_terms(p.title + " " + p.text)):
                self.index[t].append(i)
        self.calls: list[tuple[list[str], int]] = []

    def search(self, queries, k):
        from jaxrag.env.mdp import Doc
        self.calls.append((list(queries), k))
        out = []
        n = len(self.passages)
        for q in queries:
            scores: dict[int, float] = collections.Counter()
            for t in set(_terms(q or "")):
                post = self.index.get(t, [])
                for i in post:
                    scores[i] += 1.0 / (1 + len(post) / n * 50)
            best = sorted(scores.items(), key=lambda x: (-x[1], x[0]))[:k]
            out.append([Doc(self.passages[i].doc_id, s, self.passages[i].title, self.passages[i].text) for i, s in best])
        return out


class ByteTokenizer:
    """UTF-8 bytes as tokens: 0 pad, 1 bos, 2 eos, byte b -> b + 3 (vocab 259). Tokenizer protocol."""
    pad_id, bos_id, eos_id, vocab_size = 0, 1, 2, 259
    eos_ids = (2,)

    def encode(self, text, add_bos=False):
        return ([1] if add_bos else []) + [b + 3 for b in text.encode("utf-8")]

    def decode(self, ids):
        return bytes(int(i) - 3 for i in ids if int(i) >= 3).decode("utf-8", errors="replace")

    def chat(self, messages, add_generation_prompt=True):
        return "\n\n".join(m["content"] for m in messages) + ("\n\n" if add_generation_prompt else "")


def tiny_jax_policy(seed: int = 0, max_seq_len: int = 384):
    """A JaxPolicy over a tiny random Llama with the byte tokenizer (garbage in, garbage out)."""
    import jax

    from jaxrag.models.config import ModelConfig
    from jaxrag.models.transformer import init_params
    from jaxrag.policy import JaxPolicy
    cfg = ModelConfig(vocab_size=259, d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=16, d_ff=64,
                      max_seq_len=max_seq_len, bos_id=1, eos_ids=(2,), pad_id=0)
    return JaxPolicy(cfg, init_params(cfg, jax.random.PRNGKey(seed), std=0.5), ByteTokenizer())


def bm25_over_corpus():
    """The real BM25 (bm25s backend) over the multihop contexts corpus."""
    from jaxrag.retrieval import build_bm25, load_corpus
    return build_bm25(load_corpus(CORPUS), backend="bm25s")
