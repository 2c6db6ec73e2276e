"""Judges: an OpenAI-compatible HTTP endpoint, a local Policy, and the synthetic world's oracle (one protocol).

A request (judge_protocol.JudgeRequest) becomes one or more chat calls with the papers' prompts (prompts.py):
"rank" one call for all valid candidates; "step_score", "usefulness", "refine" one call per candidate. Invalid
candidates are never shown to a judge: they score 0 and rank after every judged candidate (candidate order), also
under "rank" (where a valid candidate scores 1/(1+rank)), so an unparseable action is never a preferred one.
A reply that does not parse is retried like a transport error (bounded); after the last attempt the request's
JudgeResult has scores=None and `failure` naming the call and the reason, with the reply text kept.

Two request conventions for "step_score", "usefulness" and "refine" (`judged_steps`):
  next actions   candidates are actions after `state.history`, not executed; the documents a candidate query
                 retrieved, where known, are `metadata["candidate_docs"][i]`;
  executed step  the judged step is the LAST item of `state.history` and `candidates == [its action]`
                 (supervision.smartsearch, supervision.mcts): recognized by `metadata["in_history"]` (true/false
                 decides), else by `metadata["step"] == len(history) - 1` with that step's action as the candidate.
"usefulness" needs the judged query's documents (the oracle searches itself when they are absent).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import time
from typing import Callable, Sequence

from jaxrag.data.synthetic.teacher import QUERY_TEMPLATES
from jaxrag.env.mdp import ANSWER, INVALID, QUERY, Doc, Step
from jaxrag.env.parsing import canon
from jaxrag.env.rollout import RolloutConfig
from jaxrag.judge import OpenAIJudge
from jaxrag.metrics import exact_match
from jaxrag.supervision import prompts as P
from jaxrag.supervision.judge_protocol import KINDS, JudgeRequest, JudgeResult
from jaxrag.supervision.records import ProcessRecord, ScoredCandidate


def ranks_from_scores(scores: Sequence[float]) -> list[int]:
    """0 = best; equal scores keep candidate order."""
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
    ranks = [0] * len(scores)
    for r, i in enumerate(order):
        ranks[i] = r
    return ranks


def join_notes(notes: Sequence[str]) -> str:
    """Per-candidate rationale: "[i] note" lines; a single candidate's note as it is."""
    return notes[0] if len(notes) == 1 else "\n".join(f"[{i}] {x}" for i, x in enumerate(notes))


def candidate_notes(result: JudgeResult, n: int) -> list[str]:
    """The per-candidate part of a result's rationale (lines "[i] ..."); other text goes to every candidate."""
    notes = [""] * n
    other = []
    for line in (result.rationale or "").splitlines():
        head, _, rest = line.partition("] ")
        if head.startswith("[") and head[1:].isdigit() and int(head[1:]) < n:
            notes[int(head[1:])] = rest
        elif line.strip():
            other.append(line)
    if other:
        notes = [(x + " | " if x else "") + "\n".join(other) for x in notes]
    return notes


# ------------------------------------------------------------------------------------ request -> chat calls
@dataclasses.dataclass
class Call:
    messages: list[dict]
    parse: Callable[[str], P.Parsed]
    cands: list[int]  # the request's candidate indices this call judges


@dataclasses.dataclass
class Outcome:
    parsed: P.Parsed | None
    failure: str = ""
    reply: str = ""
    attempts: int = 0
    seconds: float = 0.0


def _candidate_docs(req: JudgeRequest, i: int) -> list[Doc] | None:
    docs = req.metadata.get("candidate_docs")
    if docs is None or i >= len(docs) or docs[i] is None:
        return None
    return [Doc.of(d) for d in docs[i]]


def executed_step_request(req: JudgeRequest) -> bool:
    """True when the request judges the last step of `state.history` (see the module doc)."""
    hist, meta = req.state.history, req.metadata
    if req.kind == "rank" or len(req.candidates) != 1 or not hist:
        return False
    if "in_history" in meta:
        return bool(meta["in_history"])
    return meta.get("step") == len(hist) - 1 and hist[-1].action == req.candidates[0]


def judged_steps(req: JudgeRequest) -> tuple[list[Step], list[Step], list[bool]]:
    """(history before the judged round, one judged Step per candidate, whether its documents are known)."""
    hist = list(req.state.history)
    if executed_step_request(req):
        return hist[:-1], [hist[-1]], [True]
    known = [_candidate_docs(req, i) for i in range(len(req.candidates))]
    return hist, [Step(action=a, docs=d or []) for a, d in zip(req.candidates, known)], [d is not None for d in known]


