"""Evaluation: agent x dataset -> episodes JSONL + metrics + a RAG-Gym-Table-2-style markdown/CSV table.

`evaluate(policy, retriever, agent, examples, ...) -> (episodes, metrics)`; `episode_metrics`; `results_table`.
The stage that runs it from a config is jaxrag.pipelines.eval:eval_stage.
"""
from __future__ import annotations

import csv
import dataclasses
import io
import logging
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
from scipy import stats

from jaxrag import metrics as M
from jaxrag.env.mdp import Episode, write_episodes
from jaxrag.env.rollout import RolloutConfig, rollout
from jaxrag.judge import verdict_record

log = logging.getLogger(__name__)


def episode_metrics(episodes: Sequence[Episode], judge=None, answer_of: Callable[[Episode], str | None] | None = None
                    ) -> dict:
    """Aggregate metrics (fractions in [0, 1]) over finished episodes. `answer_of(ep)`: the answer EM, F1, CEM, SE
    and Acc score (the agent's `scored_answer`: SmartSearch's released evaluation reads its last <answer>'s \\boxed{});
    None: each episode's executed answer."""
    n = len(episodes)
    if n == 0:
        return {"n": 0}
    mc = any(ep.choices for ep in episodes)
    scored = [answer_of(ep) for ep in episodes] if answer_of is not None else [ep.answer for ep in episodes]
    if all(ep.agent == "arena" for ep in episodes):   # ARENA's Table 2: its evaluate.py's EM and F1 (first closed
        answers = [M.arena_code_section(ep.steps[-1].action.raw if ep.steps else "", "answer") for ep in episodes]
        em = [M.arena_exact_match(a, ep.gold) for a, ep in zip(answers, episodes)]   # <answer>, ARENA normalization)
        f1 = [M.arena_f1(a, ep.gold) for a, ep in zip(answers, episodes)]
    else:
        em = [M.exact_match(a, ep.gold) for a, ep in zip(scored, episodes)]
        f1 = [M.f1_score(a, ep.gold) for a, ep in zip(scored, episodes)]
    out: dict[str, Any] = {
        "n": n,
        "em": float(np.mean(em)), "f1": float(np.mean(f1)),
        "cem": float(np.mean([M.cover_exact_match(a, ep.gold) for a, ep in zip(scored, episodes)])),
        "answered": float(np.mean([ep.answer is not None for ep in episodes])),
        "invalid_rate": M.invalid_rate([ep.num_invalid for ep in episodes], [len(ep.steps) for ep in episodes]),
        "episodes_with_invalid": float(np.mean([ep.num_invalid > 0 for ep in episodes])),
        "steps_mean": float(np.mean([len(ep.steps) for ep in episodes])),
        "return_mean": float(np.mean([ep.ret for ep in episodes])),
        "se": M.search_efficiency(f1, [ep.num_searches for ep in episodes]),
    }
    if mc:
        out["acc"] = float(np.mean([M.choice_accuracy(a, ep.gold, ep.choices) for a, ep in zip(scored, episodes)]))
    out.update(retrieval_metrics(episodes, mc))
    out.update({f"searches_{k}": v for k, v in M.search_count_stats(ep.num_searches for ep in episodes).items()})
    for reason in ("answer", "max_steps", "invalid"):
        out[f"done_{reason}"] = float(np.mean([ep.done == reason for ep in episodes]))
    if any(ep.agent == "arena" for ep in episodes):   # Table 2's Format and Relevance: the released code's scores
        fmt, rel = [], []
        for ep in episodes:
            raw = ep.steps[-1].action.raw if ep.steps else ""
            fmt.append(M.arena_code_format(raw))
            rel.append(M.arena_code_relevance(raw, ep.metadata.get("gold_ref_ids", [])))
        out["arena_format"], out["arena_relevance"] = float(np.mean(fmt)), float(np.mean(rel))
    if judge is not None:
        out.update(judge_episodes(episodes, judge))
    return out


