"""Answer and trajectory metrics (METHODS.md §6).

Answer scores take a prediction and a list of golden answers and return the max over the golds.

Normalization (`normalize_answer`), by default exactly the official HotpotQA / SQuAD v1.1 evaluation script's
`normalize_answer`, which FlashRAG and the four papers' evaluations use: lowercase, delete every ASCII punctuation
character (`string.punctuation`, symbols such as `$ + < = > ^ ` | ~` included), drop the articles a / an / the,
collapse whitespace. `normalization="unicode"` is an explicit extra, off for the papers' tables: Unicode NFKC,
accents removed (NFKD, combining marks dropped), `_` -> space (before deletion), and deletion of every Unicode
punctuation character (category P*) as well. Every answer metric takes `normalization=`; every caller in the package
(evaluation, rollout rewards, supervision rewards) uses the default, "official".

CEM ("cover EM") is FlashRAG's `acc` (Sub_ExactMatch): a normalized golden answer is a substring of the
normalized prediction (plain substring, so gold "1" covers "1990"). One guard: a gold that normalizes to the
empty string ("The", "!") never counts as covered (FlashRAG would count it for every prediction).
"""
from __future__ import annotations

import collections
import json
import re
import string
import unicodedata
from typing import Iterable, Sequence

import numpy as np

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_ASCII_PUNCT = frozenset(string.punctuation)
NORMALIZATIONS = ("official", "unicode")
LETTERS = "ABCDEFGHIJ"


def normalize_answer(s: str | None, normalization: str = "official") -> str:
    """HotpotQA/SQuAD official normalization ("official"), or with the Unicode extras ("unicode"); see the module doc."""
    s = s or ""
    if normalization == "unicode":
        s = unicodedata.normalize("NFKD", unicodedata.normalize("NFKC", s))
        s = "".join(ch for ch in s if not unicodedata.combining(ch)).lower().replace("_", " ")
        s = "".join(ch for ch in s if ch not in _ASCII_PUNCT and not unicodedata.category(ch).startswith("P"))
    elif normalization == "official":
        s = "".join(ch for ch in s.lower() if ch not in _ASCII_PUNCT)
    else:
        raise ValueError(f"normalization must be one of {NORMALIZATIONS}, got {normalization!r}")
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def _golds(gold: str | Sequence[str]) -> list[str]:
    return [gold] if isinstance(gold, str) else list(gold)


def exact_match(pred: str | None, gold: str | Sequence[str], normalization: str = "official") -> float:
    """EM: the normalized prediction equals a normalized golden answer."""
    if pred is None:
        return 0.0
    p = normalize_answer(pred, normalization)
    return float(any(p == normalize_answer(g, normalization) for g in _golds(gold)))


def cover_exact_match(pred: str | None, gold: str | Sequence[str], normalization: str = "official") -> float:
    """CEM (FlashRAG "acc"): a non-empty normalized golden answer is a substring of the normalized prediction."""
    if pred is None:
        return 0.0
    p = normalize_answer(pred, normalization)
    return float(any(g and g in p for g in (normalize_answer(x, normalization) for x in _golds(gold))))


def _f1(pred: str, gold: str, normalization: str = "official") -> float:
    """Token F1 of the official HotpotQA script (yes / no / noanswer must match exactly)."""
    p, g = normalize_answer(pred, normalization), normalize_answer(gold, normalization)
    special = ("yes", "no", "noanswer")
    if (p in special or g in special) and p != g:
        return 0.0
    pt, gt = p.split(), g.split()
    common = collections.Counter(pt) & collections.Counter(gt)
    same = sum(common.values())
    if same == 0:
        return 0.0
    prec, rec = same / len(pt), same / len(gt)
    return 2 * prec * rec / (prec + rec)


def f1_score(pred: str | None, gold: str | Sequence[str], normalization: str = "official") -> float:
    """Token-level F1, max over the golden answers."""
    if pred is None:
        return 0.0
    return max((_f1(pred, g, normalization) for g in _golds(gold)), default=0.0)


def answer_in_docs(gold: str | Sequence[str], texts: Iterable[str], normalization: str = "official") -> float:
    """Retrieval recall by answer (FlashRAG's `retrieval_recall`): 1 if some non-empty normalized golden answer occurs
    as a whole-token span in some normalized document text, else 0."""
    golds = [g for g in (normalize_answer(x, normalization) for x in _golds(gold)) if g]
    docs = [f" {normalize_answer(t, normalization)} " for t in texts]
    return float(any(f" {g} " in d for g in golds for d in docs))


def title_key(title: str) -> str:
    """How gold titles meet corpus titles: case-folded, whitespace collapsed."""
    return " ".join(title.casefold().split())


