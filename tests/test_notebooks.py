"""notebooks/read_runs.ipynb on the tiny pipeline's workdir (paper_tables.ipynb runs in test_compare.py)."""
import importlib.util
import json
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_read_runs_reads_every_part_of_a_pipeline_workdir(synthetic_run, monkeypatch, tmp_path):
    spec = importlib.util.spec_from_file_location("check_notebook", REPO / "notebooks" / "check_notebook.py")
    check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check)
    monkeypatch.setenv("JAXRAG_WORKDIR", synthetic_run[1])
    ns = check.run_cells(REPO / "notebooks" / "read_runs.ipynb", tmp_path / "figures")
    assert ns["missing"] == []                                    # episodes, eval tables, curves: all found
    assert any(name.startswith("eval/episodes_sft_react_test") for name in ns["episodes"])
    assert len(list((tmp_path / "figures").glob("*.png"))) >= 2    # training curves, accuracy by type
    nb = json.loads((REPO / "notebooks" / "read_runs.ipynb").read_text())
    assert all(not c.get("outputs") for c in nb["cells"] if c["cell_type"] == "code")   # no outputs stored
