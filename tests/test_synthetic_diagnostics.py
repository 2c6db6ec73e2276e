"""The synthetic world's diagnostics: the error taxonomy (each kind on a hand-built episode of a 2-hop question),
how far a system moved from a base, and a training stage's signal figures."""

import json

import pytest

from jaxrag.env.mdp import Action, Doc, Episode, Step
from jaxrag.pipelines.synthetic.diagnostics import movement, movement_table, signal_table, training_signal
from jaxrag.pipelines.synthetic.taxonomy import FAILURES, KINDS, error_kind, taxonomy, taxonomy_table

Q = {"id": "q", "golden_answers": ["Paris"], "metadata": {"type": "2hop", "gold_chain": [
    {"passage_id": "p1", "entity": "Ann Bo", "relation": "works_for", "answer": "Acme"},
    {"passage_id": "p2", "entity": "Acme", "relation": "based_in", "answer": "Paris"}]}}
P1, P2 = Doc("p1", 1.0, "Ann Bo", "Ann Bo works for Acme."), Doc("p2", 1.0, "Acme", "Acme is based in Paris.")
NOISE = Doc("n", 1.0, "Acme Two", "Acme Two is based in Lyon.")


def search(text, *docs):
    return Step(Action("query", text), docs=list(docs))


def answer(text, prompt=""):
    return Step(Action("answer", text), prompt=prompt)


def ep(steps, answer_text=None, done="answer"):
    return Episode("q", "Where is Ann Bo's employer based?", ["Paris"], steps=steps, answer=answer_text, done=done)


FULL = "Ann Bo works for Acme. Acme is based in Paris."
CASES = {
    "correct": ep([search("Ann Bo employer", P1), search("Acme headquarters", P2), answer("Paris", FULL)], "Paris"),
    "invalid": ep([search("Ann Bo employer", P1), Step(Action.invalid("blah", "no prefix"))], None, "invalid"),
    "out_of_steps": ep([search("Ann Bo employer", P1)] * 3, None, "max_steps"),
    "prompt_cut": ep([search("Ann Bo employer", P1), search("Acme headquarters", P2),
                      answer("Lyon", "Acme is based in Paris.")], "Lyon"),
    "copy_error": ep([search("Ann Bo employer", P1), search("Acme headquarters", P2), answer("Pari", FULL)], "Pari"),
    "premature": ep([search("Ann Bo employer", P1), answer("Acme")], "Acme"),
    # a miscopied bridge name: the query finds another entity and the policy goes on with it
    "misnamed": ep([search("Ann Bo employer", P1), search("Acm based", NOISE), search("Lyon country"), answer("Fr")],
                   "Fr"),
    "missed_once": ep([search("Ann Bo employer", P1), search("Acme based", NOISE), answer("Lyon")], "Lyon"),
    "missed_retry": ep([search("Ann Bo employer", P1), search("Acme based", NOISE), search("Acme hq", NOISE),
                        answer("Lyon")], "Lyon"),
}


@pytest.mark.parametrize("kind", KINDS)
def test_each_kind(kind):
    assert error_kind(CASES[kind], Q) == kind


def test_a_retry_that_resolves_the_hop_starts_a_new_count():
    # two misses on hop 1, then it resolves, then one miss on hop 2: missed once (the earlier misses were progress)
    e = ep([search("Ann employer", NOISE), search("Ann Bo employer", P1), search("Acme based", NOISE), answer("Lyon")],
           "Lyon")
    assert error_kind(e, Q) == "missed_once"


def test_taxonomy_counts_shares_and_table():
    eps = [CASES[k] for k in KINDS] + [CASES["misnamed"]]
    t = taxonomy(eps, {"q": Q})
    a = t["all"]
    assert a["n"] == 10 and a["counts"]["misnamed"] == 2 and sum(a["counts"].values()) == 10
    assert a["shares"]["correct"] == pytest.approx(0.1) and a["shares"]["misnamed"] == pytest.approx(0.2)
    assert t["by_type"]["2hop"] == a
    assert a["vague"] == 0.0
    lines = taxonomy_table({"sys": a}).splitlines()
    assert lines[2] == ("| sys | 10 | 0.100 | " + " | ".join("0.200" if k == "misnamed" else "0.100" for k in FAILURES)
                        + " | 0.000 |")
    assert len(lines[0].split("|")) == len(FAILURES) + 6


def test_a_vague_query_is_counted_whatever_the_outcome():
    right = ep([search("where was the person born"), search("Ann Bo employer", P1), search("Acme headquarters", P2),
                answer("Paris", FULL)], "Paris")
    t = taxonomy([right, CASES["correct"]], {"q": Q})["all"]
    assert t["vague"] == 0.5 and t["counts"]["correct"] == 2


