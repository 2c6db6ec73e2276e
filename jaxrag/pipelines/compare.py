"""jaxrag's numbers beside the papers' (published.py): read run directories, group them by (paper, table), render
one markdown table each.

A run directory holds `config.json` ({"jaxrag_version", "git_commit", "config": {"paper", "table", "model"?, ...}})
and, per eval stage, `<stage>/metrics.jsonl` with one row per (method, dataset) as jaxrag.pipelines.eval writes
it (fractions in [0, 1]). Training logs in a stage's metrics.jsonl (rows with "kind") are skipped. Several runs,
and several stages of one run, may fill one paper table; the same (method, model, dataset) twice is an error.

`compare(run_dirs)` -> one `Comparison` per (paper, table): rows = (method, model, protocol), columns = the
paper's (dataset, metric) columns then any other dataset ours has, each cell "ours / published" in percent ("–"
where either is missing); `rows` holds the same cells as dicts (one per row x column) for CSV.

Every row says how its numbers were made: the protocol (the run config's `variant` where it records one, else
read from the config: "smoke" for a tiny random checkpoint, "shared" for the files beside the repository, "paper"
for the config's own data paths), n (questions per dataset) and the corpus searched. Only "paper" runs fill a
published row; a smoke or shared run of the same method and model gets a row of its own beside it, so a 2-question
wiring check never reads as a reproduction.
"""
from __future__ import annotations

import csv
import io
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from jaxrag.jsonl import iter_jsonl
from jaxrag.paths import BENCHMARKS
from jaxrag.pipelines.published import PAPERS, PUBLISHED, TABLE_INFO

SCORES = ("em", "cem", "f1", "acc", "lj")   # metrics shown for a dataset the paper's table does not have
METRIC_KEYS = frozenset(SCORES) | {e.metric for e in PUBLISHED}   # must be numbers where a row has them
LABELS = {"em": "EM", "cem": "CEM", "f1": "F1", "acc": "Acc", "lj": "LJ", "agree": "Agree",
          "arena_format": "Format", "arena_relevance": "Relevance"}
DASH = "–"
CSV_FIELDS = ("paper", "table", "method", "model", "paper_row", "protocol", "corpus", "dataset", "metric", "ours",
              "published", "n", "runs")


class RunError(ValueError):
    """A run directory that cannot be read: the message names the directory or file:line."""


@dataclass
class Run:
    path: Path
    paper: str
    table: str
    model: str | None
    results: dict[tuple[str, str], tuple[dict, str]]   # (method, dataset) -> (metrics row, "file:line")
    protocol: str = "paper"   # "paper" | "shared" | "smoke" | a recorded variant
    corpora: dict = field(default_factory=dict)   # eval stage -> the corpus it searched, in words
    stage_of: dict = field(default_factory=dict)   # (method, dataset) -> eval stage


@dataclass
class Comparison:
    paper: str
    table: str
    title: str
    markdown: str
    rows: list[dict] = field(default_factory=list)
    runs: list[str] = field(default_factory=list)


def model_key(name: str | None) -> str:
    """Names of one checkpoint compare equal: "Llama3.1-8B-Instruct" ~ "meta-llama/Llama-3.1-8B-Instruct"."""
    if not name:
        return ""
    return re.sub(r"[^a-z0-9]", "", name.rsplit("/", 1)[-1].lower()).removeprefix("meta")


def protocol_of(cfg: dict) -> str:
    """The run's protocol: its recorded `variant`, else what its config shows (see the module docstring)."""
    if isinstance(cfg.get("variant"), str):
        return cfg["variant"] or "paper"
    sections = [v for v in cfg.values() if isinstance(v, dict)]
    if cfg.get("model") == "tiny-random" or any(str((v.get("policy") or {}).get("path", "")).startswith(
            "stage:setup") for v in sections if isinstance(v.get("policy"), dict)):
        return "smoke"
    shared = str(BENCHMARKS.resolve())
    paths = [str(v["retriever"].get("corpus", "")) for v in sections if isinstance(v.get("retriever"), dict)]
    paths += [str(d.get("path", "")) for v in sections for d in (v.get("datasets") or []) if isinstance(d, dict)]
    return "shared" if any(p and str(Path(p).resolve()).startswith(shared) for p in paths) else "paper"