def title_recall(gold_titles: Iterable[str], titles: Iterable[str]) -> float | None:
    """The fraction of gold (supporting) titles among `titles`; None when there are no gold titles."""
    gold = {title_key(t) for t in gold_titles if t.strip()}
    if not gold:
        return None
    return len(gold & {title_key(t) for t in titles}) / len(gold)


def choice_letter(pred: str | None, choices: Sequence[str]) -> str | None:
    """The option letter a prediction names: the option's text, 'C', '(C)', 'C. text', 'Answer: C'."""
    if not pred or not pred.strip():
        return None
    letters = LETTERS[:len(choices)] if choices else "ABCD"
    bare = re.fullmatch(rf"\W*\(?([{letters}])\)?[.:)]?\W*", pred.strip(), re.I)
    if bare:
        return bare.group(1).upper()
    n = normalize_answer(pred)
    for letter, text in zip(letters, choices):
        if n and n == normalize_answer(text):
            return letter
    s = pred.strip().strip("*_`#> ")
    m = re.match(rf"^(?:(?:the\s+)?(?:final\s+|correct\s+)?(?:answer|option)(?:\s+is)?\W*)\(?([{letters}])\)?(?=$|\W)",
                 s, re.I)
    if m is None:
        m = re.match(rf"^\(?([{letters}])\)?(?=$|[\s.:)\],;])", s)
    return m.group(1).upper() if m else None


def gold_letter(gold: str | Sequence[str], choices: Sequence[str]) -> str | None:
    for g in _golds(gold):
        if len(g.strip()) == 1 and g.strip().upper() in LETTERS[:max(len(choices), 4)]:
            return g.strip().upper()
        for letter, text in zip(LETTERS, choices):
            if normalize_answer(g) == normalize_answer(text):
                return letter
    return None


def choice_accuracy(pred: str | None, gold: str | Sequence[str], choices: Sequence[str]) -> float:
    """Multiple-choice accuracy: the predicted option letter equals the gold one (gold: letter or text)."""
    g = gold_letter(gold, choices)
    return float(g is not None and choice_letter(pred, choices) == g)


def search_count_stats(counts: Iterable[int]) -> dict:
    """RAG-Gym Table 5: min / max / mean number of search queries per question."""
    c = np.asarray(list(counts), dtype=np.float64)
    if c.size == 0:
        return {"min": 0.0, "max": 0.0, "mean": 0.0}
    return {"min": float(c.min()), "max": float(c.max()), "mean": float(c.mean())}


def search_efficiency(f1s: Sequence[float], searches: Sequence[int]) -> float:
    """SmartSearch SE = mean_i F1_i / T_i. Episodes without a search count with T_i = 1."""
    if not len(f1s):
        return 0.0
    return float(np.mean([f / max(t, 1) for f, t in zip(f1s, searches)]))


def search_quality(correct: Sequence[bool], query_good: Sequence[Sequence[bool]]) -> dict:
    """SmartSearch Perfect (correct, all queries good), Partial (incorrect, some good query), SQ = sum."""
    n = len(correct)
    if n == 0:
        return {"perfect": 0.0, "partial": 0.0, "sq": 0.0}
    perfect = sum(bool(c) and all(g) for c, g in zip(correct, query_good)) / n
    partial = sum((not c) and any(g) for c, g in zip(correct, query_good)) / n
    return {"perfect": perfect, "partial": partial, "sq": perfect + partial}


# ARENA: format and relevance (same rules as the reward, METHODS.md §5).
#
# Two readings. The "code" functions (arena_normalize, arena_code_*) score a reply as ARENA's released evaluation and
# reward code does (src/evaluate.py get_all_scores; facts in tests/conformance/test_conformance_arena.py): the reply
# must BE the three sections (anchored at its start, whitespace between, no '<' inside, `</answer>` ending a line),
# the first closed <answer> is the answer, the first <relevance> must hold a JSON list of ids, answers are compared
# under ARENA's own normalization. The lenient ones (arena_format_score, arena_relevance_score, arena_reward with
# the agent's parse) accept any text around sections in order and any digits as ids.
_ARENA_PUNCT = frozenset(string.punctuation + "\u2018\u2019\u00b4`")   # ASCII punctuation + curly quotes, acute
_ARENA_STRICT = re.compile(r"<relevance>[^<]*</relevance>\s*<analysis>[^<]*</analysis>\s*<answer>[^<]*</answer>$",
                           re.M)
_ARENA_FIRST = {tag: re.compile(rf"<{tag}>\s*(.*?)\s*</{tag}>", re.S) for tag in ("answer", "relevance")}


def arena_normalize(s: str | None) -> str:
    """ARENA's answer normalization (its evaluate.py, not SQuAD's): `_` -> space, lowercase, every ASCII punctuation
    character and ‘ ’ ´ replaced by a SPACE (SQuAD deletes them: "U.S." -> "u s", not "us"), the articles
    a / an / the dropped, whitespace collapsed."""
    s = (s or "").replace("_", " ").lower()
    s = "".join(" " if ch in _ARENA_PUNCT else ch for ch in s)
    return " ".join(_ARTICLES.sub(" ", s).split())


