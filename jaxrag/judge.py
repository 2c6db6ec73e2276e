"""LLM-as-judge (LJ) through an OpenAI-compatible chat-completions endpoint, with urllib only.

Base URL and model come from config; the API key from an environment variable (never from config).
`OpenAIJudge.chat_result` is the one transport every HTTP judge uses (the answer judge here and the
process-supervision judges in jaxrag.supervision.judges): bounded attempts with exponential backoff,
Retry-After honoured on 429/503, an optional reply check (an unparseable reply is retried like a
transport error), and every failure kind recorded by name (HTTP status, timeout, connection refused,
malformed reply) with attempts and seconds. `chat` raises JudgeError; `judge_answer` returns None.
"""
from __future__ import annotations

import dataclasses
import email.utils
import json
import os
import socket
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Sequence

# ARENA App. D.3 Table 6, with the released code's layout (src/gpt_eval.py format_prompt): four newlines between the
# sections, the gold answers as Python's str() of their list, the response the <answer> text.
LJ_PROMPT = ("*************Consider a knowledge Q&A RAG task to test the capability of a testing model, the correct "
             "answer list is:*************\n{correct_answer}\n\n\n\n*************Here is the model's response:"
             "*************\n{model_response}\n\n\n\n*************Please check if the model's answer is correct. As "
             "long as the model's answer hits any item (or synonym) in the correct answer list, it can be considered "
             "correct. You only need to answer \"yes\" or \"no\".*************")

FATAL_STATUS = (400, 401, 403, 404)     # retrying cannot help
RETRY_AFTER_STATUS = (429, 503)         # the server may say when to come back


class JudgeError(RuntimeError):
    """The endpoint failed after all retries; the message says why."""


@dataclass
class ChatResult:
    """One chat exchange after its retries: the assistant text, or why there is none."""
    text: str | None            # None: failed (see failure)
    failure: str = ""           # "HTTP 500" | "timeout after 30s" | "connection refused" | "malformed reply: ..." |
                                # "unparseable reply: ..." (the reply check said no) | ...
    attempts: int = 0
    seconds: float = 0.0
    reply: str = ""             # the last reply text (content, or the raw body when malformed)
    status: int | None = None   # the last HTTP status seen

    @property
    def ok(self) -> bool:
        return self.text is not None and not self.failure


