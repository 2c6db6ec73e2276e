import csv
import io

import ml_collections
import pytest

from fakes import BENCH, OverlapRetriever, ScriptedPolicy, load_passages
from jaxrag.data.qa import load_qa
from jaxrag.env.agents import get_agent
from jaxrag.env.mdp import read_episodes
from jaxrag.evaluate import evaluate, results_table
from jaxrag.pipelines.eval import eval_stage

GOLD = {}


def oracle_policy(pcfg=None, workdir=None):
    """Answers with the gold for questions it knows (first golden answer, or the option letter for MC)."""
    def respond(prompt, j):
        for q, a in GOLD.items():
            if q in prompt:
                return f"answer: {a}"
        return "answer: no idea"
    return ScriptedPolicy(respond)


def small_retriever(rcfg=None, workdir=None):
    return OverlapRetriever(load_passages(limit=300))


def test_evaluate_function_api(tmp_path):
    exs = load_qa(BENCH / "bamboogle_test.jsonl", "first:4")
    GOLD.update({exs[0].question: exs[0].golden_answers[0], exs[1].question: exs[1].golden_answers[0] + " indeed"})
    eps, m = evaluate(oracle_policy(), small_retriever(), get_agent("direct", mode="plain"), exs,
                      out_path=tmp_path / "e.jsonl", batch_size=2)
    assert m["n"] == 4 and m["em"] == pytest.approx(0.25) and m["f1"] > 0.25 and m["answered"] == 1.0
    assert m["searches_max"] == 0 and m["episodes_per_s"] > 0 and m["timing"]["policy_calls"] == 2
    assert read_episodes(tmp_path / "e.jsonl") == eps


def test_table_layout_like_rag_gym():
    res = {"ReAct": {"HotpotQA": {"n": 2, "em": 0.5, "f1": 0.75}, "MedQA": {"n": 2, "em": 0, "f1": 0, "acc": 0.5}},
           "RAG": {"HotpotQA": {"n": 2, "em": 0.0, "f1": 0.25}}}
    md, c = results_table(res)
    rows = list(csv.reader(io.StringIO(c)))
    assert rows[0] == ["Method", "HotpotQA EM", "HotpotQA F1", "MedQA Acc", "Avg EM", "Avg F1", "Avg"]
    assert rows[1] == ["ReAct", "50.0", "75.0", "50.0", "50.0", "75.0", "62.5"]
    assert rows[2][3] == "" and "| RAG | 0.00 | 25.00 | - |" in md


def test_eval_stage_from_config(tmp_path):
    med = load_qa(BENCH / "medqa_usmle_4opt_test_1273.jsonl", "first:3")
    hp = load_qa(BENCH / "hotpotqa_dev_500.jsonl", "last:2")
    GOLD.update({med[0].question: med[0].answer_letter, hp[0].question: hp[0].golden_answers[0]})
    c = ml_collections.ConfigDict()
    c.stages = ["eval"]
    c.eval = ml_collections.ConfigDict({
        "fn": "jaxrag.pipelines.eval:eval_stage",
        "agents": [{"name": "direct", "opts": {"mode": "plain"}}, {"name": "rag", "method": "RAG", "opts": {"mode": "plain"}}],
        "datasets": [{"name": "HotpotQA", "path": str(BENCH / "hotpotqa_dev_500.jsonl"), "select": "last:2"},
                     {"name": "MedQA", "path": str(BENCH / "medqa_usmle_4opt_test_1273.jsonl"), "select": "first:3"}],
        "policy": {"fn": "test_evaluate:oracle_policy"},
        "retriever": {"fn": "test_evaluate:small_retriever"},
        "rollout": {"k": 2, "max_steps": 3},
    })
    res = eval_stage(c, tmp_path, "eval")
    assert res["direct"]["MedQA"]["acc"] == pytest.approx(1 / 3) and res["RAG"]["HotpotQA"]["em"] == pytest.approx(0.5)
    eps = read_episodes(tmp_path / "eval" / "RAG__HotpotQA.episodes.jsonl")
    assert len(eps) == 2 and eps[0].steps[0].action.kind == "query" and len(eps[0].steps[0].docs) == 2
    table = (tmp_path / "eval" / "table.md").read_text()
    assert "MedQA Acc" in table and "| direct | 50.00 | 50.00 | 33.33 | 50.00 | 50.00 | 41.67 |" in table
    assert len((tmp_path / "eval" / "metrics.jsonl").read_text().splitlines()) == 4


