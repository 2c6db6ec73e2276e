"""LLM-as-judge (LJ) through an OpenAI-compatible chat-completions endpoint, with urllib only.

Base URL and model come from config; the API key from an environment variable (never from config).
Timeouts and retries with backoff; a malformed reply is retried, then reported as None (never a crash).
"""
from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Sequence

# ARENA App. D.3 Table 6
LJ_PROMPT = ("*************Consider a knowledge Q&A RAG task to test the capability of a testing model, the correct "
             "answer list is:*************\n{correct_answer}\n*************Here is the model's response:*************\n"
             "{model_response}\n*************Please check if the model's answer is correct. As long as the model's "
             "answer hits any item (or synonym) in the correct answer list, it can be considered correct. You only "
             "need to answer \"yes\" or \"no\".*************")


class JudgeError(RuntimeError):
    """The endpoint failed after all retries; the message says why."""


@dataclass
class OpenAIJudge:
    base_url: str                          # e.g. http://127.0.0.1:8000/v1
    model: str
    api_key_env: str = "OPENAI_API_KEY"
    timeout_s: float = 30.0
    retries: int = 3
    backoff_s: float = 0.5
    temperature: float = 0.0
    max_tokens: int = 16

    def chat(self, messages: list[dict]) -> str:
        """The assistant text of one chat completion; JudgeError after `retries` failed attempts."""
        url = self.base_url.rstrip("/") + "/chat/completions"
        body = json.dumps({"model": self.model, "messages": messages, "temperature": self.temperature,
                           "max_tokens": self.max_tokens}).encode()
        headers = {"Content-Type": "application/json"}
        key = os.environ.get(self.api_key_env, "")
        if key:
            headers["Authorization"] = f"Bearer {key}"
        last = "no attempt"
        for attempt in range(max(self.retries, 1)):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                req = urllib.request.Request(url, data=body, headers=headers, method="POST")
                with urllib.request.urlopen(req, timeout=self.timeout_s) as r:
                    payload = json.loads(r.read().decode("utf-8"))
                content = payload["choices"][0]["message"]["content"]
                if not isinstance(content, str):
                    raise TypeError(f"content is {type(content).__name__}")
                return content
            except urllib.error.HTTPError as e:
                last = f"HTTP {e.code}"
                if e.code in (400, 401, 403, 404):
                    break
            except (urllib.error.URLError, TimeoutError, OSError) as e:
                last = f"{type(e).__name__}: {e}"
            except (json.JSONDecodeError, UnicodeDecodeError, KeyError, IndexError, TypeError) as e:
                last = f"malformed reply: {type(e).__name__}: {e}"
        raise JudgeError(f"{url}: judge failed after {attempt + 1} attempt(s): {last}")

    def judge_answer(self, golds: Sequence[str], response: str | None) -> bool | None:
        """LJ: True/False, or None when the judge could not be reached or its reply says neither yes nor no."""
        if response is None:
            return False
        prompt = LJ_PROMPT.format(correct_answer=json.dumps(list(golds), ensure_ascii=False), model_response=response)
        try:
            reply = self.chat([{"role": "user", "content": prompt}])
        except JudgeError:
            return None
        return parse_yes_no(reply)


def parse_yes_no(reply: str) -> bool | None:
    words = "".join(c if c.isalpha() else " " for c in (reply or "").lower()).split()
    for w in words:
        if w == "yes":
            return True
        if w == "no":
            return False
    return None


def judge_from_config(cfg) -> OpenAIJudge | None:
    """cfg: a dict/ConfigDict with base_url, model (+ optional api_key_env, timeout_s, retries); None if no base_url."""
    if cfg is None:
        return None
    get = cfg.get if hasattr(cfg, "get") else (lambda k, d=None: getattr(cfg, k, d))
    if not get("base_url"):
        return None
    return OpenAIJudge(base_url=get("base_url"), model=get("model", "gpt-4o"),
                       api_key_env=get("api_key_env", "OPENAI_API_KEY"), timeout_s=float(get("timeout_s", 30.0)),
                       retries=int(get("retries", 3)), backoff_s=float(get("backoff_s", 0.5)))
