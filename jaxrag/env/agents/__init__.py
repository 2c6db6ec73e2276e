"""Agent designs, one module each. `get_agent(name, **opts)` imports `jaxrag.env.agents.<name>` and builds
its `AGENT` class: adding a design means adding one module that defines `AGENT`, in the package or, named
"module.path:Class", anywhere importable (docs/ablations.md)."""
from __future__ import annotations

import importlib
import pkgutil

from jaxrag.env.agents.base import Agent
from jaxrag.stage_fn import StageError, resolve_attr

_ALIASES = {"search-o1": "search_o1", "searcho1": "search_o1", "re²search": "re2search",
            "re2-search": "re2search", "reason_rag": "reasonrag", "smart_search": "smartsearch"}


def _module_name(name: str) -> str:
    key = name.strip().lower()
    return _ALIASES.get(key, key.replace("-", "_"))


def available() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(__path__)
                  if m.name != "base" and not m.name.startswith("_"))


def _agent_class(spec: str):
    """The Agent subclass a "module.path:Class" names; KeyError in one line otherwise."""
    try:
        return resolve_attr(spec, f"agent {spec!r}", "Agent class",
                            lambda x: isinstance(x, type) and issubclass(x, Agent))
    except StageError as e:
        raise KeyError(str(e)) from None


def agent_module(name: str) -> str:
    """The module of agent design `name` (case and the aliases above accepted), or `name` itself for a
    "module.path:Class" of one's own; KeyError naming the known ones. Config checks call it to vet a name without
    building the agent."""
    if ":" in name:
        _agent_class(name)
        return name
    mod_name = _module_name(name)
    if mod_name not in available():
        raise KeyError(f"unknown agent {name!r} (known: {', '.join(available())})")
    return mod_name


def get_agent(name: str, **opts) -> Agent:
    """Build the agent design `name` (e.g. "react", "re2search", "search-o1") with options `opts`
    (mode="chat"|"plain", tokenizer=..., max_docs=..., max_doc_chars=..., summarizes=...)."""
    if ":" in name:
        return _agent_class(name)(**opts)
    cls = importlib.import_module(f"jaxrag.env.agents.{agent_module(name)}").AGENT
    return cls(**opts)


__all__ = ["Agent", "agent_module", "available", "get_agent"]
