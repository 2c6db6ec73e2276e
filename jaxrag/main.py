"""python -m jaxrag.main --config=configs/X.py --workdir=DIR [--config.a.b=value] [--stages=a,b] [--force]

Runs `config.stages` in order (ARCHITECTURE.md "Stages"): for each name, `config[name].fn = "module:function"` is
called as fn(config, workdir, name) and `workdir/<name>/DONE` is written when it returns; finished stages are skipped
on reruns (--force reruns them and forgets the DONE of every later stage first, --stages picks a subset). A config
file's presets are its get_config argument (`--config=configs/x.py:tiny`), applied before any --config.* override. Every stage's fn is imported and the config is checked before
any stage runs, so a typo fails before compute (unknown --config keys and wrong types are rejected by ml_collections).
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

from absl import app, flags
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "ml-collections config file (get_config()).", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for every stage's inputs and outputs.")
_STAGES = flags.DEFINE_list("stages", None, "Run only these stages (default: config.stages).")
_FORCE = flags.DEFINE_bool("force", False, "Rerun stages that have a DONE marker.")


class StageError(ValueError):
    pass


def resolve_fn(spec: str, where: str):
    if not isinstance(spec, str) or ":" not in spec:
        raise StageError(f"{where}: fn must be 'module.path:function', got {spec!r}")
    module, name = spec.split(":", 1)
    try:
        mod = importlib.import_module(module)
    except ImportError as e:
        raise StageError(f"{where}: cannot import module {module!r}: {e}") from None
    fn = getattr(mod, name, None)
    if not callable(fn):
        raise StageError(f"{where}: module {module!r} has no function {name!r}")
    return fn


def plan(config, only: list[str] | None = None) -> list[tuple[str, object]]:
    """[(stage name, fn)] checked up front: every stage has a sub-config with an importable fn."""
    if "stages" not in config:
        raise StageError("config has no 'stages' list")
    names = list(config.stages)
    if only:
        unknown = [s for s in only if s not in names]
        if unknown:
            raise StageError(f"--stages {unknown} not in config.stages {names}")
        names = [s for s in names if s in only]
    out = []
    for name in names:
        if name not in config:
            raise StageError(f"config.stages names {name!r} but the config has no '{name}' section")
        if "fn" not in config[name]:
            raise StageError(f"config.{name}: missing 'fn' (\"module.path:function\")")
        fn = resolve_fn(config[name].fn, f"config.{name}.fn")
        check = getattr(fn, "check_config", None)  # optional static check of the stage's own section
        if check is not None:
            check(config, name)
        out.append((name, fn))
    return out


def run(config, workdir: str | Path, only: list[str] | None = None, force: bool = False) -> list[str]:
    """Run the planned stages; returns the names that ran (skipped ones excluded)."""
    from jaxrag.train.distributed import maybe_initialize

    maybe_initialize()
    workdir = Path(workdir)
    stages = plan(config, only)
    ran = []
    if force:  # a forced stage invalidates everything after it: no old DONE may stand over new inputs
        first = list(config.stages).index(stages[0][0]) if stages else len(config.stages)
        for later in list(config.stages)[first:]:
            (workdir / later / "DONE").unlink(missing_ok=True)
    for name, fn in stages:
        done = workdir / name / "DONE"
        if done.exists() and not force:
            print(f"[main] {name}: done already ({done}), skipping")
            continue
        print(f"[main] {name}: running {config[name].fn}")
        (workdir / name).mkdir(parents=True, exist_ok=True)
        fn(config, str(workdir), name)
        import jax

        if jax.process_index() == 0:
            done.write_text("done\n")
        ran.append(name)
    return ran


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    from absl import logging

    logging.set_verbosity(logging.WARNING)  # orbax logs every save at INFO
    if _WORKDIR.value is None:
        raise app.UsageError("--workdir is required")
    try:
        run(_CONFIG.value, _WORKDIR.value, _STAGES.value, _FORCE.value)
    except StageError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    flags.mark_flags_as_required(["config"])
    app.run(main)
