"""A tiny world for the RL tests: a random byte-level Llama (tests/fakes.tiny_jax_policy), an agent that turns any
generation into a multi-turn action sequence, a term-overlap retriever over a few passages, and toy rewards."""

from __future__ import annotations

import dataclasses

import zlib

from fakes import Passage, tiny_jax_policy

from jaxrag.env.agents import base
from jaxrag.env.mdp import ANSWER, QUERY, Action, Doc, Episode
from jaxrag.supervision.rewards import REWARDS, Reward, register

PASSAGES = [Passage(f"p{i}", t, x) for i, (t, x) in enumerate([
    ("Alpha", "Alpha is a city on the river Beta."), ("Beta", "Beta is a long river in the north."),
    ("Gamma", "Gamma founded Alpha in the year 1200."), ("Delta", "Delta is a film by Gamma."),
    ("Epsilon", "Epsilon won a prize for Delta.")])]

QUESTIONS = [{"id": f"q{i}", "question": f"who is number {i}?", "golden_answers": [f"n{i}"]} for i in range(8)]


class HashRetriever:
    """Any query (random bytes included) gets k passages, picked by a hash of the query: deterministic."""

    def __init__(self, passages):
        self.passages = list(passages)

    def search(self, queries, k):
        out = []
        for q in queries:
            start = zlib.crc32(q.encode("utf-8")) % len(self.passages)
            out.append([Doc(p.doc_id, 1.0, p.title, p.text) for p in (self.passages * 2)[start:start + k]])
        return out


@dataclasses.dataclass
class EchoAgent(base.Agent):
    """Plain mode: a generation containing `answer_char` is an answer, any other non-empty one a search query
    (so a random model plays multi-turn episodes); an empty generation is Invalid."""
    name = "echo"
    answer_char: str = "~"

    def parse_plain(self, text: str) -> Action:
        text = text.strip()
        if not text:
            return Action.invalid(text, "empty")
        if self.answer_char in text:
            return Action(ANSWER, text[:16], text)
        return Action(QUERY, text[:32], text)


def lowercase_share(ep: Episode) -> Reward:
    """Share of the generated characters (all actions) that are lowercase ASCII letters."""
    text = "".join(s.action.raw for s in ep.steps)
    share = sum("a" <= c <= "z" for c in text) / max(len(text), 1)
    return Reward(share, {"lowercase": share, "chars": float(len(text))})


if "test_lowercase" not in REWARDS:
    register("test_lowercase")(lowercase_share)


def world(seed: int = 0, max_seq_len: int = 256):
    """(policy, retriever, agent) of the tiny world."""
    policy = tiny_jax_policy(seed, max_seq_len)
    return policy, HashRetriever(PASSAGES), EchoAgent(mode="plain", max_doc_chars=40)