def episode_docs(ep: Episode) -> list:
    """Every document the episode's policy saw: its references (ARENA) and each search step's results."""
    return list(ep.references) + [d for step in ep.steps for d in step.docs]


def retrieval_metrics(episodes: Sequence[Episode], mc: bool = False) -> dict:
    """What the episodes' retrieval found, so a retrieval gap is not read as a policy gap: answer_recall (a golden
    answer occurs in some document the episode saw; FlashRAG's retrieval recall; not for multiple choice) and,
    over the episodes whose question lists supporting titles, gold_recall (the fraction of those titles among the
    documents seen) with gold_recall_n (how many episodes have them)."""
    out: dict[str, Any] = {}
    docs = [episode_docs(ep) for ep in episodes]
    if not mc:
        out["answer_recall"] = float(np.mean([M.answer_in_docs(ep.gold, [d.text for d in ds])
                                              for ep, ds in zip(episodes, docs)]))
    recalls = [M.title_recall(ep.metadata.get("supporting_titles", []), [d.title for d in ds])
               for ep, ds in zip(episodes, docs)]
    recalls = [r for r in recalls if r is not None]
    if recalls:
        out["gold_recall"], out["gold_recall_n"] = float(np.mean(recalls)), len(recalls)
    return out


def index_recall(retriever, examples: Sequence, k: int, corpus_titles: set[str] | None = None) -> dict:
    """The index's own recall for a dataset, with no policy in the loop: each question itself as the query, top k.
    index_answer_recall@k (a golden answer in some hit; not for multiple choice), index_gold_recall@k (mean fraction
    of the supporting titles among the hits, over questions that list them) and, given the corpus' titles
    (metrics.title_key of each), gold_in_index: the fraction of all the dataset's supporting titles that the corpus
    holds at all (a low value says the corpus lacks the gold paragraphs: no policy can find them)."""
    out: dict[str, Any] = {"k": k, "n": len(examples)}
    if not examples:
        return out
    hits = retriever.search([ex.question for ex in examples], k)
    if not any(ex.choices for ex in examples):
        out["answer_recall"] = float(np.mean([M.answer_in_docs(ex.golden_answers, [h.text for h in hs])
                                              for ex, hs in zip(examples, hits)]))
    recalls = [M.title_recall(ex.supporting_titles, [h.title for h in hs]) for ex, hs in zip(examples, hits)]
    recalls = [r for r in recalls if r is not None]
    out["with_gold_titles"] = len(recalls)
    if recalls:
        out["gold_recall"] = float(np.mean(recalls))
        if corpus_titles is not None:
            gold = {M.title_key(t) for ex in examples for t in ex.supporting_titles if t.strip()}
            out["gold_in_index"] = len(gold & corpus_titles) / len(gold)
    return out


def recall_table(rows: dict[str, dict]) -> str:
    """Markdown: one row per dataset of index_recall results (percentages; "–" where a value does not apply)."""
    def pct(m: dict, key: str) -> str:
        return f"{100 * m[key]:.1f}" if key in m else "–"

    k = next(iter(rows.values()), {}).get("k", "k")
    md = [f"| dataset | n | with gold titles | gold titles in index | gold-title recall@{k} | answer recall@{k} |",
          "|---|---|---|---|---|---|"]
    for name, m in rows.items():
        md.append(f"| {name} | {m.get('n', 0)} | {m.get('with_gold_titles', 0)} | {pct(m, 'gold_in_index')} | "
                  f"{pct(m, 'gold_recall')} | {pct(m, 'answer_recall')} |")
    return "\n".join(md) + "\n"


def failure_kind(failure: str) -> str:
    """'HTTP 429 (Retry-After 2s)' -> 'HTTP 429'; 'unparseable reply: ...' -> 'unparseable reply'."""
    head = failure.split(":", 1)[0].split(" (", 1)[0].strip()
    return " ".join(head.split()[:2]) if head.startswith(("HTTP", "timeout")) else head