def retry_after_seconds(value: str | None) -> float | None:
    """Retry-After header -> seconds (delta-seconds or an HTTP date); None when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _is_timeout(reason: object) -> bool:
    return isinstance(reason, (TimeoutError, socket.timeout)) or "timed out" in str(reason)


@dataclass
class OpenAIJudge:
    base_url: str                          # e.g. http://127.0.0.1:8000/v1
    model: str
    api_key_env: str = "OPENAI_API_KEY"
    timeout_s: float = 30.0
    retries: int = 3                       # attempts in all (at least 1)
    backoff_s: float = 0.5                 # wait before attempt a (a >= 1): backoff_s * 2**(a-1)
    temperature: float = 0.0
    max_tokens: int = 16
    max_wait_s: float = 120.0              # cap on one Retry-After wait
    workers: int = 8                       # concurrent requests of judge_answers
    sleep: Callable[[float], None] = dataclasses.field(default=time.sleep, repr=False, compare=False)

    @property
    def url(self) -> str:
        return self.base_url.rstrip("/") + "/chat/completions"

    def _headers(self) -> dict:
        headers = {"Content-Type": "application/json"}
        key = os.environ.get(self.api_key_env, "")
        if key:
            headers["Authorization"] = f"Bearer {key}"
        return headers

    def _attempt(self, body: bytes, headers: dict) -> tuple[str | None, str, float | None, str, int | None]:
        """One POST: (content, failure, retry_after_s, reply text, HTTP status)."""
        raw = ""
        try:
            req = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
            with urllib.request.urlopen(req, timeout=self.timeout_s) as r:
                status = r.status
                raw = r.read().decode("utf-8")
            payload = json.loads(raw)
            content = payload["choices"][0]["message"]["content"]
            if not isinstance(content, str):
                raise TypeError(f"content is {type(content).__name__}")
            return content, "", None, content, status
        except urllib.error.HTTPError as e:
            wait = retry_after_seconds(e.headers.get("Retry-After")) if e.code in RETRY_AFTER_STATUS else None
            try:
                raw = e.read().decode("utf-8", errors="replace")[:2000]
            except Exception:
                raw = ""
            return None, f"HTTP {e.code}", wait, raw, e.code
        except urllib.error.URLError as e:
            reason = e.reason
            if _is_timeout(reason):
                return None, f"timeout after {self.timeout_s:g}s", None, raw, None
            if isinstance(reason, ConnectionRefusedError):
                return None, "connection refused", None, raw, None
            return None, f"connection error: {reason}", None, raw, None
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, IndexError, TypeError) as e:
            return None, f"malformed reply: {type(e).__name__}: {e}", None, raw[:2000], 200
        except OSError as e:   # socket.timeout is TimeoutError, an OSError; resets etc.
            if _is_timeout(e):
                return None, f"timeout after {self.timeout_s:g}s", None, raw, None
            if isinstance(e, ConnectionRefusedError):
                return None, "connection refused", None, raw, None
            return None, f"{type(e).__name__}: {e}", None, raw, None

    def chat_result(self, messages: list[dict], check: Callable[[str], str] | None = None,
                    attempts: int | None = None, max_tokens: int | None = None) -> ChatResult:
        """The assistant text of one chat completion, retried up to `attempts` (default `retries`) times.

        check(reply) -> "" when the reply is usable, else the reason it is not ("unparseable reply: <reason>"
        is recorded and the call retried). Waits: Retry-After on 429/503 (capped at max_wait_s), else
        exponential backoff. 400/401/403/404 are not retried."""
        body = json.dumps({"model": self.model, "messages": messages, "temperature": self.temperature,
                           "max_tokens": self.max_tokens if max_tokens is None else max_tokens}).encode()
        headers = self._headers()
        n = max(int(self.retries if attempts is None else attempts), 1)
        out = ChatResult(None, "no attempt")
        t0 = time.perf_counter()
        wait = None
        for a in range(n):
            if a:
                delay = min(wait, self.max_wait_s) if wait is not None else self.backoff_s * 2 ** (a - 1)
                if delay > 0:
                    self.sleep(delay)
            content, failure, wait, reply, status = self._attempt(body, headers)
            out.attempts, out.reply, out.status = a + 1, reply, status
            if content is not None and check is not None:
                why = check(content)
                if why:
                    failure = f"unparseable reply: {why}"
            if not failure:
                out.text, out.failure = content, ""
                break
            out.failure = failure + (f" (Retry-After {wait:g}s)" if wait is not None else "")
            if status in FATAL_STATUS:
                break
        out.seconds = time.perf_counter() - t0
        return out

    def chat(self, messages: list[dict]) -> str:
        """The assistant text of one chat completion; JudgeError after `retries` failed attempts."""
        r = self.chat_result(messages)
        if not r.ok:
            raise JudgeError(f"{self.url}: judge failed after {r.attempts} attempt(s): {r.failure}")
        return r.text

    def judge_answer(self, golds: Sequence[str], response: str | None) -> bool | None:
        """LJ: True/False, or None when the judge could not be reached or its reply says neither yes nor no."""
        return self.judge_answer_result(golds, response)[0]

    def judge_answer_result(self, golds: Sequence[str], response: str | None) -> tuple[bool | None, ChatResult | None]:
        """(verdict, the exchange): verdict None when every attempt failed (the ChatResult says why: HTTP status,
        timeout, refused connection, or a reply that says neither yes nor no, which is retried); no exchange when
        there is no answer to judge (None or blank: verdict False, as the released code scores an empty answer 0)."""
        if response is None or not response.strip():
            return False, None
        prompt = LJ_PROMPT.format(correct_answer=str(list(golds)), model_response=response.strip())
        check = lambda reply: "" if parse_yes_no(reply) is not None else f"neither yes nor no: {reply[:80]!r}"
        r = self.chat_result([{"role": "user", "content": prompt}], check=check)
        return (parse_yes_no(r.text) if r.ok else None), r

    def judge_answers(self, items: Sequence[tuple[Sequence[str], str | None]]) -> list[tuple[bool | None,
                                                                                           ChatResult | None]]:
        """judge_answer_result of every (golds, response), `workers` requests at a time, in order."""
        if len(items) <= 1 or self.workers <= 1:
            return [self.judge_answer_result(g, r) for g, r in items]

        with ThreadPoolExecutor(max_workers=min(self.workers, len(items))) as pool:
            return list(pool.map(lambda item: self.judge_answer_result(*item), items))


def verdict_record(verdict: bool | None, r: ChatResult | None) -> dict:
    """What an episode keeps of its LJ call (metadata["lj"]): the verdict, and with a call its attempts and seconds,
    and why it failed when the verdict is None."""
    rec: dict = {"verdict": verdict}
    if r is not None:
        rec.update(attempts=r.attempts, seconds=round(r.seconds, 3))
        if verdict is None:
            rec["failure"] = r.failure
    return rec


def parse_yes_no(reply: str) -> bool | None:
    """The first word that is "yes" or "no". The released scorer (src/gpt_eval.py get_score) tests the substrings
    'yes', then 'no', and scores a reply with neither 0.5; here such a reply is retried and, if it stays so, recorded
    as a failure (the verdict None)."""
    words = "".join(c if c.isalpha() else " " for c in (reply or "").lower()).split()
    for w in words:
        if w == "yes":
            return True
        if w == "no":
            return False
    return None


CONFIG_KEYS = ("base_url", "model", "api_key_env", "timeout_s", "retries", "backoff_s", "workers")


def judge_from_config(cfg) -> OpenAIJudge | None:
    """cfg: a dict/ConfigDict with base_url, model (+ optional api_key_env, timeout_s, retries, backoff_s, workers);
    None if no base_url. Any other key is a ValueError (a misspelled option is never silently ignored)."""
    if cfg is None:
        return None
    unknown = sorted(set(cfg.keys() if hasattr(cfg, "keys") else vars(cfg)) - set(CONFIG_KEYS))
    if unknown:
        raise ValueError(f"unknown keys {unknown} (known: {sorted(CONFIG_KEYS)})")
    get = cfg.get if hasattr(cfg, "get") else (lambda k, d=None: getattr(cfg, k, d))
    if not get("base_url"):
        return None
    return OpenAIJudge(base_url=get("base_url"), model=get("model", "gpt-4o"),
                       api_key_env=get("api_key_env", "OPENAI_API_KEY"), timeout_s=float(get("timeout_s", 30.0)),
                       retries=int(get("retries", 3)), backoff_s=float(get("backoff_s", 0.5)),
                       workers=int(get("workers", 8)))
