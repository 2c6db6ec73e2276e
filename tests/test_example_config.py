"""README's "Your own model and data" path: a QA file and a corpus in the documented formats, the index command's
build, and configs/example/own_data.py run end to end (with a tiny random checkpoint standing in for the model)."""
import importlib.util
import json
from pathlib import Path

from jaxrag.main import run
from jaxrag.retrieval.build import build_all

ROOT = Path(__file__).resolve().parents[1]


def test_own_data_config_runs_on_the_documented_formats(tmp_path):
    from jaxrag.pipelines.rl import tiny_checkpoint_config

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(p) + "\n" for p in [
        {"id": "p1", "title": "Eternity and a Day", "text": "Eternity and a Day is a 1998 film directed by Theo "
                                                            "Angelopoulos. It won the Palme d'Or."},
        {"id": "p2", "contents": "\"Theo Angelopoulos\"\nTheo Angelopoulos was a Greek film director."},
        {"id": "p3", "title": "Cannes", "text": "Cannes hosts a film festival every May."}]))
    qa = tmp_path / "my_qa.jsonl"
    qa.write_text(json.dumps({"id": "q1", "question": "Who directed the film that won the 1998 Palme d'Or?",
                              "golden_answers": ["Theo Angelopoulos"]}) + "\n")
    workdir = tmp_path / "run"
    build_all(corpus, workdir / "indexes" / "mine", bm25=("bm25s",), dense=False)   # the README's index command
    spec = importlib.util.spec_from_file_location("own_data", ROOT / "configs" / "example" / "own_data.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    c = mod.get_config()
    c.stages = ["setup", "eval"]
    c.setup = tiny_checkpoint_config(str(corpus))
    c.eval.policy.path = "stage:setup"
    c.eval.datasets[0]["path"] = str(qa)
    c.eval.rollout.update(dict(max_steps=2, max_new_tokens=8))
    assert run(c, workdir) == ["setup", "eval"]
    rows = [json.loads(line) for line in (workdir / "eval" / "metrics.jsonl").read_text().splitlines()]
    assert {(r["method"], r["dataset"], r["n"]) for r in rows} == {("rag", "MyQA", 1), ("react", "MyQA", 1)}
    table = (workdir / "eval" / "table.md").read_text()
    assert "| rag |" in table and "| react |" in table and "MyQA" in table
