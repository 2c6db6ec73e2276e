"""Agent designs, one module each. `get_agent(name, **opts)` imports `jaxrag.env.agents.<name>` and builds
its `AGENT` class: adding a design means adding one module that defines `AGENT`."""
from __future__ import annotations

import importlib
import pkgutil

from jaxrag.env.agents.base import Agent

_ALIASES = {"search-o1": "search_o1", "searcho1": "search_o1", "re²search": "re2search",
            "re2-search": "re2search", "reason_rag": "reasonrag", "smart_search": "smartsearch"}


def _module_name(name: str) -> str:
    key = name.strip().lower()
    return _ALIASES.get(key, key.replace("-", "_"))


def available() -> list[str]:
    import jaxrag.env.agents as pkg
    return sorted(m.name for m in pkgutil.iter_modules(pkg.__path__)
                  if m.name != "base" and not m.name.startswith("_"))


def agent_module(name: str) -> str:
    """The module of agent design `name` (case and the aliases above accepted); KeyError naming the known ones.
    Config checks call it to vet a name without building the agent."""
    mod_name = _module_name(name)
    if mod_name not in available():
        raise KeyError(f"unknown agent {name!r} (known: {', '.join(available())})")
    return mod_name


def get_agent(name: str, **opts) -> Agent:
    """Build the agent design `name` (e.g. "react", "re2search", "search-o1") with options `opts`
    (mode="chat"|"plain", tokenizer=..., max_docs=..., max_doc_chars=..., summarizes=...)."""
    cls = importlib.import_module(f"jaxrag.env.agents.{agent_module(name)}").AGENT
    return cls(**opts)


__all__ = ["Agent", "agent_module", "available", "get_agent"]