def arena_exact_match(pred: str | None, gold: str | Sequence[str]) -> float:
    """EM under arena_normalize (max over the golds; no golds -> 0)."""
    p = arena_normalize(pred)
    return float(any(p == arena_normalize(g) for g in _golds(gold)))


def arena_f1(pred: str | None, gold: str | Sequence[str]) -> float:
    """Token F1 under arena_normalize, max over the golds; unlike the HotpotQA script, yes / no get no special case."""
    pt = arena_normalize(pred).split()
    best = 0.0
    for g in _golds(gold):
        gt = arena_normalize(g).split()
        same = sum((collections.Counter(pt) & collections.Counter(gt)).values())
        if same:
            prec, rec = same / len(pt), same / len(gt)
            best = max(best, 2 * prec * rec / (prec + rec))
    return best


def arena_code_format(text: str) -> float:
    """1 iff the reply starts with <relevance>…</relevance> <analysis>…</analysis> <answer>…</answer>, only
    whitespace between, no '<' inside a section, and `</answer>` ends a line (text may follow on later lines)."""
    return float(bool(_ARENA_STRICT.match(text or "")))


def arena_code_section(text: str, tag: str) -> str:
    """The stripped content of the FIRST closed <tag>…</tag> ("answer" or "relevance"); "" when there is none."""
    m = _ARENA_FIRST[tag].search(text or "")
    return m.group(1) if m else ""


def arena_code_relevance(text: str, gold_ids: Iterable[int]) -> float:
    """The first <relevance> read as JSON: its distinct ids sorted equal to the sorted gold ids -> 1, sharing one
    -> 0.5, else 0; anything that is not a JSON list of ids ("1, 3", a dict of ids, nested lists) -> 0. An empty
    list against no gold ids -> 1."""
    gold = sorted(set(gold_ids))
    try:
        ids = sorted(set(json.loads(arena_code_section(text, "relevance"))))
    except (ValueError, TypeError):
        return 0.0
    if ids == gold:
        return 1.0
    return 0.5 if set(ids) & set(gold) else 0.0


def arena_code_reward(text: str, gold: Sequence[str], gold_ids: Iterable[int], bonus: float = 10.0,
                      accuracy=None) -> dict:
    """ARENA's reward as its released code computes it from the reply text alone (see above). accuracy(answer,
    gold) replaces EM (the ablations); the answer is the first closed <answer>'s text ("" without one)."""
    fmt = arena_code_format(text)
    acc = (accuracy or arena_exact_match)(arena_code_section(text, "answer"), gold)
    rel = arena_code_relevance(text, gold_ids)
    b = bonus if (fmt == 1 and acc == 1 and rel == 1) else 0.0
    return {"format": fmt, "accuracy": acc, "relevance": rel, "bonus": b, "total": fmt + acc + rel + b}


_ARENA_ORDER = re.compile(r"<relevance>.*?</relevance>.*?<analysis>.*?</analysis>.*?<answer>.*?</answer>",
                          re.S | re.I)


def arena_format_score(text: str) -> float:
    """1 if <relevance>, <analysis>, <answer> are all present, closed and in this order."""
    return float(bool(_ARENA_ORDER.search(text or "")))


def arena_relevance_score(pred_ids: Iterable[int], gold_ids: Iterable[int]) -> float:
    """1 if the cited ids equal the gold supporting ids, 0.5 if they overlap, 0 otherwise."""
    p, g = set(pred_ids), set(gold_ids)
    if p and p == g:
        return 1.0
    return 0.5 if p & g else 0.0


def arena_reward(text: str, answer: str | None, gold: Sequence[str], pred_ids: Iterable[int],
                 gold_ids: Iterable[int], bonus: float = 10.0, accuracy=None, format_score=None) -> dict:
    """ARENA's adaptive reward (003 §3.3): format + accuracy + relevance + bonus (when all three are 1). accuracy
    (pred, gold) -> [0, 1] and format_score(text) -> {0, 1} replace EM and the section check (the ablations)."""
    fmt = (format_score or arena_format_score)(text)
    acc = (accuracy or exact_match)(answer, gold)
    rel = arena_relevance_score(pred_ids, gold_ids)
    b = bonus if (fmt == 1 and acc == 1 and rel == 1) else 0.0
    return {"format": fmt, "accuracy": acc, "relevance": rel, "bonus": b, "total": fmt + acc + rel + b}


def invalid_rate(num_invalid: Sequence[int], num_steps: Sequence[int]) -> float:
    """Share of generated actions that parsed to Invalid."""
    steps = sum(num_steps)
    return float(sum(num_invalid) / steps) if steps else 0.0