def plan_calls(req: JudgeRequest, opts: P.PromptOptions) -> list[Call] | str:
    """The chat calls one request needs, or the reason it cannot be judged at all."""
    if req.kind not in KINDS:
        return f"unknown request kind {req.kind!r} (known: {KINDS})"
    q, cands = req.state.question, req.candidates
    valid = [i for i, a in enumerate(cands) if a.kind != INVALID]
    if req.kind == "rank":
        if not valid:
            return []
        n = len(valid)
        return [Call(P.rank_messages(q, req.state.history, [cands[i] for i in valid], opts),
                     lambda r, n=n: P.parse_rank(r, n, opts.rank_parse), valid)]
    hist, judged, known = judged_steps(req)
    if req.kind == "step_score":
        variant = opts.step_score_variant
        return [Call(P.step_score_messages(q, req.gold, hist, judged[i], opts),
                     lambda r: P.parse_step_score(r, variant), [i]) for i in valid]
    queries = [i for i in valid if cands[i].kind == QUERY]
    calls = []
    for i in queries:
        if req.kind == "usefulness":
            if not known[i]:
                return (f"candidate {i}: usefulness needs the documents the query retrieved (metadata"
                        f"['candidate_docs'][{i}], or the judged step as the last item of state.history)")
            calls.append(Call(P.usefulness_messages(q, req.gold, hist, judged[i], opts), P.parse_usefulness, [i]))
        else:  # refine
            expls = req.metadata.get("explanations") or []
            expl = expls[i] if i < len(expls) and expls[i] else req.explanation
            calls.append(Call(P.refine_messages(q, hist, judged[i], expl, opts), P.parse_refine, [i]))
    return calls


def assemble(req: JudgeRequest, calls: Sequence[Call], outcomes: Sequence[Outcome]) -> JudgeResult:
    """Per-call outcomes -> one JudgeResult (failed as a whole when any call failed)."""
    n = len(req.candidates)
    attempts = max((o.attempts for o in outcomes), default=0)
    seconds = sum(o.seconds for o in outcomes)
    bad = [(c, o) for c, o in zip(calls, outcomes) if o.failure or o.parsed is None or not o.parsed.ok]
    if bad:
        why = "; ".join(f"candidate {','.join(map(str, c.cands))}: "
                        f"{o.failure or (o.parsed.failure if o.parsed is not None else 'no reply')}" for c, o in bad)
        return JudgeResult(None, failure=why, attempts=attempts, seconds=seconds,
                           reply="\n---\n".join(o.reply for _, o in bad))
    replies = "\n---\n".join(o.reply for o in outcomes)
    invalid = [i for i, a in enumerate(req.candidates) if a.kind == INVALID]
    if req.kind == "rank":
        judged = []
        if calls:
            local = outcomes[0].parsed.ranks
            judged = [calls[0].cands[j] for j in sorted(range(len(local)), key=lambda j: local[j])]
        ranks = [0] * n
        for r, i in enumerate(judged + invalid):
            ranks[i] = r
        scores = [0.0 if i in invalid else 1.0 / (1 + r) for i, r in enumerate(ranks)]
        return JudgeResult(scores, ranks=ranks, attempts=attempts, seconds=seconds, reply=replies)
    scores, texts, notes = [0.0] * n, [""] * n, {}
    for c, o in zip(calls, outcomes):
        i = c.cands[0]
        if req.kind == "refine":
            texts[i], scores[i] = o.parsed.text, 1.0
        else:
            scores[i] = o.parsed.scores[0]
        notes[i] = o.parsed.rationale
    for i in range(n):
        notes.setdefault(i, "invalid action" if i in invalid else "not a query: not judged")
    return JudgeResult(scores, ranks=ranks_from_scores(scores), texts=texts if req.kind == "refine" else None,
                       rationale=join_notes([notes[i] for i in range(n)]), attempts=attempts, seconds=seconds,
                       reply=replies)