def corpus_of(section: dict) -> str:
    """An eval stage's corpus in words: the index directory, or the corpus file (with its passage cap)."""
    r = section.get("retriever") if isinstance(section.get("retriever"), dict) else {}
    if r.get("index_dir"):
        return f"{r['index_dir']} ({r.get('kind', 'bm25')})"
    if r.get("corpus"):
        cap = f", first {r['max_passages']}" if r.get("max_passages") else ""
        return f"{Path(str(r['corpus'])).name} ({r.get('kind', 'bm25')}{cap})"
    return DASH


def read_run(path: str | Path) -> Run:
    """One run directory: its config's paper/table/model and every eval row of its stages' metrics.jsonl."""
    path = Path(path)
    cfg_path = path / "config.json"
    if not cfg_path.is_file():
        raise RunError(f"{path}: no config.json (not a jaxrag run directory?)")
    try:
        cfg = json.loads(cfg_path.read_text()).get("config")
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as e:
        raise RunError(f"{cfg_path}: not a JSON object with a 'config' ({e})") from None
    if not isinstance(cfg, dict):
        raise RunError(f"{cfg_path}: no 'config' object")
    for key in ("paper", "table"):
        if not isinstance(cfg.get(key), str) or not cfg[key]:
            raise RunError(f"{path}: config.json's config has no '{key}' (a string, e.g. paper='rag_gym', "
                           f"table='table2'): set it in the run's config file")
    model = cfg.get("model") if isinstance(cfg.get("model"), str) else None
    results: dict[tuple[str, str], tuple[dict, str]] = {}
    stage_of: dict[tuple[str, str], str] = {}
    for mpath in sorted(path.glob("*/metrics.jsonl")):
        for where, row in iter_jsonl(mpath, RunError):
            if not isinstance(row, dict):
                raise RunError(f"{where}: a metrics row must be a JSON object")
            if "kind" in row:       # a training log's row
                continue
            for key in ("method", "dataset"):
                if not isinstance(row.get(key), str) or not row[key]:
                    raise RunError(f"{where}: eval row without '{key}' (a non-empty string)")
            for k, v in row.items():
                if k in METRIC_KEYS and v is not None and (not isinstance(v, (int, float)) or isinstance(v, bool)):
                    raise RunError(f"{where}: '{k}' is {v!r}, not a number")
            key = (row["method"], row["dataset"])
            if key in results:
                raise RunError(f"{where}: {key[0]} on {key[1]} again (first in {results[key][1]})")
            results[key] = (row, where)
            stage_of[key] = mpath.parent.name
    corpora = {s: corpus_of(cfg[s]) for s in set(stage_of.values()) if isinstance(cfg.get(s), dict)}
    return Run(path, cfg["paper"], cfg["table"], model, results, protocol_of(cfg), corpora, stage_of)


def _ours(metrics: dict, metric: str) -> float | None:
    v = metrics.get(metric)
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else 100.0 * v


def _fmt(ours: float | None, published: float | None, decimals: int) -> str:
    """Both with the paper's decimals (more where the paper printed more, e.g. 31.96 in a 1-decimal table)."""
    p = DASH
    if published is not None:
        p = f"{published:.{decimals if round(published, decimals) == published else decimals + 1}f}"
    return f"{DASH if ours is None else f'{ours:.{decimals}f}'} / {p}"


def _average(per_dataset: dict[str, dict], datasets: list[str], metric: str) -> float | None:
    """Ours for the paper's "Average" column: the mean over the table's datasets, a multiple-choice dataset's Acc
    standing in for EM and F1 (RAG-Gym's rule); None unless every dataset has a value."""
    vals = []
    for d in datasets:
        m = per_dataset.get(d, {})
        v = _ours(m, "acc") if m.get("acc") is not None else _ours(m, metric)   # acc: multiple choice only
        if v is None:
            return None
        vals.append(v)
    return sum(vals) / len(vals) if vals else None