def test_movement_counts_changed_trajectories_answers_gains_and_losses():
    def one(qid, answer_text, queries):
        e = ep([search(q) for q in queries] + [answer(answer_text)], answer_text)
        e.qid = qid
        return e

    base = [one("a", "Paris", ["x"]), one("b", "Lyon", ["y"]), one("c", "Nice", ["z"]), one("d", "Paris", ["w"])]
    other = [one("a", "Paris", ["X "]), one("b", "Paris", ["y"]), one("c", "Nice", ["z", "z2"]),
             one("d", "Lyon", ["w"]), one("e", "Paris", [])]   # "e": not in the base, left out
    m = movement(base, other)
    assert m == {"n": 4, "trajectory_changed": 0.75, "answer_changed": 0.5, "gained": 1, "lost": 1}
    assert "| sys | 4 | 0.750 | 0.500 | 1 | 1 |" in movement_table({"sys": m}, "base")


def test_training_signal_reads_a_stages_metrics_and_summary(tmp_path):
    d = tmp_path / "dpo"
    d.mkdir()
    rows = [{"kind": "train", "step": i + 1, "lr": 0.1, "dpo/accuracy": i / 19, "dpo/reward_margin": float(i)}
            for i in range(20)] + [{"kind": "eval", "step": 20, "loss": 1.0}]
    (d / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    (d / "summary.json").write_text(json.dumps({"pairs": 40}))
    r = training_signal(tmp_path, "dpo")
    assert (r["steps"], r["data"], r["data_kind"]) == (20, 40, "pairs")
    assert r["lr_sum"] == pytest.approx(2.0)
    assert r["accuracy"] == pytest.approx((18 + 19) / 2 / 19) and r["margin"] == pytest.approx(18.5)
    g = tmp_path / "grpo"
    g.mkdir()
    rows = [{"kind": "train", "lr": 0.01, "reward/groups_without_signal": 0.5 + 0.5 * (i % 2), "kl/k1": 0.002,
             "reward/mean": 0.1 * i} for i in range(10)]
    (g / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    r = training_signal(tmp_path, "grpo")
    assert r["no_signal"] == pytest.approx(0.75) and r["kl"] == pytest.approx(0.002)
    assert (r["reward_first"], r["reward_last"]) == pytest.approx((0.0, 0.9))
    assert training_signal(tmp_path, "absent") is None
    table = signal_table([training_signal(tmp_path, "dpo"), r], base_lr=20.0)
    assert "| dpo | 40 pairs | 20 | 2 (10.00%) | 0.974 / 18.500 | - | - | - | - |" in table
    assert "| grpo | - | 10 | 0.1 (0.50%) | - | - | 0.750 | 0.0020 | 0.000 → 0.900 |" in table


def test_pair_targets_count_the_pairs_whose_rejected_or_chosen_action_is_the_greedy_one():
    import types

    from jaxrag.env.agents import get_agent
    from jaxrag.pipelines.synthetic.diagnostics import pair_targets
    from jaxrag.supervision.records import Pair

    agent = get_agent("react", mode="plain")
    q = lambda text: agent.format(Action("query", text))
    greedy = {"s1": q("Ann Bo employer"), "s2": q("Acme based"), "s3": agent.format(Action("answer", "Paris"))}

    class Greedy:   # the policy's greedy action per prompt; it records how it was asked
        def generate(self, prompts, *, n, temperature, max_new_tokens, stop):
            self.asked = (len(prompts), n, temperature, max_new_tokens, stop)
            return [[types.SimpleNamespace(text=" " + greedy[p].upper() + " ")] for p in prompts]

    pairs = [Pair("s1", q("Ann Bo works for"), q("Ann Bo employer"), 1.0, "oracle"),      # rejected is greedy
             Pair("s2", q("Acme based"), q("the company based"), 1.0, "oracle"),          # chosen is greedy
             Pair("s3", q("Acme based"), agent.format(Action("answer", "Lyon")), 1.0, "oracle"),   # neither
             Pair("s1", q("Ann Bo employer"), agent.format(Action("answer", "Acme")), 1.0, "oracle")]  # chosen
    policy = Greedy()
    got = pair_targets(policy, agent, pairs, max_new_tokens=17)
    assert got == {"pairs": 4, "rejected_is_greedy": 0.25, "chosen_is_greedy": 0.5}
    assert policy.asked == (4, 1, 0.0, 17, list(agent.stop))
    assert pair_targets(policy, agent, [])["rejected_is_greedy"] is None
    table = signal_table([{"stage": "dpo", "steps": 3, "data": 4, "data_kind": "pairs", "lr_sum": 0.1,
                           "accuracy": 0.9, "margin": 1.0, **{k: v for k, v in got.items() if k != "pairs"}}], 1.0)
    assert "| 0.250 / 0.500 |" in table
