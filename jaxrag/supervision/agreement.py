"""Annotator agreement between process-reward sources (RAG-Gym Table 4 analogue).

Two sources' records are matched on the same states: key = (qid, step, the executed history's actions), so two
records of one question at the same depth but after different histories (MCTS siblings) are never conflated.
Within a state, candidates are matched by their raw text (whitespace-normalized); a text that occurs more than
once at a state (the same action sampled twice) takes the mean of its scores under a source; candidates without
a score (judge failures) are left out.

Pairwise ranking agreement of B with A = among the candidate pairs at matched states whose scores DIFFER under A,
the fraction that B orders the same way. A tie under B counts as a disagreement (B failed to separate what A
separated), so a constant source scores 0, not 0.5; pairs tied under A are not counted. `pairs` is the
denominator; agreement is None when it is 0.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Mapping, Sequence

from jaxrag.env.parsing import canon
from jaxrag.supervision.records import ProcessRecord, failures_line, judge_failures


def state_key(rec: ProcessRecord) -> tuple:
    return (rec.qid, rec.step, tuple((s.action.kind, canon(s.action.text)) for s in rec.history))


def _scores(rec: ProcessRecord) -> dict[str, float]:
    acc: dict[str, list[float]] = {}
    for c in rec.candidates:
        if c.score is not None:
            acc.setdefault(canon(c.raw), []).append(float(c.score))
    return {t: sum(v) / len(v) for t, v in acc.items()}


def _by_state(records: Sequence[ProcessRecord]) -> dict[tuple, dict[str, float]]:
    out: dict[tuple, dict[str, float]] = {}
    for r in records:
        out.setdefault(state_key(r), {}).update(_scores(r))
    return out


def pairwise_agreement(a: Sequence[ProcessRecord], b: Sequence[ProcessRecord]) -> dict:
    """{"agreement", "pairs", "agree", "ties_b", "states"}: how often B orders A's strict pairs as A does."""
    sa, sb = _by_state(a), _by_state(b)
    agree = n = ties = states = 0
    for key in sa.keys() & sb.keys():
        xa, xb = sa[key], sb[key]
        texts = sorted(xa.keys() & xb.keys())
        if len(texts) < 2:
            continue
        states += 1
        for i, ti in enumerate(texts):
            for tj in texts[i + 1:]:
                da = xa[ti] - xa[tj]
                if da == 0:
                    continue
                n += 1
                db = xb[ti] - xb[tj]
                if db == 0:
                    ties += 1
                elif (da > 0) == (db > 0):
                    agree += 1
    return {"agreement": agree / n if n else None, "pairs": n, "agree": agree, "ties_b": ties, "states": states}


def agreement_table(sources: Mapping[str, Sequence[ProcessRecord]], reference: str = "oracle") -> list[dict]:
    """One row per source other than `reference`: its agreement with the reference's strict pairs, and the states
    its judge failed on, with the reasons by kind (a judge that failed everywhere reads "n/a | 0 | ..." and says
    why, not only zeros)."""
    if reference not in sources:
        raise ValueError(f"agreement_table: reference source {reference!r} not among {sorted(sources)}")
    rows = []
    for name, recs in sources.items():
        if name == reference:
            continue
        fails = judge_failures(recs)
        rows.append({"source": name, "reference": reference, **pairwise_agreement(sources[reference], recs),
                     "failed_states": fails["failed_states"], "failures": failures_line(fails) or "-"})
    return rows


COLUMNS = ("source", "reference", "agreement", "pairs", "agree", "ties_b", "states", "failed_states", "failures")


def _fmt(v) -> str:
    if v is None:
        return "n/a"
    return f"{100 * v:.1f}%" if isinstance(v, float) else str(v)


def agreement_markdown(rows: Sequence[dict]) -> str:
    head = "| " + " | ".join(COLUMNS) + " |\n|" + "---|" * len(COLUMNS) + "\n"
    body = "".join("| " + " | ".join(_fmt(r.get(c)) for c in COLUMNS) + " |\n" for r in rows)
    note = ("\nagreement: fraction of candidate pairs with different reference scores that the source orders the "
            "same way (a tie under the source counts as disagreement); pairs: those pairs; failed_states: states the "
            "source's judge failed on (no scores), with the reasons by kind.\n")
    return head + body + note


def agreement_csv(rows: Sequence[dict]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(COLUMNS), extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({c: ("" if r.get(c) is None else r.get(c)) for c in COLUMNS})
    return buf.getvalue()


def write_agreement(rows: Sequence[dict], out_dir: str | Path, name: str = "agreement") -> dict[str, Path]:
    """<out_dir>/<name>.md and <name>.csv; returns both paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    md, cs = out / f"{name}.md", out / f"{name}.csv"
    md.write_text(agreement_markdown(rows), encoding="utf-8")
    cs.write_text(agreement_csv(rows), encoding="utf-8")
    return {"markdown": md, "csv": cs}
