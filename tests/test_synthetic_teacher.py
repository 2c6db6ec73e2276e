"""The scripted imperfect teacher: reaches the gold answer under perfect retrieval, flaws at configured rates."""

import dataclasses

import numpy as np
import pytest

from jaxrag.data.synthetic import questions as Q, teacher as T, world as W


@dataclasses.dataclass(frozen=True)
class FakeHit:
    doc_id: str
    score: float
    title: str
    text: str


class PerfectRetriever:
    """Any good teacher query -> its gold passage + a distractor; anything else -> distractors only."""

    def __init__(self, world):
        self.world = world
        self.by_query = {}
        for (s, rel), fact in world.facts.items():
            for t in T.QUERY_TEMPLATES.get(rel, ()):
                self.by_query[t.format(e=world.entities[s].name)] = fact.passage_id
        self.distractors = [p for p in world.passages if p.distractor]
        self.calls = 0

    def search(self, queries, k):
        self.calls += 1
        out = []
        for q in queries:
            docs = [self.world.passage(self.by_query[q])] if q in self.by_query else []
            docs += self.distractors[len(q) % 7 : len(q) % 7 + k]
            out.append([FakeHit(p.id, 1.0, p.title, p.contents) for p in docs[:k]])
        return out


@pytest.fixture(scope="module")
def small():
    w = W.generate_world(5, n_countries=5, n_cities=20, n_persons=120, n_films=60, n_companies=20)
    return w, Q.generate_questions(w, seed=5)


def test_perfect_teacher_under_perfect_retrieval_reaches_gold(small):
    w, qs = small
    retriever = PerfectRetriever(w)
    cfg = T.TeacherConfig(p_vague=0, p_redundant=0, p_premature=0)
    trajs = T.run_teacher(qs, retriever, k=2, cfg=cfg, seed=0)
    assert retriever.calls == max(q["metadata"]["hops"] for q in qs)  # lockstep: one batched call per query step
    for q, steps in zip(qs, trajs):
        assert [s.action.kind for s in steps] == ["query"] * q["metadata"]["hops"] + ["answer"]
        assert steps[-1].action.text == q["golden_answers"][0]
        assert all(s.action.extra["flaw"] is None for s in steps)
        for s, hop in zip(steps, q["metadata"]["gold_chain"]):
            assert hop["entity"] in s.action.text and hop["passage_id"] in s.doc_ids


def test_queries_only_name_entities_already_observed(small):
    w, qs = small
    trajs = T.run_teacher(qs, PerfectRetriever(w), k=2, cfg=T.TeacherConfig(), seed=1)
    for q, steps in zip(qs, trajs):
        seen_text = q["question"]
        for s in steps:
            if s.action.kind == "query" and s.action.extra["flaw"] is None:
                assert s.action.extra["reasoning"]
                entity = q["metadata"]["gold_chain"][s.action.extra["hop"]]["entity"]
                assert entity in seen_text, (q["id"], s.action.text)
            seen_text += " ".join(w.passage(d).contents for d in s.doc_ids)


def test_flaw_rates_match_config(small):
    w, qs = small
    cfg = T.TeacherConfig(p_vague=0.2, p_redundant=0.15, p_premature=0.1)
    trajs = T.run_teacher(qs * 3, PerfectRetriever(w), k=2, cfg=cfg, seed=2)
    flaws = [s.action.extra["flaw"] for steps in trajs for s in steps if s.action.extra["hop"] is not None]
    decisions = len(flaws)
    assert decisions > 2000
    rate = lambda name: sum(f == name for f in flaws) / decisions
    assert abs(rate("premature") - 0.1) < 0.03
    assert abs(rate("vague") - 0.2) < 0.04
    # redundancy needs a previous non-redundant query, so it is at most the configured rate.
    assert 0.05 < rate("redundant") <= 0.15 + 0.02
    correct = [steps[-1].action.text == q["golden_answers"][0] for q, steps in zip(qs * 3, trajs)]
    assert 0.5 < np.mean(correct) < 1.0  # flawed but mostly successful
    premature = [steps for steps in trajs if steps[-1].action.extra["flaw"] == "premature"]
    assert premature and all(s[-1].action.kind == "answer" for s in premature)


def test_teacher_is_deterministic_per_seed_and_bounded(small):
    w, qs = small
    r = PerfectRetriever(w)
    cfg = T.TeacherConfig(p_vague=0.5, p_redundant=0.3, p_premature=0.0, max_steps=4)
    a = T.run_teacher(qs[:50], r, 2, cfg, seed=7)
    b = T.run_teacher(qs[:50], r, 2, cfg, seed=7)
    assert [[s.action for s in t] for t in a] == [[s.action for s in t] for t in b]
    assert all(len(t) <= 4 and t[-1].action.kind == "answer" for t in a)


def test_bad_teacher_config_raises():
    with pytest.raises(ValueError, match="p_vague"):
        T.TeacherConfig(p_vague=1.5)
