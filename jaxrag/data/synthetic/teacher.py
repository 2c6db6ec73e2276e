"""A scripted, deliberately imperfect search teacher over any retriever.

The teacher sees the question record (with its gold chain) and what it has retrieved so far. A hop counts as
resolved once its gold passage was among the retrieved hits, and only then may the teacher name the entity that
passage reveals, so every trajectory is justified by what was actually observed. At each decision it may, at
configurable rates, make a flawed move (and, with `p_vague_first`, begin each hop with a vague query):
  vague      a query with the entity name left out (retrieves nothing useful),
  redundant  the previous query again,
  premature  an answer before all hops are resolved (the last bridge entity found, or a random guess).
A good query that misses its gold passage is reformulated with the next template; after `max_retries` misses the
teacher gives up and guesses ("giveup"). Actions are abstract (kind, text, extra); an agent's format() renders
them into its own syntax.
"""

from __future__ import annotations

import dataclasses
import zlib

import numpy as np

from jaxrag.data.synthetic.world import RELATIONS

QUERY_TEMPLATES = {
    "born_in": ("{e} born", "where was {e} born", "{e} birthplace"),
    "birth_year": ("{e} birth year", "when was {e} born", "{e} born year"),
    "works_for": ("{e} employer", "{e} works for", "which company employs {e}"),
    "in_country": ("{e} country", "which country is {e} in", "{e} city in country"),
    "directed_by": ("{e} director", "who directed {e}", "{e} directed by"),
    "released_in": ("{e} release year", "when was {e} released", "{e} came out"),
    "based_in": ("{e} headquarters", "where is {e} based", "{e} based in"),
    "founded_by": ("{e} founder", "who founded {e}", "{e} founded by"),
}
GENERIC = {
    "person": "the person",
    "film": "the film",
    "city": "the city",
    "company": "the company",
    "country": "the country",
}
NEEDS = {
    "born_in": "the birthplace of {e}",
    "birth_year": "the birth year of {e}",
    "works_for": "the employer of {e}",
    "in_country": "the country of {e}",
    "directed_by": "the director of {e}",
    "released_in": "the release year of {e}",
    "based_in": "the headquarters of {e}",
    "founded_by": "the founder of {e}",
}


@dataclasses.dataclass(frozen=True)
class TeacherConfig:
    p_vague: float = 0.1
    p_redundant: float = 0.1
    p_premature: float = 0.05
    max_retries: int = 3  # good queries per hop before giving up
    max_steps: int = 10
    # decision density: each hop's first query is vague with this probability (drawn before the per-decision
    # draw, only when > 0, so 0 leaves every trajectory as it was); the teacher then retries with a good query, so
    # the trajectory still succeeds and SFT, which keeps correct trajectories, inherits the flaw
    p_vague_first: float = 0.0
    # a flaw that costs answers: with this probability the teacher answers (a guess) once only the last hop of a
    # multi-hop chain is open, before any query for it (drawn only when > 0); SFT must keep failed trajectories
    # (sft.only_correct False) to inherit it
    p_premature_last: float = 0.0

    def __post_init__(self):
        for name in ("p_vague", "p_redundant", "p_premature", "p_vague_first", "p_premature_last"):
            v = getattr(self, name)
            if not 0.0 <= v <= 1.0:
                raise ValueError(f"TeacherConfig.{name}={v} must be in [0, 1]")
        if self.p_vague + self.p_redundant + self.p_premature > 1.0:
            raise ValueError("TeacherConfig: p_vague + p_redundant + p_premature must be <= 1")
        if self.max_retries < 1 or self.max_steps < 1:
            raise ValueError(
                f"TeacherConfig: max_retries={self.max_retries} and max_steps={self.max_steps} must be >= 1"
            )


@dataclasses.dataclass(frozen=True)
class TeacherAction:
    kind: str  # "query" | "answer"
    text: str
    extra: dict  # reasoning, predicted_answer, hop, flaw (None | vague | redundant | premature | giveup)