def judge_episodes(episodes: Sequence[Episode], judge) -> dict:
    """LJ (judge: jaxrag.judge.OpenAIJudge, `workers` requests at a time) over the episodes the judge could judge,
    with the counts that say how far to trust it: lj_judged, lj_failed and lj_failures ({kind: count}). Each episode
    keeps its own record in metadata["lj"] (jaxrag.judge.verdict_record), so the episodes file says which items were
    not judged and why."""
    verdicts, kinds = [], {}
    results = judge.judge_answers([(ep.gold, ep.answer) for ep in episodes])
    for ep, (verdict, r) in zip(episodes, results):  # r None: no answer to judge (verdict False)
        ep.metadata["lj"] = rec = verdict_record(verdict, r)
        if verdict is None:
            kind = failure_kind(rec["failure"])
            kinds[kind] = kinds.get(kind, 0) + 1
        verdicts.append(verdict)
    ok = [v for v in verdicts if v is not None]
    if kinds:
        log.warning("LJ judge failed on %d of %d answers (%s)", len(verdicts) - len(ok), len(verdicts),
                    ", ".join(f"{k}: {n}" for k, n in sorted(kinds.items())))
    return {"lj": float(np.mean(ok)) if ok else float("nan"), "lj_judged": len(ok),
            "lj_failed": len(verdicts) - len(ok), "lj_failures": kinds}


def evaluate(policy, retriever, agent, examples: Sequence, *, cfg: RolloutConfig | None = None, judge=None,
             out_path: str | Path | None = None, select=None, summarizer=None, **overrides) -> tuple[list[Episode], dict]:
    """Roll out `agent` on `examples`; returns (episodes, metrics). `overrides` update the RolloutConfig."""
    cfg = cfg or RolloutConfig()
    if overrides:
        cfg = dataclasses.replace(cfg, **overrides)
    stats: dict = {}
    episodes = rollout(policy, retriever, agent, examples, cfg, select=select, summarizer=summarizer, stats=stats)
    m = episode_metrics(episodes, judge=judge, answer_of=getattr(agent, "scored_answer", None))
    m["timing"] = {k: round(v, 4) if isinstance(v, float) else v for k, v in stats.items()}
    if stats.get("total_s"):
        m["episodes_per_s"] = len(episodes) / stats["total_s"]
    if out_path is not None:
        write_episodes(out_path, episodes)
    return episodes, m


# ---- tables ---------------------------------------------------------------------------------------------
def _is_mc(metrics: dict) -> bool:
    return "acc" in metrics


def results_table(results: dict[str, dict[str, dict]], datasets: Sequence[str] | None = None) -> tuple[str, str]:
    """results[method][dataset] = metrics -> (markdown, csv), laid out like RAG-Gym Table 2:
    EM / F1 per open-domain dataset, Acc for multiple choice, then Avg EM / Avg F1 over open-domain ones
    (and Avg over all datasets, counting Acc for MC and F1 otherwise). Values in percent. Where a judge ran, each
    dataset also gets LJ and "judged/n" (LJ averages only the answers the judge could judge)."""
    datasets = list(datasets or dict.fromkeys(d for r in results.values() for d in r))
    mc = {d: any(_is_mc(r.get(d, {})) for r in results.values()) for d in datasets}
    lj = {d: any("lj" in r.get(d, {}) for r in results.values()) for d in datasets}
    header = ["Method"]
    for d in datasets:
        header += [f"{d} Acc"] if mc[d] else [f"{d} EM", f"{d} F1"]
        header += [f"{d} LJ", f"{d} LJ judged/n"] if lj[d] else []
    header += ["Avg EM", "Avg F1"] + (["Avg"] if any(mc.values()) else [])
    rows = []
    for method, per in results.items():
        row: list[Any] = [method]
        ems, f1s, alls = [], [], []
        for d in datasets:
            m = per.get(d)
            if m is None or not m.get("n"):
                row += ([None] if mc[d] else [None, None]) + ([None, None] if lj[d] else [])
                continue
            if mc[d]:
                row.append(100 * m["acc"])
                alls.append(100 * m["acc"])
            else:
                row += [100 * m["em"], 100 * m["f1"]]
                ems.append(100 * m["em"])
                f1s.append(100 * m["f1"])
                alls.append(100 * m["f1"])
            if lj[d]:  # LJ is over the answers the judge could judge: say how many
                judged = m.get("lj_judged")
                row += [100 * m["lj"] if judged else None, f"{judged}/{m['n']}" if "lj" in m else None]
        row += [np.mean(ems) if ems else None, np.mean(f1s) if f1s else None]
        if any(mc.values()):
            row.append(np.mean(alls) if alls else None)
        rows.append(row)
    fmt = lambda v: "-" if v is None else (f"{v:.2f}" if isinstance(v, (float, np.floating)) else str(v))
    md = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    md += ["| " + " | ".join(fmt(v) for v in r) + " |" for r in rows]
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(header)
    for r in rows:
        w.writerow(["" if v is None else (round(float(v), 4) if not isinstance(v, str) else v) for v in r])
    return "\n".join(md) + "\n", buf.getvalue()


