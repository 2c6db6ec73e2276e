"""Pairwise ranking agreement between two process-reward sources, hand-computed."""
import csv
import io

import pytest

from jaxrag.env.mdp import Action, Step
from jaxrag.supervision.agreement import (agreement_csv, agreement_markdown, agreement_table, pairwise_agreement,
                                          write_agreement)
from jaxrag.supervision.records import ProcessRecord, ScoredCandidate


def _rec(qid, step, scores: dict, history=(), source="x"):
    hist = [Step(Action("query", q)) for q in history]
    cands = [ScoredCandidate(raw, Action("query", raw), score=s) for raw, s in scores.items()]
    return ProcessRecord(qid, "Q?", ["G"], "react", hist, "", cands, source, step=step)


def _pair_of_sources():
    oracle = [
        _rec("q1", 0, {"a": 1.0, "b": 0.0, "c": 0.0}),
        _rec("q2", 1, {"x": 1.0, "y": 0.0, "z": 1.0}, history=["h"]),
        _rec("q3", 0, {"u": 1.0, "v": 0.0}),  # no counterpart in the judge's records
        _rec("q4", 1, {"s": 1.0, "t": 0.0}, history=["first"]),  # judge saw another history: not the same state
    ]
    judge = [
        # q1: a > b and a > c as the oracle says; b = c is tied under the oracle: not counted
        _rec("q1", 0, {"a": 0.5, "b": 0.2, "c": 0.2, "only-in-judge": 0.9}),
        # q2: (x, y) tied under the judge -> disagreement; (y, z) reversed -> disagreement; (x, z) oracle tie
        _rec("q2", 1, {" x ": 0.3, "y": 0.3, "z": 0.1}, history=["h"]),
        _rec("q4", 1, {"s": 0.0, "t": 1.0}, history=["other"]),
    ]
    return oracle, judge


def test_hand_computed_agreement():
    oracle, judge = _pair_of_sources()
    r = pairwise_agreement(oracle, judge)
    assert r == {"agreement": 0.5, "pairs": 4, "agree": 2, "ties_b": 1, "states": 2}
    # the other direction: the judge's strict pairs a>b, a>c (b=c tie), (x,z), (y,z); oracle ties (x,y) skipped
    # a>b ✓ a>c ✓ x>z (oracle tie -> disagreement) y>z (oracle z>y -> disagreement)
    assert pairwise_agreement(judge, oracle) == {"agreement": 0.5, "pairs": 4, "agree": 2, "ties_b": 1,
                                                 "states": 2}


def test_duplicates_are_averaged_and_failures_left_out():
    a = [_rec("q", 0, {"p": 1.0, "q": 0.0})]
    b = _rec("q", 0, {"p": 0.2, "q": 0.5})
    b.candidates.append(ScoredCandidate("p", Action("query", "p"), score=0.9))  # the same text sampled twice
    b.candidates.append(ScoredCandidate("r", Action("query", "r"), score=None, failure="timeout"))
    assert pairwise_agreement(a, [b])["agreement"] == 1.0  # mean(0.2, 0.9) = 0.55 > 0.5
    assert pairwise_agreement(a, [])["agreement"] is None


def test_table_markdown_csv(tmp_path):
    oracle, judge = _pair_of_sources()
    rows = agreement_table({"oracle": oracle, "rank:gpt": judge, "self": oracle})
    assert [(r["source"], r["agreement"], r["pairs"]) for r in rows] == [("rank:gpt", 0.5, 4), ("self", 1.0, 6)]
    md = agreement_markdown(rows)
    assert "| rank:gpt | oracle | 50.0% | 4 | 2 | 1 | 2 |" in md and "tie under the source counts as disagreement" in md
    back = list(csv.DictReader(io.StringIO(agreement_csv(rows))))
    assert back[0]["source"] == "rank:gpt" and float(back[0]["agreement"]) == 0.5 and back[1]["pairs"] == "6"
    paths = write_agreement(rows, tmp_path)
    assert paths["markdown"].read_text() == md and paths["csv"].read_text() == agreement_csv(rows)
    with pytest.raises(ValueError, match="reference source 'oracle' not among"):
        agreement_table({"a": oracle})
