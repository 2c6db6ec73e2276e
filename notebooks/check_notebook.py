"""Run a notebook's code cells in order, in one namespace, without Jupyter (figures: Agg, saved as PNG).

    JAXRAG_WORKDIR=runs/tiny .venv/bin/python notebooks/check_notebook.py [notebooks/read_runs.ipynb] [--save DIR]
"""
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def run_cells(path: Path, save_dir: Path | None = None) -> dict:
    cells = json.loads(path.read_text())["cells"]
    ns: dict = {"__name__": "__main__"}
    shown = []
    plt.show = lambda *a, **k: shown.extend(plt.get_fignums())   # keep figures to save them
    for i, cell in enumerate(cells):
        if cell["cell_type"] != "code":
            continue
        src = "".join(cell["source"])
        try:
            exec(compile(src, f"{path}[cell {i}]", "exec"), ns)
        except Exception as e:
            raise RuntimeError(f"{path}: code cell {i} failed: {type(e).__name__}: {e}") from e
    if save_dir is not None:
        save_dir.mkdir(parents=True, exist_ok=True)
        for n in sorted(set(shown)):
            plt.figure(n).savefig(save_dir / f"figure_{n}.png", dpi=80)
    return ns


if __name__ == "__main__":
    args = sys.argv[1:]
    save = Path(args[args.index("--save") + 1]) if "--save" in args else None
    args = [a for i, a in enumerate(args) if a != "--save" and (i == 0 or args[i - 1] != "--save")]
    run_cells(Path(args[0] if args else "notebooks/read_runs.ipynb"), save)
