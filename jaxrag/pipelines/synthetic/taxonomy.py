"""Where a synthetic-world episode went wrong, read off its question's gold chain.

A hop is resolved once its gold passage has been retrieved. Every episode gets one kind, the first that applies:
  correct       EM 1
  invalid       ended on an action that did not parse
  out_of_steps  no answer within the step budget
  prompt_cut    every hop resolved, but a retrieved gold passage was missing from the answer's prompt (the agent
                shortened the history to fit the prompt budget)
  copy_error    every hop resolved and in the prompt, yet the answer is wrong (a name miscopied or the wrong one)
  premature     answered with a hop open, without a query since the last hop resolved
  misnamed      queries since the last hop resolved, none writing an open hop's entity name exactly: the policy
                miscopied the bridge name (and often went on with the wrong entity the query found)
  missed_once   one query since then named an open hop's entity, retrieval missed its passage, then an answer
  missed_retry  two or more such queries, all missed
"""

from __future__ import annotations

import collections

from jaxrag import metrics as M
from jaxrag.data.synthetic.teacher import GENERIC
from jaxrag.env.mdp import INVALID, QUERY

KINDS = ("correct", "invalid", "out_of_steps", "prompt_cut", "copy_error", "premature", "misnamed", "missed_once",
         "missed_retry")
FAILURES = KINDS[1:]


def error_kind(ep, question: dict) -> str:
    """The kind of one episode (module doc); `question` is its record with metadata.gold_chain."""
    hops = question["metadata"]["gold_chain"]
    if M.exact_match(ep.answer, ep.gold):
        return "correct"
    if ep.done == "invalid" or (ep.steps and ep.steps[-1].action.kind == INVALID and ep.answer is None):
        return "invalid"
    if ep.answer is None:
        return "out_of_steps"
    seen: set[str] = set()
    since = []   # queries issued since the last step that resolved a new hop
    for step in ep.steps:
        if step.action.kind != QUERY:
            continue
        before = sum(h["passage_id"] in seen for h in hops)
        seen.update(d.doc_id for d in step.docs)
        since = [] if sum(h["passage_id"] in seen for h in hops) > before else since + [step.action.text]
    open_hops = [h for h in hops if h["passage_id"] not in seen]
    if not open_hops:
        prompt = ep.steps[-1].prompt if ep.steps else ""
        gold_text = {d.doc_id: d.text for s in ep.steps for d in s.docs}
        cut = any(gold_text[h["passage_id"]] not in prompt for h in hops)
        return "prompt_cut" if cut else "copy_error"
    if not since:
        return "premature"
    names = [h["entity"].lower() for h in open_hops]
    named = sum(any(n in q.lower() for n in names) for q in since)
    return "misnamed" if named == 0 else "missed_once" if named == 1 else "missed_retry"


def vague(ep) -> bool:
    """Whether the episode issued a vague query: one with a generic phrase ("the person") where a name belongs (the
    teacher's vague flaw, and the positive control's planted one), whatever the outcome."""
    return any(s.action.kind == QUERY and any(g in s.action.text.lower() for g in GENERIC.values())
               for s in ep.steps)


def taxonomy(episodes, questions: dict[str, dict]) -> dict:
    """Counts and shares of every kind over `episodes` ({qid: question record}), overall and per question type, and
    the share of episodes with a vague query."""
    def summary(eps):
        counts = collections.Counter(error_kind(ep, questions[ep.qid]) for ep in eps)
        return {"n": len(eps), "counts": {k: counts[k] for k in KINDS},
                "shares": {k: counts[k] / len(eps) if eps else 0.0 for k in KINDS},
                "vague": sum(map(vague, eps)) / len(eps) if eps else 0.0}

    by_type = collections.defaultdict(list)
    for ep in episodes:
        by_type[questions[ep.qid]["metadata"]["type"]].append(ep)
    return {"all": summary(list(episodes)), "by_type": {t: summary(by_type[t]) for t in sorted(by_type)}}


def taxonomy_table(rows: dict[str, dict]) -> str:
    """Markdown: one row per system (its `taxonomy(...)["all"]`): n, EM, each failure kind's share of all episodes
    and the share of episodes with a vague query."""
    lines = ["| system | n | EM | " + " | ".join(k.replace("_", " ") for k in FAILURES) + " | vague query |",
             "|" + "---|" * (len(FAILURES) + 4)]
    for name, t in rows.items():
        lines.append(f"| {name} | {t['n']} | {t['shares']['correct']:.3f} | "
                     + " | ".join(f"{t['shares'][k]:.3f}" for k in FAILURES) + f" | {t['vague']:.3f} |")
    return "\n".join(lines)