@dataclasses.dataclass
class TeacherStep:
    action: TeacherAction
    doc_ids: list[str]  # retrieved for a query; [] for the answer


def episode_rng(seed: int, question_id: str) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(question_id.encode())])


def resolved_hops(question: dict, history: list[TeacherStep]) -> list[bool]:
    seen = {d for step in history for d in step.doc_ids}
    return [h["passage_id"] in seen for h in question["metadata"]["gold_chain"]]


def next_hop(resolved: list[bool]) -> int | None:
    """Index of the first unresolved hop (`resolved_hops`); chains resolve in order (a hop needs the previous answer's
    name)."""
    for i, r in enumerate(resolved):
        if not r:
            return i
    return None


def _final_answer(question: dict) -> str:
    return question["golden_answers"][0]


def _guess(question: dict, resolved: list[bool], rng, guess_pool: dict[str, list[str]]) -> str:
    hops = question["metadata"]["gold_chain"]
    if question["metadata"]["type"] == "comparison":
        return hops[int(rng.integers(2))]["entity"]
    done = [h for h, r in zip(hops, resolved) if r]
    if done:  # the classic premature answer: the bridge entity found so far
        return done[-1]["answer"]
    answer_type = RELATIONS[hops[-1]["relation"]][1]
    pool = guess_pool.get(answer_type) or [h["answer"] for h in hops]
    return pool[int(rng.integers(len(pool)))]


def _good_query(hop: dict, attempt: int) -> str:
    templates = QUERY_TEMPLATES[hop["relation"]]
    return templates[attempt % len(templates)].format(e=hop["entity"])


def _reasoning(question: dict, resolved: list[bool], hop_index: int | None) -> str:
    hops = question["metadata"]["gold_chain"]
    known = " ".join(
        f"{NEEDS[h['relation']].format(e=h['entity']).capitalize()} is {h['answer']}."
        for h, r in zip(hops, resolved)
        if r
    )
    if hop_index is None:
        want = "So the answer is " + _final_answer(question) + "."
    else:
        want = "I need " + NEEDS[hops[hop_index]["relation"]].format(e=hops[hop_index]["entity"]) + "."
    return (known + " " + want).strip()


def teacher_action(
    question: dict,
    history: list[TeacherStep],
    rng: np.random.Generator,
    cfg: TeacherConfig,
    guess_pool: dict[str, list[str]] | None = None,
) -> TeacherAction:
    """The teacher's next abstract action given the question record and the steps taken so far."""
    guess_pool = guess_pool or {}
    resolved = resolved_hops(question, history)
    hop_index = next_hop(resolved)
    hops = question["metadata"]["gold_chain"]
    if hop_index is None:
        return TeacherAction(
            "answer",
            _final_answer(question),
            {
                "reasoning": _reasoning(question, resolved, None),
                "predicted_answer": _final_answer(question),
                "hop": None,
                "flaw": None,
            },
        )
    guess = _guess(question, resolved, rng, guess_pool)
    queries = [s.action for s in history if s.action.kind == "query"]
    good_attempts = sum(1 for a in queries if a.extra.get("hop") == hop_index and a.extra.get("flaw") is None)
    if good_attempts >= cfg.max_retries or len(history) >= cfg.max_steps - 1:
        return TeacherAction(
            "answer",
            guess,
            {
                "reasoning": _reasoning(question, resolved, hop_index),
                "predicted_answer": guess,
                "hop": hop_index,
                "flaw": "giveup",
            },
        )
    extra = {"reasoning": _reasoning(question, resolved, hop_index), "predicted_answer": guess, "hop": hop_index}
    first_at_hop = not any(a.extra.get("hop") == hop_index for a in queries)
    if cfg.p_premature_last > 0 and first_at_hop and hop_index == len(hops) - 1 > 0:
        if rng.random() < cfg.p_premature_last:
            return TeacherAction("answer", guess, {**extra, "flaw": "premature_last"})
    if cfg.p_vague_first > 0 and first_at_hop:
        if rng.random() < cfg.p_vague_first:
            return TeacherAction("query", _vague_query(hops[hop_index], rng), {**extra, "flaw": "vague"})
    # One draw per decision: premature | redundant | vague | good, rates as configured.
    # A redundant draw with nothing to repeat (or right after a repeat) becomes a good query.
    u = rng.random()
    last = queries[-1] if queries else None
    if u < cfg.p_premature:
        return TeacherAction("answer", guess, {**extra, "flaw": "premature"})
    if u < cfg.p_premature + cfg.p_redundant:
        if last is not None and last.extra.get("flaw") != "redundant":
            return TeacherAction("query", last.text, {**extra, "flaw": "redundant"})
    elif u < cfg.p_premature + cfg.p_redundant + cfg.p_vague:
        return TeacherAction("query", _vague_query(hops[hop_index], rng), {**extra, "flaw": "vague"})
    return TeacherAction("query", _good_query(hops[hop_index], good_attempts), {**extra, "flaw": None})


