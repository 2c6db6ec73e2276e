"""pipelines/compare.py + published.py + notebooks/paper_tables.ipynb on fake run directories."""
import importlib.util
import json
from pathlib import Path

import pytest

from jaxrag.pipelines.compare import RunError, compare, read_run
from jaxrag.pipelines.published import AGENTS, LEFT_OUT, METHODS, PUBLISHED, TABLES, is_known_method

REPO = Path(__file__).resolve().parent.parent


def make_run(d: Path, config: dict | None, stages: dict[str, list]) -> Path:
    d.mkdir(parents=True)
    if config is not None:
        (d / "config.json").write_text(json.dumps({"jaxrag_version": "0", "git_commit": None, "config": config}))
    for stage, rows in stages.items():
        (d / stage).mkdir()
        (d / stage / "metrics.jsonl").write_text(
            "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return d


def row(method, dataset, **m):
    return {"method": method, "dataset": dataset, "n": 100, "searches_mean": 1.5, **m}


def cells(md: str, method: str, model: str = "") -> dict[str, str]:
    """The markdown row of `method` (and model) as {column header: cell}."""
    lines = [ln for ln in md.splitlines() if ln.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    for ln in lines[2:]:
        vals = [c.strip() for c in ln.strip("|").split("|")]
        if vals[0] == method and (not model or vals[1] == model):
            return dict(zip(header, vals))
    raise AssertionError(f"no row {method} {model} in\n{md}")


@pytest.fixture
def rag_gym_runs(tmp_path):
    cfg = {"paper": "rag_gym", "table": "table2", "model": "Llama-3.1-8B-Instruct"}
    zs = make_run(tmp_path / "zs", cfg, {
        "eval": [row("re2search", d, em=0.30, f1=0.40, cem=0.35) for d in ("HotpotQA", "2Wiki", "Bamboogle")]
        + [row("re2search", "MedQA", em=0.5, f1=0.5, cem=0.5, acc=0.70)]})
    dpo = make_run(tmp_path / "dpo", {**cfg, "model": "meta-llama/Llama-3.1-8B-Instruct"}, {
        "train": [{"kind": "train", "step": 1, "loss": 0.7}, {"kind": "eval", "split": "dev", "step": 1}],
        "eval": [row("re2search+dpo", "HotpotQA", em=0.421, f1=0.5)],
        "eval_more": [row("re2search+dpo", "2Wiki", em=0.443, f1=0.52), row("mine", "PopQA", em=0.1, f1=0.2)]})
    return zs, dpo


def test_ours_beside_the_right_published_value_and_runs_merged(rag_gym_runs):
    zs, dpo = rag_gym_runs
    [t] = compare([zs, dpo])
    assert (t.paper, t.table) == ("rag_gym", "table2") and t.runs == [str(zs), str(dpo)]
    # RAG-Gym Table 2, Zero-shot Learning / Re²Search: HotpotQA EM 34.00, MedQA Acc 70.31, Average F1 54.90
    r = cells(t.markdown, "re2search")
    assert r["Paper row"] == "Zero-shot Learning / Re²Search" and r["Model"] == "Llama-3.1-8B-Instruct"
    assert r["HotpotQA EM"] == "30.00 / 34.00"
    assert r["MedQA Acc"] == "70.00 / 70.31"
    assert r["Average F1"] == "47.50 / 54.90"    # (40 + 40 + 40 + Acc 70) / 4, as the paper averages
    # the DPO run (its model named differently, two eval stages) fills the DPO row: 42.20 / 44.30 published
    r = cells(t.markdown, "re2search+dpo")
    assert r["HotpotQA EM"] == "42.10 / 42.20" and r["2Wiki EM"] == "44.30 / 44.30"
    assert r["Bamboogle EM"] == "– / 48.00" and r["Average EM"] == "– / 51.65"   # ours missing
    assert cells(t.markdown, "direct+ppo")["HotpotQA EM"] == "– / 19.20"
    mine = cells(t.markdown, "mine")                                              # published missing
    assert mine["PopQA EM"] == "10.00 / –" and mine["Paper row"] == "–"
    d = [x for x in t.rows if (x["method"], x["dataset"], x["metric"]) == ("re2search", "HotpotQA", "em")]
    assert len(d) == 1 and d[0]["ours"] == pytest.approx(30.0) and d[0]["published"] == 34.0
    assert d[0]["runs"] == str(zs)


def test_model_picks_the_row_and_tables_group(tmp_path):
    arena = {"paper": "arena", "table": "table2"}
    q = make_run(tmp_path / "q", {**arena, "model": "Qwen2.5-7B-Instruct"},
                 {"eval": [row("arena+grpo", "MuSiQue", em=0.4, f1=0.5, lj=0.45)]})
    ll = make_run(tmp_path / "l", {**arena, "model": "Llama3.1-8B-Instruct"},
                  {"eval": [row("arena+grpo", "MuSiQue", em=0.3, f1=0.4)]})          # no LJ: "–", no crash
    ss = make_run(tmp_path / "s", {"paper": "smartsearch", "table": "table1"},       # no model named
                  {"eval": [row("smartsearch+sft+dpo+grpo", "2Wiki", em=0.45, f1=0.5)]})
    a, s = compare([q, ss, ll])
    assert (a.table, s.paper) == ("table2", "smartsearch")
    # ARENA Table 2: ARENA-Qwen2.5-7B MuSiQue LJ 50.8; ARENA-Llama3.1-8B MuSiQue EM 35.8
    assert cells(a.markdown, "arena+grpo", "Qwen2.5-7B-Instruct")["MuSiQue LJ"] == "45.0 / 50.8"
    r = cells(a.markdown, "arena+grpo", "Llama-3.1-8B-Instruct")
    assert r["MuSiQue EM"] == "30.0 / 35.8" and r["MuSiQue LJ"] == "– / 46.6"
    # SmartSearch Table 1, "SmartSearch (Ours)": the paper's only model is taken when the config names none
    r = cells(s.markdown, "smartsearch+sft+dpo+grpo")
    assert r["2Wiki EM"] == "45.0 / 45.3" and r["Model"] == "Qwen2.5-3B-Instruct"


def test_errors_name_the_directory_or_line(tmp_path):
    with pytest.raises(RunError, match=r"nocfg: no config\.json"):
        read_run(make_run(tmp_path / "nocfg", None, {}))
    with pytest.raises(RunError, match=r"nopaper: config\.json's config has no 'paper'"):
        read_run(make_run(tmp_path / "nopaper", {"table": "table2"}, {}))
    with pytest.raises(RunError, match=r"notable: config\.json's config has no 'table'"):
        read_run(make_run(tmp_path / "notable", {"paper": "arena"}, {}))
    cfg = {"paper": "arena", "table": "table2"}
    bad = make_run(tmp_path / "bad", cfg, {"eval": [row("arena", "2Wiki", em=0.1), "{not json"]})
    with pytest.raises(RunError, match=r"bad/eval/metrics\.jsonl:2: malformed JSON"):
        read_run(bad)
    nom = make_run(tmp_path / "nom", cfg, {"eval": [row("arena", "2Wiki"), {"dataset": "2Wiki", "em": 0.1}]})
    with pytest.raises(RunError, match=r"nom/eval/metrics\.jsonl:2: eval row without 'method'"):
        read_run(nom)
    nan = make_run(tmp_path / "str", cfg, {"eval": [row("arena", "2Wiki", em="high")]})
    with pytest.raises(RunError, match=r"str/eval/metrics\.jsonl:1: 'em' is 'high'"):
        read_run(nan)
    twice = make_run(tmp_path / "twice", cfg, {"a": [row("arena", "2Wiki", em=0.1)], "b": [row("arena", "2Wiki")]})
    with pytest.raises(RunError, match=r"twice/b/metrics\.jsonl:1: arena on 2Wiki again \(first in .*a/metrics"):
        read_run(twice)
    one = make_run(tmp_path / "one", cfg, {"eval": [row("arena", "2Wiki", em=0.1)]})
    two = make_run(tmp_path / "two", cfg, {"eval": [row("arena", "2Wiki", em=0.2)]})
    with pytest.raises(RunError, match=r"two/eval/metrics\.jsonl:1: arena .* on 2Wiki is also in another run"):
        compare([one, two])


def test_published_entries_are_known_methods_in_percent():
    assert len(PUBLISHED) > 500
    for e in PUBLISHED:
        assert is_known_method(e.method), e
        assert isinstance(e.value, float) and 0.0 <= e.value <= 100.0, e
        assert e.where and e.model and e.row
    labels = {(t.paper, t.table, label) for t in TABLES for label, _, _ in t.rows}
    assert labels == set(METHODS)                     # every typed row mapped, no stale mapping
    rows = [(t.paper, t.table, METHODS[(t.paper, t.table, label)], model) for t in TABLES for label, model, _ in t.rows]
    assert len(rows) == len(set(rows))                # one printed row per (method, model) in a table
    assert {(p, t, r) for p, t, r, _, _ in LEFT_OUT} <= labels
    assert all(is_known_method(a) for a in AGENTS)
    assert not any(map(is_known_method, ("flare", "react+xyz", "re2search+dpo-", "Re2Search")))


def test_published_averages_match_their_rows():
    """A check of the typing: each printed Average is the mean of its row's dataset cells (an MC dataset's Acc
    standing in for EM/F1, as RAG-Gym averages) up to the papers' rounding."""
    checked = 0
    for t in TABLES:
        datasets = [d for d in dict.fromkeys(d for d, _ in t.columns) if d != "Average"]
        for label, _, values in t.rows:
            cell = dict(zip(t.columns, values))
            for (d, m), v in cell.items():
                if d == "Average" and v is not None:
                    xs = [cell.get((x, m), cell.get((x, "acc"))) for x in datasets]
                    assert v == pytest.approx(sum(xs) / len(xs), abs=0.1), (t.paper, t.table, label, m)
                    checked += 1
    assert checked >= 100


def test_notebook_runs_on_the_fake_runs(rag_gym_runs, tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("check_notebook", REPO / "notebooks" / "check_notebook.py")
    check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check)
    out = tmp_path / "tables"
    monkeypatch.setenv("JAXRAG_RUNS", ":".join(map(str, rag_gym_runs)))
    monkeypatch.setenv("JAXRAG_TABLES_OUT", str(out))
    ns = check.run_cells(REPO / "notebooks" / "paper_tables.ipynb")
    assert [(t.paper, t.table) for t in ns["tables"]] == [("rag_gym", "table2")]
    assert sorted(p.name for p in out.iterdir()) == ["all.csv", "rag_gym_table2.csv", "rag_gym_table2.md"]
    assert "30.00 / 34.00" in (out / "rag_gym_table2.md").read_text()
    csv_lines = (out / "all.csv").read_text().splitlines()
    assert csv_lines[0].startswith("paper,table,method,model,paper_row,protocol,corpus,dataset,metric,ours,published")
    assert any(ln.startswith("rag_gym,table2,re2search,Llama-3.1-8B-Instruct,Zero-shot Learning / Re²Search,paper,"
                             "–,HotpotQA,em,30.0,34.0,100,") for ln in csv_lines)
    nb = json.loads((REPO / "notebooks" / "paper_tables.ipynb").read_text())
    assert all(not c.get("outputs") for c in nb["cells"] if c["cell_type"] == "code")   # no outputs stored


def test_a_smoke_or_shared_run_never_fills_the_published_row(tmp_path):
    """A 2-question run under the paper's model name sits in a row of its own, labeled with its protocol, n and
    corpus; only a run of the paper's protocol fills the published row."""
    from jaxrag.paths import BENCHMARKS

    cfg = {"paper": "rag_gym", "table": "table2", "model": "Llama-3.1-8B-Instruct"}
    shared = str(BENCHMARKS / "corpus_multihop_contexts.jsonl")
    eval_section = {"policy": {"path": "stage:setup"}, "retriever": {"corpus": shared, "max_passages": 300,
                                                                     "kind": "bm25"}}
    smoke = make_run(tmp_path / "smoke", {**cfg, "eval": eval_section},
                     {"eval": [{**row("re2search", "HotpotQA", em=0.0, f1=0.0), "n": 2}]})
    wiki = {"retriever": {"index_dir": "indexes/wiki", "kind": "hybrid"}, "policy": {"path": "/models/llama"}}
    paper_run = make_run(tmp_path / "paper", {**cfg, "eval": wiki},
                         {"eval": [{**row("re2search", "HotpotQA", em=0.33, f1=0.4), "n": 1000}]})
    shared_run = make_run(tmp_path / "shared", {**cfg, "eval": {"retriever": {"corpus": shared, "kind": "bm25"},
                                                                "policy": {"path": "/models/llama"}}},
                          {"eval": [{**row("re2search", "HotpotQA", em=0.3, f1=0.4), "n": 500}]})
    recorded = make_run(tmp_path / "recorded", {**cfg, "variant": "smoke"},
                        {"eval": [row("direct", "HotpotQA", em=0.1, f1=0.1)]})
    [t] = compare([smoke, paper_run, shared_run, recorded])
    lines = [ln for ln in t.markdown.splitlines() if ln.startswith("| re2search |")]
    published, *others = [dict(zip(["method", "model", "paper_row", "protocol", "n", "corpus"],
                                    [c.strip() for c in ln.strip("|").split("|")][:6])) | {"line": ln} for ln in lines]
    assert published["paper_row"] == "Zero-shot Learning / Re²Search" and published["protocol"] == "paper"
    assert published["n"] == "1000" and published["corpus"] == "indexes/wiki (hybrid)"
    assert "33.00 / 34.00" in published["line"]
    by = {r["protocol"]: r for r in others}
    assert set(by) == {"shared", "smoke"} and all(r["paper_row"] == "–" for r in others)
    assert by["smoke"]["n"] == "2" and by["smoke"]["corpus"] == "corpus_multihop_contexts.jsonl (bm25, first 300)"
    assert "0.00 / –" in by["smoke"]["line"] and by["shared"]["n"] == "500"
    assert any(ln.startswith("| direct | Llama-3.1-8B-Instruct | – | smoke | 100 | – |")   # a recorded variant
               for ln in t.markdown.splitlines())                                          # wins over the config
