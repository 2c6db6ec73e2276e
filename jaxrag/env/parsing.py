"""Lenient text parsing shared by the agents. Every function returns None on failure; none raises."""
from __future__ import annotations

import ast
import json
import re

_FENCE = re.compile(r"```[a-zA-Z0-9_-]*[ \t]*\n?|```|'''|\"\"\"")
_SMART = str.maketrans({"“": '"', "”": '"', "„": '"', "‘": "'", "’": "'", "＂": '"'})


def canon(text: str) -> str:
    """Collapse all whitespace runs to one space and strip: the canonical form of an action's text."""
    return " ".join(str(text).split())


def strip_fences(text: str) -> str:
    return _FENCE.sub("\n", text)


def find_tag(text: str, tag: str, last: bool = True) -> str | None:
    """Content of <tag>...</tag> (case-insensitive, spaces inside the brackets allowed).

    A missing closing tag is tolerated: the content then runs to the next opening tag or the end.
    Returns the last (or first) occurrence, canonicalized; None if the tag never opens.
    """
    open_re = re.compile(rf"<\s*{tag}\s*>", re.I)
    close_re = re.compile(rf"<\s*/\s*{tag}\s*>", re.I)
    opens = list(open_re.finditer(text))
    if not opens:
        return None
    m = opens[-1] if last else opens[0]
    rest = text[m.end():]
    c = close_re.search(rest)
    if c is not None:
        body = rest[:c.start()]
    else:
        nxt = re.search(r"<\s*[a-zA-Z_]+\s*>", rest)
        body = rest[:nxt.start()] if nxt else rest
    return canon(body)


def tag_positions(text: str, tags: tuple[str, ...]) -> list[tuple[int, str]]:
    """(start, tag) of every opening tag among `tags`, in text order."""
    out = []
    for t in tags:
        out += [(m.start(), t) for m in re.finditer(rf"<\s*{t}\s*>", text, re.I)]
    return sorted(out)


def find_marker(text: str, names: tuple[str, ...]) -> tuple[str, str] | None:
    """The last line of the form `Name: value` (markdown bold/italics/headers/bullets tolerated).

    Returns (name lowercased, canonical value) or None. Names are matched case-insensitively.
    """
    alt = "|".join(re.escape(n) for n in names)
    pat = re.compile(rf"^[\s>*#_\-`\d.]*({alt})[\s*_`]*:[\s*_`]*(.*?)[\s*_`]*$", re.I | re.M)
    best = None
    for m in pat.finditer(text):
        if canon(m.group(2)):
            best = (m.group(1).lower(), canon(m.group(2)))
    return best


def _balanced_objects(text: str) -> list[str]:
    """Every top-level {...} span; an unclosed final one is closed by appending braces."""
    spans, depth, start, in_str, quote, esc = [], 0, None, False, "", False
    for i, ch in enumerate(text):
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == quote:
                in_str = False
            continue
        if ch in "\"'" and depth > 0:
            in_str, quote = True, ch
        elif ch == "{":
            if depth == 0:
                start = i
            depth += 1
        elif ch == "}" and depth > 0:
            depth -= 1
            if depth == 0:
                spans.append(text[start:i + 1])
    if depth > 0 and start is not None:
        tail = text[start:]
        if in_str:
            tail += quote
        spans.append(tail + "}" * depth)
    return spans


_COMMENT = re.compile(r"[ \t]//[^\n]*")   # ` // note` line comments (the RAG-Gym parser drops them the same way)


def _load_one(s: str) -> dict | None:
    s = s.translate(_SMART)
    cands = [s, re.sub(r",\s*([}\]])", r"\1", s)]
    if _COMMENT.search(s):
        bare = _COMMENT.sub("", s)
        cands += [bare, re.sub(r",\s*([}\]])", r"\1", bare)]
    for cand in cands:
        try:
            v = json.loads(cand)
            if isinstance(v, dict):
                return v
        except (json.JSONDecodeError, ValueError, RecursionError):
            pass
        py = re.sub(r"\bnull\b", "None", re.sub(r"\btrue\b", "True", re.sub(r"\bfalse\b", "False", cand)))
        try:
            v = ast.literal_eval(py)
            if isinstance(v, dict):
                return v
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            pass
    return None


def loads_lenient(text: str) -> dict | None:
    """The last JSON object in `text` that parses under lenient rules.

    Tolerates markdown fences, trailing commas, single quotes, smart quotes, Python literals
    (None/True/False), ` // comments`, a missing closing brace. Returns None when no object parses.
    """
    for s in reversed(_balanced_objects(text)):   # braces and quotes inside strings are skipped, fences kept there
        v = _load_one(s)
        if v is None and "```" in s:   # a fence inside the span but outside its strings (an unclosed object)
            v = _load_one(strip_fences(s))
        if v is not None:
            return v
    return None


def json_field(text: str, key: str) -> str | None:
    """Fallback for broken JSON: the string value of `"key": "value"` by regex (None/null -> 'None')."""
    t = text.translate(_SMART)
    m = re.search(rf"[\"']?{re.escape(key)}[\"']?\s*:\s*(?:\"((?:[^\"\\]|\\.)*)\"?|'((?:[^'\\]|\\.)*)'?|(None|null))",
                  t)
    if m is None:
        return None
    if m.group(3):
        return "None"
    return canon(m.group(1) if m.group(1) is not None else m.group(2))


# ---- SmartSearch's released answer reading (facts: tests/conformance/test_conformance_smartsearch*.py) ----------
def code_boxed_answer(text: str) -> str:
    """The answer SmartSearch's released code reads from a text (re_call.py: last_boxed_only_string, then
    remove_boxed): with "\\boxed " (a space) anywhere, the text after the last one up to a "$"; else the last
    "\\boxed{…}" (braces balanced, kept inside: "\\text{Paris}" stays); "" when there is none, it is unclosed, or it
    is "\\fbox{…}"."""
    text = text or ""
    if "\\boxed " in text:
        return text.split("\\boxed ")[-1].split("$")[0]
    i = text.rfind("\\boxed")
    if i < 0:
        return ""   # the code falls back to \\fbox, then fails to strip it: no answer either way
    depth = 0
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if text[j] == "}" and depth == 0:
            span = text[i:j + 1]
            return span[len("\\boxed{"):-1] if span.startswith("\\boxed{") else ""
    return ""


_CLOSED_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.S)


def code_eval_answer(text: str) -> str:
    """The prediction SmartSearch's released evaluation scores (active_pipeline.py ReCallPipeline.run_item): the
    last closed, lowercase `<answer>…</answer>` of the text, stripped, read by `code_boxed_answer`; "" when there is
    no closed block or no \\boxed{} in it (an unboxed answer is no answer)."""
    blocks = _CLOSED_ANSWER.findall(text or "")
    body = blocks[-1].strip() if blocks else ""
    return code_boxed_answer(body) if body else ""
