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


@pytest.mark.parametrize("p", [1.0, 0.5])
def test_each_hops_first_query_is_vague_at_the_dose_and_the_trajectory_recovers(small, p):
    w, qs = small
    cfg = T.TeacherConfig(p_vague=0, p_redundant=0, p_premature=0, p_vague_first=p)
    trajs = T.run_teacher(qs * 2, PerfectRetriever(w), k=2, cfg=cfg, seed=3)
    firsts = []
    for q, steps in zip(qs * 2, trajs):
        queries = [s.action for s in steps if s.action.kind == "query"]
        for hop in range(q["metadata"]["hops"]):
            mine = [a for a in queries if a.extra["hop"] == hop]
            firsts.append(mine[0].extra["flaw"] == "vague")
            if mine[0].extra["flaw"] == "vague":   # the next query for the hop names its entity
                assert q["metadata"]["gold_chain"][hop]["entity"] in mine[1].text
            assert all(a.extra["flaw"] is None for a in mine[1:])
        assert steps[-1].action.text == q["golden_answers"][0]   # only the first query of a hop is ever flawed
    assert len(firsts) > 500 and abs(np.mean(firsts) - p) < 0.05


@pytest.mark.parametrize("p", [1.0, 0.5])
def test_the_last_hop_is_answered_before_its_search_at_the_dose(small, p):
    w, qs = small
    cfg = T.TeacherConfig(p_vague=0, p_redundant=0, p_premature=0, p_premature_last=p)
    trajs = T.run_teacher(qs * 2, PerfectRetriever(w), k=2, cfg=cfg, seed=3)
    early = []
    for q, steps in zip(qs * 2, trajs):
        hops = q["metadata"]["hops"]
        last = steps[-1].action
        searched = {s.action.extra["hop"] for s in steps if s.action.kind == "query"}
        if hops == 1:   # a one-hop chain has no earlier hop: never cut short
            assert last.extra["flaw"] is None and last.text == q["golden_answers"][0]
            continue
        early.append(last.extra["flaw"] == "premature_last")
        assert searched == set(range(hops - 1 if early[-1] else hops))   # every hop but the last, or all
    assert len(early) > 300 and abs(np.mean(early) - p) < 0.06


@pytest.mark.parametrize("knob", ["p_vague_first", "p_premature_last"])
def test_the_dose_at_zero_draws_nothing_extra(small, knob):
    w, qs = small
    r = PerfectRetriever(w)
    qs = qs[:40] + [q for q in qs if q["metadata"]["hops"] > 1][:40]   # one-hop and multi-hop chains
    base = T.run_teacher(qs, r, 2, T.TeacherConfig(), seed=4)
    zero = T.run_teacher(qs, r, 2, T.TeacherConfig(**{knob: 0.0}), seed=4)
    dosed = T.run_teacher(qs, r, 2, T.TeacherConfig(**{knob: 0.3}), seed=4)
    actions = lambda trajs: [[s.action for s in t] for t in trajs]
    assert actions(zero) == actions(base) and actions(dosed) != actions(base)
    with pytest.raises(ValueError, match="p_vague_first"):
        T.TeacherConfig(p_vague_first=-0.1)


def test_the_control_preset_is_the_demo_with_the_dose_and_the_demo_keeps_its_fingerprints():
    import importlib.util
    from pathlib import Path

    from jaxrag.pipelines.synthetic.world import teacher_config
    from jaxrag.settings import flatten
    from jaxrag.workdir import stage_settings

    path = Path(__file__).resolve().parents[1] / "configs" / "synthetic" / "pipeline.py"
    spec = importlib.util.spec_from_file_location("pipeline_cfg", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    demo, control = mod.get_config("demo"), mod.get_config("control")
    a, b = flatten(demo.to_dict()), flatten(control.to_dict())
    assert {k for k in a if a[k] != b[k]} == {"teacher.p_vague_first"} and b["teacher.p_vague_first"] == 0.5
    assert teacher_config(control.teacher).p_vague_first == 0.5 and teacher_config(demo.teacher) == T.TeacherConfig(
        p_vague=0.1, p_redundant=0.1, p_premature=0.05, max_retries=3, max_steps=10)
    # the knob at 0 reads as absent, so workdirs made before it keep their teacher stage
    assert "p_vague_first" not in stage_settings(demo, "teacher")["teacher"]
    assert stage_settings(control, "teacher")["teacher"]["p_vague_first"] == 0.5
    # the EM-costing control: the other flaw, and SFT on every trajectory so the policy inherits it
    premature = flatten(mod.get_config("control_premature").to_dict())
    assert {k for k in a if a[k] != premature[k]} == {"teacher.p_premature_last", "sft.only_correct"}
    assert premature["teacher.p_premature_last"] == 0.5 and premature["sft.only_correct"] is False
    assert "p_premature_last" not in stage_settings(demo, "teacher")["teacher"]