def compare_table(paper: str, table: str, runs: list[Run]) -> Comparison:
    """One paper table: published rows first (paper order), then ours-only rows; ours matched by method + model."""
    pub = [e for e in PUBLISHED if (e.paper, e.table) == (paper, table)]
    info = TABLE_INFO.get((paper, table))
    columns = list(info.columns) if info else []
    # ours[(method, model_key)] = {"model": name, "datasets": {dataset: metrics}, "runs": set}
    ours: dict[tuple[str, str], dict] = {}
    pub_models: dict[str, set[str]] = {}
    for e in pub:
        pub_models.setdefault(e.method, set()).add(e.model)
    for run in runs:
        for (method, dataset), (row, where) in run.results.items():
            model = run.model
            if model is None and len(pub_models.get(method, ())) == 1:   # no model named: the paper's only one
                model = next(iter(pub_models[method]))
            slot = ours.setdefault((method, model_key(model), run.protocol),
                                   {"model": model, "datasets": {}, "runs": set(), "corpora": set()})
            if dataset in slot["datasets"]:
                raise RunError(f"{where}: {method} ({model or 'model not named'}) on {dataset} is also in "
                               f"another run of {paper} {table}")
            slot["datasets"][dataset] = row
            slot["runs"].add(str(run.path))
            slot["corpora"].add(run.corpora.get(run.stage_of.get((method, dataset)), DASH))
    extra = sorted({d for s in ours.values() for d in s["datasets"]} - {d for d, _ in columns})
    for d in extra:
        columns += [(d, m) for m in SCORES if any(m in s["datasets"].get(d, {}) for s in ours.values())]
    averaged = [d for d in dict.fromkeys(d for d, _ in info.columns) if d != "Average"] if info else []

    row_keys: dict[tuple[str, str], dict] = {}
    for e in pub:
        r = row_keys.setdefault((e.method, model_key(e.model), "paper"), {"method": e.method, "model": e.model,
                                                                           "paper_row": e.row, "published": {}})
        r["published"][(e.dataset, e.metric)] = e.value
    for key in sorted(ours, key=lambda k: (k[0], k[1], k[2] != "paper", k[2])):
        row_keys.setdefault(key, {"method": key[0], "model": ours[key]["model"], "paper_row": "", "published": {}})

    header = ["Method", "Model", "Paper row", "Protocol", "n", "Corpus"] + [f"{d} {LABELS.get(m, m)}"
                                                                            for d, m in columns]
    md = [f"### {PAPERS.get(paper, paper)} {table.replace('table', 'Table ')}"
          + (f": {info.title}" if info else " (no published numbers typed in)"),
          "", "Cells: ours / published, in percent. Only rows whose protocol is \"paper\" (the config's own data and "
          "index) sit in a published row; smoke and shared runs have rows of their own, with their n and corpus. "
          + (f"Published: {info.where}. " if info else "")
          + "Runs: " + (", ".join(str(r.path) for r in runs) or DASH) + ".", "",
          "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    dict_rows = []
    for key, r in row_keys.items():
        slot = ours.get(key, {"datasets": {}, "runs": set(), "model": None, "corpora": set()})
        protocol = key[2] if slot["datasets"] else DASH
        cells = []
        for d, m in columns:
            o = (_average(slot["datasets"], averaged, m) if d == "Average"
                 else _ours(slot["datasets"].get(d, {}), m))
            p = r["published"].get((d, m))
            cells.append(_fmt(o, p, info.decimals if info else 2))
            dict_rows.append({"paper": paper, "table": table, "method": r["method"], "model": r["model"] or "",
                              "paper_row": r["paper_row"], "protocol": protocol,
                              "corpus": "; ".join(sorted(slot["corpora"])), "dataset": d, "metric": m, "ours": o,
                              "published": p,
                              "n": slot["datasets"].get(d, {}).get("n"),
                              "runs": ";".join(sorted(slot["runs"]))})
        md.append("| " + " | ".join([r["method"], r["model"] or DASH, r["paper_row"] or DASH, protocol,
                                     _sizes(slot["datasets"]), "; ".join(sorted(slot["corpora"])) or DASH]
                                    + cells) + " |")
    return Comparison(paper, table, info.title if info else "", "\n".join(md) + "\n", dict_rows,
                      [str(r.path) for r in runs])


def _sizes(per_dataset: dict[str, dict]) -> str:
    """n per dataset, one number when all agree ("500"), else "HotpotQA 1000, Bamboogle 125"."""
    ns = {d: m.get("n") for d, m in per_dataset.items()}
    if not ns:
        return DASH
    if len(set(ns.values())) == 1:
        return str(next(iter(ns.values())))
    return ", ".join(f"{d} {n}" for d, n in ns.items())


def compare(run_dirs) -> list[Comparison]:
    """Every (paper, table) the runs fill, in the order first seen."""
    groups: dict[tuple[str, str], list[Run]] = {}
    for d in run_dirs:
        run = read_run(d)
        groups.setdefault((run.paper, run.table), []).append(run)
    return [compare_table(p, t, runs) for (p, t), runs in groups.items()]


def to_csv(rows: list[dict]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=CSV_FIELDS)
    w.writeheader()
    for r in rows:
        w.writerow({k: ("" if r[k] is None else (round(r[k], 4) if isinstance(r[k], float) else r[k]))
                    for k in CSV_FIELDS})
    return buf.getvalue()
