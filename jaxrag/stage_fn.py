"""A config's "module.path:function" references, resolved with a clear error (StageError naming the config key).

Shared by the runner (jaxrag.main: every stage's fn) and the stages that take function references themselves
(judges and rewards of kind "fn"). It lives outside jaxrag.main because `python -m jaxrag.main` runs that file as
__main__: a stage importing jaxrag.main would load it a second time and define its command-line flags twice.
"""

from __future__ import annotations

import importlib


class StageError(ValueError):
    pass


def resolve_attr(spec: str, where: str, what: str = "function", ok=callable):
    """The attribute named by spec = "module.path:name", one for which ok(attribute) holds; `where` (e.g.
    "config.collect.judge.fn") names the key and `what` the kind of attribute in the error."""
    if not isinstance(spec, str) or ":" not in spec:
        raise StageError(f"{where}: fn must be 'module.path:{what}', got {spec!r}")
    module, name = spec.split(":", 1)
    try:
        mod = importlib.import_module(module)
    except ImportError as e:
        raise StageError(f"{where}: cannot import module {module!r}: {e}") from None
    attr = getattr(mod, name, None)
    if not ok(attr):
        raise StageError(f"{where}: module {module!r} has no {what} {name!r}")
    return attr


def resolve_fn(spec: str, where: str):
    """The callable named by spec = "module.path:function" (resolve_attr)."""
    return resolve_attr(spec, where)