# --- intervals: how far a score or a difference of scores is from noise ------------------------------------------


def binomial_se(p: float, n: int) -> float:
    """Standard error of a share p measured on n independent questions (one seed): sqrt(p (1 - p) / n)."""
    return float(np.sqrt(p * (1.0 - p) / n)) if n > 0 else float("nan")


def mean_se(values: Sequence[float]) -> tuple[float, float]:
    """(mean, standard error of the mean) over seeds: sample standard deviation (ddof 1) / sqrt(n); SE is nan for
    one value (no spread to measure)."""
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0:
        raise ValueError("mean_se: no values")
    se = float(v.std(ddof=1) / np.sqrt(v.size)) if v.size > 1 else float("nan")
    return float(v.mean()), se


def paired_bootstrap(a, b, *, n_boot: int = 10_000, level: float = 0.95, seed: int = 0) -> dict:
    """Percentile bootstrap interval of mean(a - b) for two systems scored on the same questions under the same seeds.

    a, b: per-question scores, shape [seeds, questions] (or [questions] for one seed), row s of both from seed s and
    column q from question q. Each replicate resamples seeds and, independently, questions with replacement (the
    two-way bootstrap: both the training noise across seeds and the sampling of questions), keeping every pair
    together; its statistic is the mean difference over the resampled cells. Returns {"diff", "lo", "hi", "level",
    "n_seeds", "n_questions", "share_le_0"} (share_le_0: the share of replicates <= 0, a one-sided bootstrap p for
    "a is better")."""
    a, b = np.atleast_2d(np.asarray(a, np.float64)), np.atleast_2d(np.asarray(b, np.float64))
    if a.shape != b.shape:
        raise ValueError(f"paired_bootstrap: a is {a.shape}, b is {b.shape}; the two systems must be scored on the "
                         "same seeds x questions")
    if a.size == 0:
        raise ValueError("paired_bootstrap: no questions")
    d = a - b
    s, q = d.shape
    rng = np.random.default_rng(seed)
    ws = rng.multinomial(s, np.full(s, 1.0 / s), size=n_boot).astype(np.float64)   # [B, S] seed counts
    wq = rng.multinomial(q, np.full(q, 1.0 / q), size=n_boot).astype(np.float64)   # [B, Q] question counts
    reps = np.einsum("bs,sq,bq->b", ws, d, wq) / (s * q)
    lo, hi = np.quantile(reps, [(1 - level) / 2, 1 - (1 - level) / 2])
    return {"diff": float(d.mean()), "lo": float(lo), "hi": float(hi), "level": level, "n_seeds": s,
            "n_questions": q, "share_le_0": float(np.mean(reps <= 0))}