def _run(requests: Sequence[JudgeRequest], opts: P.PromptOptions,
         execute: Callable[[list[Call]], list[Outcome]]) -> list[JudgeResult]:
    plans = [plan_calls(r, opts) for r in requests]
    flat = [c for p in plans if not isinstance(p, str) for c in p]
    outs = iter(execute(flat) if flat else [])
    results = []
    for req, plan in zip(requests, plans):
        if isinstance(plan, str):
            results.append(JudgeResult(None, failure=plan, attempts=0))
        else:
            results.append(assemble(req, plan, [next(outs) for _ in plan]))
    return results


# ------------------------------------------------------------------------------------------------ HTTP judge
class HttpJudge:
    """The papers' prompts through an OpenAI-compatible chat endpoint (vLLM, SGLang, hosted), one call per
    thread (`max_workers` at once). Transport: jaxrag.judge.OpenAIJudge.chat_result (1 + max_retries attempts,
    exponential backoff, Retry-After on 429/503; `sleep` injectable for tests)."""

    def __init__(self, base_url: str, model: str, *, name: str | None = None, api_key_env: str = "OPENAI_API_KEY",
                 max_retries: int = 2, timeout_s: float = 60.0, backoff_s: float = 1.0, temperature: float = 0.0,
                 max_tokens: int = 1024, max_workers: int = 8, max_wait_s: float = 120.0,
                 sleep: Callable[[float], None] = time.sleep, options: P.PromptOptions = P.PromptOptions()):
        if max_retries < 0 or max_workers < 1:
            raise ValueError(f"HttpJudge: max_retries={max_retries} must be >= 0, max_workers={max_workers} >= 1")
        self.name = name or model
        self.max_retries, self.max_workers, self.options = max_retries, max_workers, options
        self.transport = OpenAIJudge(base_url, model, api_key_env=api_key_env, timeout_s=timeout_s,
                                     retries=1 + max_retries, backoff_s=backoff_s, temperature=temperature,
                                     max_tokens=max_tokens, max_wait_s=max_wait_s, sleep=sleep)

    def _one(self, call: Call) -> Outcome:
        r = self.transport.chat_result(call.messages, check=lambda text: call.parse(text).failure)
        parsed = call.parse(r.text) if r.ok else None
        return Outcome(parsed, r.failure, r.reply, r.attempts, r.seconds)

    def _execute(self, calls: list[Call]) -> list[Outcome]:
        if self.max_workers == 1 or len(calls) == 1:
            return [self._one(c) for c in calls]
        with concurrent.futures.ThreadPoolExecutor(min(self.max_workers, len(calls))) as ex:
            return list(ex.map(self._one, calls))

    def judge(self, requests: Sequence[JudgeRequest]) -> list[JudgeResult]:
        return _run(requests, self.options, self._execute)


# ----------------------------------------------------------------------------------------------- local judge
class LocalJudge:
    """The same prompts through any Policy (a JaxPolicy over a local checkpoint): every pending call of every
    request in ONE batched `policy.generate` per attempt; calls whose reply does not parse go to the next attempt
    (1 + max_retries in all; retries sample at `retry_temperature`, since a greedy retry repeats the reply).
    Messages become a prompt with `chat` (default: the policy tokenizer's chat template, else a plain join)."""

    def __init__(self, policy, *, name: str = "local", chat: Callable[[list[dict]], str] | None = None,
                 max_retries: int = 2, temperature: float = 0.0, retry_temperature: float = 0.7,
                 max_new_tokens: int = 512, seed: int = 0, options: P.PromptOptions = P.PromptOptions()):
        if max_retries < 0:
            raise ValueError(f"LocalJudge: max_retries={max_retries} must be >= 0")
        self.policy, self.name, self.max_retries = policy, name, max_retries
        self.temperature, self.retry_temperature = temperature, retry_temperature
        self.max_new_tokens, self.seed, self.options = max_new_tokens, seed, options
        tok = getattr(policy, "tokenizer", None)
        self.chat = chat or (tok.chat if tok is not None and hasattr(tok, "chat") else
                             (lambda ms: "\n\n".join(m["content"] for m in ms) + "\n\n"))
        self.generate_calls = 0

    def _execute(self, calls: list[Call]) -> list[Outcome]:
        outs = [Outcome(None) for _ in calls]
        pending = list(range(len(calls)))
        prompts = [self.chat(c.messages) for c in calls]
        for attempt in range(1 + self.max_retries):
            if not pending:
                break
            t0 = time.perf_counter()
            gens = self.policy.generate([prompts[i] for i in pending], n=1,
                                        temperature=self.temperature if attempt == 0 else self.retry_temperature,
                                        max_new_tokens=self.max_new_tokens, seed=self.seed + attempt)
            self.generate_calls += 1
            share = (time.perf_counter() - t0) / len(pending)
            if len(gens) != len(pending):
                for i in pending:
                    outs[i].attempts, outs[i].failure = attempt + 1, (
                        f"policy returned {len(gens)} completion lists for {len(pending)} prompts")
                break
            still = []
            for i, g in zip(pending, gens):
                text = g[0].text if g else ""
                p = calls[i].parse(text)
                outs[i].attempts, outs[i].seconds, outs[i].reply = attempt + 1, outs[i].seconds + share, text
                if p.ok:
                    outs[i].parsed, outs[i].failure = p, ""
                else:
                    outs[i].failure = f"unparseable reply: {p.failure}"
                    still.append(i)
            pending = still
        return outs

    def judge(self, requests: Sequence[JudgeRequest]) -> list[JudgeResult]:
        return _run(requests, self.options, self._execute)