def react_searcher(pcfg=None, workdir=None):
    """Plain Search-o1: one search, then answer."""
    return ScriptedPolicy(lambda p, j: "answer: done" if "\nsummary: " in p else "search: first fact")


def base_summarizer(pcfg=None, workdir=None):
    return ScriptedPolicy(lambda p, j: "summary: from the base model")


def test_eval_stage_summarizer_and_document_cut(tmp_path):
    c = ml_collections.ConfigDict()
    c.eval = ml_collections.ConfigDict({
        "agents": [{"name": "search_o1", "opts": {"mode": "plain"}},
                   {"name": "react", "opts": {"mode": "plain", "max_doc_chars": 30}}],
        "datasets": [{"name": "HotpotQA", "path": str(BENCH / "hotpotqa_dev_500.jsonl"), "select": "first:1"}],
        "policy": {"fn": "test_evaluate:react_searcher"}, "retriever": {"fn": "test_evaluate:small_retriever"},
        "summarizer": {"fn": "test_evaluate:base_summarizer"}, "max_doc_chars": 12, "rollout": {"k": 2, "max_steps": 3},
    })
    eval_stage(c, tmp_path, "eval")
    [ep] = read_episodes(tmp_path / "eval" / "search_o1__HotpotQA.episodes.jsonl")
    assert ep.steps[0].summary == "from the base model" and "summary: from the base model" in ep.steps[1].prompt
    docs = [ln for ln in ep.steps[0].summary_prompt.splitlines() if ln.startswith("doc: ")]
    assert docs and all(len(ln.split(": ", 2)[2]) <= 12 + 4 for ln in docs)        # eval.max_doc_chars: 12 (+ " ...")
    [ep] = read_episodes(tmp_path / "eval" / "react__HotpotQA.episodes.jsonl")
    docs = [ln for ln in ep.steps[1].prompt.splitlines() if ln.startswith("doc: ")]
    assert any(len(ln.split(": ", 2)[2]) > 16 for ln in docs)                    # the agent's own opts win


@pytest.mark.parametrize("edit, message", [
    (lambda c: c.eval.agents[2].update({"name": "reactt"}), r"config.eval.agents\[2\].name: unknown agent 'reactt'"),
    (lambda c: c.eval.datasets[1].update({"path": "/nope/2wiki.jsonl"}),
     r"config.eval.datasets\[1\].path: /nope/2wiki.jsonl: no such file"),
    (lambda c: c.eval.datasets[0].update({"select": "lats:250"}), r"config.eval.datasets\[0\].select: bad select"),
    (lambda c: c.eval.rollout.update({"max_stepz": 3}), r"config.eval.rollout: .*max_stepz"),
    (lambda c: None, r"config.eval.policy.path: empty"),
    (lambda c: c.eval.judge.update({"retires": 3}), r"config.eval.judge: unknown keys \['retires'\]"),
])
def test_paper_eval_config_checked_before_compute(tmp_path, edit, message):
    import configs.rag_gym.table2 as mod
    from jaxrag.main import StageError, run

    c = mod.get_config("shared")
    with c.unlocked():
        edit(c)
        if "policy.path" not in message:
            c.eval.policy.path = str(tmp_path)  # set, so the check reaches the edited key
    with pytest.raises(StageError, match=message):
        run(c, tmp_path / "run")
    assert not (tmp_path / "run" / "eval").exists()


def test_empty_dataset_file_is_refused_before_compute(tmp_path):
    import configs.rag_gym.table2 as mod
    from jaxrag.pipelines.eval import check_config

    (tmp_path / "empty.jsonl").write_text("")
    c = mod.get_config("shared")
    c.eval_medqa.policy.path = str(tmp_path)
    c.eval_medqa.datasets[0]["path"] = str(tmp_path / "empty.jsonl")
    with pytest.raises(ValueError, match=r"config.eval_medqa.datasets\[0\].path: .*empty.jsonl: empty file"):
        check_config(c, "eval_medqa")