def _vague_query(hop: dict, rng) -> str:
    """A query for `hop` with its entity's name replaced by a generic phrase ("where was the person born")."""
    return QUERY_TEMPLATES[hop["relation"]][int(rng.integers(3))].format(e=GENERIC[RELATIONS[hop["relation"]][0]])


def oracle_action(question: dict, history: list[TeacherStep]) -> TeacherAction:
    """The flawless next action at any state: the answer once every hop's gold passage has been retrieved, else a
    query for the first unresolved hop (its first template not yet issued in `history`)."""
    resolved = resolved_hops(question, history)
    hop_index = next_hop(resolved)
    extra = {"reasoning": _reasoning(question, resolved, hop_index), "hop": hop_index, "flaw": None}
    if hop_index is None:
        return TeacherAction("answer", _final_answer(question), {**extra, "predicted_answer": _final_answer(question)})
    hop = question["metadata"]["gold_chain"][hop_index]
    issued = {s.action.text.strip().lower() for s in history if s.action.kind == "query"}
    queries = [t.format(e=hop["entity"]) for t in QUERY_TEMPLATES[hop["relation"]]]
    return TeacherAction("query", next((q for q in queries if q.lower() not in issued), queries[0]), extra)


def run_teacher(
    questions: list[dict],
    retriever,
    k: int,
    cfg: TeacherConfig,
    seed: int = 0,
    guess_pool: dict[str, list[str]] | None = None,
) -> list[list[TeacherStep]]:
    """Teacher trajectories for all questions, stepped in lockstep: one batched retriever call per step."""
    histories: list[list[TeacherStep]] = [[] for _ in questions]
    rngs = [episode_rng(seed, q["id"]) for q in questions]
    active = list(range(len(questions)))
    while active:
        actions = {i: teacher_action(questions[i], histories[i], rngs[i], cfg, guess_pool) for i in active}
        query_ids = [i for i in active if actions[i].kind == "query"]
        results = retriever.search([actions[i].text for i in query_ids], k) if query_ids else []
        for i, hits in zip(query_ids, results):
            histories[i].append(TeacherStep(actions[i], [h.doc_id for h in hits]))
        for i in active:
            if actions[i].kind == "answer":
                histories[i].append(TeacherStep(actions[i], []))
        active = [i for i in active if actions[i].kind == "query"]
    return histories


def guess_pool_from_entities(entities: list[dict]) -> dict[str, list[str]]:
    """Type -> names, for premature guesses (pass only entities the learner may know, e.g. non-held-out)."""
    pool: dict[str, list[str]] = {}
    for e in entities:
        pool.setdefault(e["type"], []).append(e["name"])
    return pool