# ---------------------------------------------------------------------------------------------- oracle judge
class OracleJudge:
    """The synthetic world's gold chain as a judge (deterministic; no prompt).

    Needs `request.metadata["gold_chain"]` (data/synthetic/questions.py: hops with passage_id, entity, relation,
    answer). A hop is resolved once its gold passage was retrieved at an executed step before the judged one (either
    request convention, see the module doc). Per candidate:
      query   1.0 if it retrieves (its known documents, else the retriever at k) the gold passage of a hop not
              yet resolved; 0.0 if it repeats an earlier query (case/space-insensitive), retrieves nothing new
              (only already-seen documents), or finds no unresolved hop's passage (vague / useless);
      answer  1.0 if correct (normalized EM vs request.gold, else metadata["golden_answers"]), 0.0 otherwise
              (a premature wrong guess included);
      invalid 0.0.
    "rank": ranks from the scores (ties: candidate order; invalid actions last) and scores = 1/(1+rank) (invalid:
    0), as RAG-Gym's annotator, whose best-ranked action is preferred even when nothing is good;
    "step_score" / "usefulness": the 0/1 scores themselves (ranks derived likewise); "refine": the teacher's
    first query template for the first unresolved hop. All query candidates of all requests: one search call.
    """

    name = "oracle"

    def __init__(self, retriever, k: int = RolloutConfig.k):
        if k < 1:
            raise ValueError(f"OracleJudge: k={k} must be >= 1")
        self.retriever, self.k = retriever, k
        self.search_calls = 0

    @staticmethod
    def _chain(req: JudgeRequest) -> list[dict] | str:
        chain = req.metadata.get("gold_chain")
        if not (isinstance(chain, list) and chain and all(isinstance(h, dict) and "passage_id" in h for h in chain)):
            return "oracle needs metadata['gold_chain'] (a list of hops with passage_id)"
        return chain

    def judge(self, requests: Sequence[JudgeRequest]) -> list[JudgeResult]:
        t0 = time.perf_counter()
        splits = [judged_steps(req) for req in requests]
        need = [(r, i) for r, (req, (_, judged, known)) in enumerate(zip(requests, splits))
                for i, st in enumerate(judged) if st.action.kind == QUERY and not known[i] and req.kind != "refine"]
        found: dict[tuple[int, int], set[str]] = {}
        if need:
            hits = self.retriever.search([splits[r][1][i].action.text for r, i in need], self.k)
            self.search_calls += 1
            for key, hs in zip(need, hits):
                found[key] = {str(h.doc_id) for h in hs[: self.k]}
        out = []
        for r, req in enumerate(requests):
            res = self._one(r, req, splits[r], found)
            res.seconds = (time.perf_counter() - t0) / max(len(requests), 1)
            out.append(res)
        return out

    def _one(self, r: int, req: JudgeRequest, split: tuple, found: dict) -> JudgeResult:
        if req.kind not in KINDS:
            return JudgeResult(None, failure=f"unknown request kind {req.kind!r} (known: {KINDS})")
        chain = self._chain(req)
        if isinstance(chain, str):
            return JudgeResult(None, failure=chain)
        hist, judged, known = split
        seen = {d.doc_id for s in hist for d in s.docs}
        resolved = [h["passage_id"] in seen for h in chain]
        if req.kind == "refine":
            return self._refine(req, chain, resolved)
        gold = list(req.gold) or list(req.metadata.get("golden_answers", []))
        before = {canon(s.action.text).lower() for s in hist if s.action.kind == QUERY}
        scores, notes = [], []
        for i, a in enumerate(req.candidates):
            if a.kind == QUERY:
                ids = {d.doc_id for d in judged[i].docs} if known[i] else found.get((r, i), set())
                hops = [j + 1 for j, h in enumerate(chain) if not resolved[j] and h["passage_id"] in ids]
                if canon(a.text).lower() in before:
                    s, why = 0.0, "redundant: repeats an earlier query"
                elif not ids - seen:
                    s = 0.0
                    why = "redundant: retrieves only already-seen documents" if ids else "useless: retrieves nothing"
                elif hops:
                    s, why = 1.0, f"finds the gold passage of hop {', '.join(map(str, hops))}"
                else:
                    s, why = 0.0, "useless: no unresolved hop's gold passage in the top-k"
            elif a.kind == ANSWER:
                if not gold:
                    return JudgeResult(None, failure="oracle needs the gold answers (request.gold) to judge an answer")
                ok = exact_match(a.text, gold) > 0
                s = 1.0 if ok else 0.0
                open_hops = [j + 1 for j, x in enumerate(resolved) if not x]
                why = "correct answer" if ok else "wrong answer" + (
                    f" (premature: hop {', '.join(map(str, open_hops))} unresolved)" if open_hops else "")
            else:
                s, why = 0.0, "invalid action"
            scores.append(s)
            notes.append(why)
        invalid = [a.kind == INVALID for a in req.candidates]
        ranks = ranks_from_scores([-1.0 if bad else s for s, bad in zip(scores, invalid)])  # invalid: last
        if req.kind == "rank":
            scores = [0.0 if bad else 1.0 / (1 + x) for x, bad in zip(ranks, invalid)]
        return JudgeResult(scores, ranks=ranks, rationale=join_notes(notes), attempts=1)

    @staticmethod
    def _refine(req: JudgeRequest, chain: list[dict], resolved: list[bool]) -> JudgeResult:
        nxt = next((h for h, ok in zip(chain, resolved) if not ok), None)
        if nxt is None:
            return JudgeResult(None, failure="oracle refine: every hop is resolved, nothing left to search")
        q = QUERY_TEMPLATES[nxt["relation"]][0].format(e=nxt["entity"])
        n = len(req.candidates)
        return JudgeResult([1.0] * n, ranks=list(range(n)), texts=[q] * n,
                           rationale=f"the first query template for hop {nxt.get('hop', '?')}", attempts=1)