class TableRetriever:
    """Returns the hits listed for a query (title, text) in order."""

    def __init__(self, table):
        self.table = table

    def search(self, queries, k):
        from jaxrag.retrieval.base import Hit
        return [[Hit(f"d{i}", 1.0, t, x) for i, (t, x) in enumerate(self.table.get(q, []))][:k] for q in queries]


def test_index_recall_by_hand():
    from jaxrag.data.qa import QAExample
    from jaxrag.evaluate import index_recall, recall_table
    from jaxrag.metrics import title_key

    exs = [QAExample("1", "q1", ("Paris",), supporting_titles=("France", "Seine")),
           QAExample("2", "q2", ("Rome",), supporting_titles=("Italy",)),
           QAExample("3", "q3", ("Oslo",))]                        # no gold titles: only its answer recall counts
    r = TableRetriever({"q1": [("france", "capital: Paris"), ("Other", "x"), ("Seine", "a river")],
                        "q2": [("Spain", "Madrid")], "q3": [("Norway", "Oslo is its capital")]})
    m = index_recall(r, exs, 2, corpus_titles={title_key(t) for t in ("France", "Italy", "Norway")})
    assert m["answer_recall"] == pytest.approx(2 / 3)             # q1 (Paris) and q3 (Oslo) in their top 2
    assert m["with_gold_titles"] == 2 and m["gold_recall"] == pytest.approx((1 / 2 + 0) / 2)  # Seine is 3rd: cut
    assert m["gold_in_index"] == pytest.approx(2 / 3)             # France, Italy held; Seine is not in the corpus
    md = recall_table({"X": m})
    assert "| X | 3 | 2 | 66.7 | 25.0 | 66.7 |" in md and "recall@2" in md


def test_eval_stage_reports_index_and_episode_recall(tmp_path):
    """The default BM25 retriever over a corpus built from two HotpotQA questions' own paragraphs: every gold title
    is in the index; the table shows the recall table; each metrics row carries the index's and the episodes' recall."""
    import json

    hp = load_qa(BENCH / "hotpotqa_dev_500.jsonl", "last:2")
    corpus = tmp_path / "corpus.jsonl"
    with corpus.open("w") as f:
        for j, ex in enumerate(hp):
            for i, c in enumerate(ex.contexts):
                f.write(json.dumps({"id": f"{j}-{i}", "title": c["title"], "contents": c["text"]}) + "\n")
    c = ml_collections.ConfigDict()
    c.stages = ["eval"]
    c.eval = ml_collections.ConfigDict({
        "fn": "jaxrag.pipelines.eval:eval_stage",
        "agents": [{"name": "rag", "opts": {"mode": "plain"}}],
        "datasets": [{"name": "HotpotQA", "path": str(BENCH / "hotpotqa_dev_500.jsonl"), "select": "last:2"}],
        "policy": {"fn": "test_evaluate:oracle_policy"},
        "retriever": {"corpus": str(corpus)},
        "rollout": {"k": 3, "max_steps": 2},
    })
    eval_stage(c, tmp_path / "wd", "eval")
    out = tmp_path / "wd" / "eval"
    rec = json.loads((out / "index_recall.json").read_text())["HotpotQA"]
    assert rec["n"] == 2 and rec["with_gold_titles"] == 2 and rec["gold_in_index"] == 1.0
    row = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    assert row["index_gold_in_index"] == 1.0 and row["index_gold_recall"] == rec["gold_recall"]
    eps = read_episodes(out / "rag__HotpotQA.episodes.jsonl")
    from jaxrag.metrics import title_recall
    want = sum(title_recall(e.metadata["supporting_titles"], [d.title for s in e.steps for d in s.docs]) for e in eps) / 2
    assert row["gold_recall"] == pytest.approx(want) and row["gold_recall_n"] == 2 and 0 <= row["answer_recall"] <= 1
    assert "gold titles in index" in (out / "table.md").read_text()