def paired_components(a, b, *, level: float = 0.95, power: float = 0.8) -> dict:
    """The paired difference of two systems scored on the same seeds x questions, by variance components.

    d[s, q] = a - b is modelled as mean + seed effect + question effect + residual, seeds and questions both random
    (a crossed design without replication). From the two-way ANOVA's mean squares (Satterthwaite's degrees of freedom
    for their combination), the standard error of mean(d) is sqrt(var_seed / S + var_question / Q + var_resid / (S Q)),
    components below 0 set to 0. The two-way bootstrap counts the residual twice (once with the seeds, once with the
    questions), so its interval is wider than this one (tests/test_intervals.py simulates it). One seed: the question
    SE sd(d) / sqrt(Q) (no seed variance can be measured). Returns {"diff", "se", "lo", "hi", "df", "mde",
    "disagree", "var_seed", "var_question", "var_resid", "level", "power", "n_seeds", "n_questions"}: the t interval at
    `level`, `mde` the smallest true difference detected with probability `power` by a two-sided test at 1 - level
    with this SE ((t_{1-alpha/2} + t_power) * se), `disagree` the share of cells where a != b (for EM: the questions
    on which the two systems' answers differ in correctness)."""
    a, b = np.atleast_2d(np.asarray(a, np.float64)), np.atleast_2d(np.asarray(b, np.float64))
    if a.shape != b.shape:
        raise ValueError(f"paired_components: a is {a.shape}, b is {b.shape}; the two systems must be scored on the "
                         "same seeds x questions")
    d = a - b
    s, q = d.shape
    if q < 2:
        raise ValueError(f"paired_components: {q} question(s); an interval needs at least 2")
    mean = float(d.mean())
    seed_means, q_means = d.mean(axis=1), d.mean(axis=0)
    if s == 1:
        var_seed, var_q, var_e = float("nan"), float(d.var(ddof=1)), float("nan")
        var, df = var_q / q, q - 1.0
    else:
        ms_seed = q * float(((seed_means - mean) ** 2).sum()) / (s - 1)
        ms_q = s * float(((q_means - mean) ** 2).sum()) / (q - 1)
        resid = d - seed_means[:, None] - q_means[None, :] + mean
        ms_e = float((resid ** 2).sum()) / ((s - 1) * (q - 1))
        var_seed, var_q, var_e = max(0.0, (ms_seed - ms_e) / q), max(0.0, (ms_q - ms_e) / s), ms_e
        # var(mean) as a combination of mean squares: sum_i c_i MS_i, each MS_i with its own degrees of freedom
        terms = [(ms_e / (s * q), (s - 1) * (q - 1))]
        if var_seed > 0:
            terms.append(((ms_seed - ms_e) / (s * q), s - 1))
        if var_q > 0:
            terms.append(((ms_q - ms_e) / (s * q), q - 1))
        var = var_seed / s + var_q / q + var_e / (s * q)
        df = var ** 2 / sum(t ** 2 / f for t, f in terms) if var > 0 else float((s - 1) * (q - 1))
    se = float(np.sqrt(var))
    t = float(stats.t.ppf(1 - (1 - level) / 2, df))
    return {"diff": mean, "se": se, "lo": mean - t * se, "hi": mean + t * se, "df": float(df),
            "mde": (t + float(stats.t.ppf(power, df))) * se, "disagree": float(np.mean(a != b)),
            "var_seed": var_seed, "var_question": var_q, "var_resid": var_e, "level": level, "power": power,
            "n_seeds": s, "n_questions": q}


def describe_difference(name_a: str, name_b: str, r: dict) -> str:
    """One line worded by the interval: a difference only where the interval excludes 0."""
    span = f"{r['diff']:+.3f} [{r['lo']:+.3f}, {r['hi']:+.3f}]"
    n = f"n = {r['n_seeds']} seeds x {r['n_questions']} questions"
    if r["lo"] > 0:
        return f"{name_a} above {name_b}: {span} ({n})"
    if r["hi"] < 0:
        return f"{name_a} below {name_b}: {span} ({n})"
    return f"{name_a} vs {name_b}: no difference detectable, {span} ({n})"