# -------------------------------------------------------------------------------------------------- registry
JUDGES = {"oracle": OracleJudge, "http": HttpJudge, "local": LocalJudge}


def get_judge(name: str, **kw):
    """'oracle' (retriever, k) | 'http' (base_url, model, ...) | 'local' (policy, ...)."""
    if name not in JUDGES:
        raise ValueError(f"unknown judge {name!r} (known: {sorted(JUDGES)})")
    return JUDGES[name](**kw)


def judge_records(judge, records: Sequence[ProcessRecord], kind: str = "step_score",
                  source: str | None = None) -> list[ProcessRecord]:
    """Re-score existing records' candidates with `judge` (one batched judge call): the same states and
    candidates under another source (e.g. the oracle, for agreement tables). record.metadata is the request's
    metadata (the synthetic gold chain travels there)."""
    reqs = []
    for rec in records:
        meta = dict(rec.metadata)
        docs = [c.extra.get("docs") for c in rec.candidates]
        if any(d is not None for d in docs) and "candidate_docs" not in meta:
            meta["candidate_docs"] = docs
        reqs.append(JudgeRequest(kind, rec.state(), [c.action for c in rec.candidates], list(rec.gold), meta))
    results = judge.judge(reqs)
    src = source or f"{kind}:{judge.name}"
    out = []
    for rec, res in zip(records, results):
        cands = []
        notes = candidate_notes(res, len(rec.candidates))
        for i, c in enumerate(rec.candidates):
            cands.append(ScoredCandidate(
                c.raw, c.action, score=res.scores[i] if res.ok else None,
                rank=res.ranks[i] if res.ok and res.ranks else None,
                rationale=notes[i], failure=res.failure, token_ids=list(c.token_ids),
                logprobs=list(c.logprobs), extra=dict(c.extra)))
        out.append(dataclasses.replace(rec, candidates=cands, source=src))
    return out
