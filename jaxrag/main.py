"""python -m jaxrag.main --config=configs/X.py[:preset] --workdir=DIR [--config.a.b=value] [--stages=a,b]
                        [--force | --rerun_changed]

Runs `config.stages` in order (ARCHITECTURE.md "Stages"): for each name, `config[name].fn = "module:function"` is
called as fn(config, workdir, name) and `workdir/<name>/DONE` (with the stage's settings fingerprint, its wall
time, the part of it spent tracing and compiling, and a content hash of what it wrote: jaxrag/provenance.py) is
written when it returns; the run ends with the wall time per stage. Finished stages are skipped on reruns; one
whose settings changed is refused with the keys named (--rerun_changed reruns it and everything after it; --force
reruns the planned stages). --stages picks a subset.
A config file's preset is its get_config argument, applied before any --config.* override, so overrides win.
Every stage's fn is imported and the config is checked before any stage runs, so a typo fails before compute
(unknown --config keys and wrong types are rejected by ml_collections). One run per workdir (jaxrag/workdir.py).
Each stage starts with a `[i/N] name` header (time so far, an estimate where the config has `expected_seconds`);
the console's text is also appended to <workdir>/log.txt, progress-bar redraws collapsed (jaxrag/console.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

from absl import app, flags
from ml_collections import config_flags

from jaxrag.compilation import compilation
from jaxrag.console import LogFile, StageClock, quiet
from jaxrag.provenance import stage_hash
from jaxrag.settings import changed_keys, flatten
from jaxrag.stage_fn import StageError, resolve_fn
from jaxrag.workdir import WorkdirError

_CONFIG = config_flags.DEFINE_config_file("config", None, "ml-collections config file (get_config()).", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for every stage's inputs and outputs.")
_STAGES = flags.DEFINE_list("stages", None, "Run only these stages (default: config.stages).")
_FORCE = flags.DEFINE_bool("force", False, "Rerun the planned stages even if finished (and every later stage).")
_RERUN_CHANGED = flags.DEFINE_bool("rerun_changed", False,
                                   "Rerun the finished stages whose settings changed, and every stage after them.")


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
            try:
                check(config, name)
            except (ValueError, KeyError, TypeError) as e:  # a KeyError's str() is its repr: take the message
                raise StageError(e.args[0] if isinstance(e, KeyError) and e.args else str(e)) from None
        out.append((name, fn))
    return out


def run(config, workdir: str | Path, only: list[str] | None = None, force: bool = False,
        rerun_changed: bool = False) -> list[str]:
    """Run the planned stages under the workdir lock; returns the names that ran (skipped ones excluded).

    A finished stage is skipped when its recorded settings fingerprint matches; a changed one is refused (naming
    the keys) unless `rerun_changed` (rerun it and everything after it) or `force` (rerun every planned stage and
    forget the DONE of every stage after the first one rerun). See jaxrag/workdir.py.
    """
    import shutil
    import time

    import jax

    from jaxrag import workdir as wd
    from jaxrag.train.distributed import barrier, maybe_initialize

    maybe_initialize()
    compilation()
    workdir = Path(workdir)
    stages = dict(plan(config, only))
    timings: dict[str, float] = {}  # the stages that ran -> their wall seconds
    lead = jax.process_index() == 0
    clock = StageClock(list(stages), config.get("expected_seconds"))
    with wd.Lock(workdir) if lead else _Null():
        if lead:
            wd.save_effective_config(workdir, config)
        upstream, invalidated, stale = "", False, None
        for name in config.stages:
            settings = wd.stage_settings(config, name)
            fp = wd.fingerprint(settings, upstream)
            upstream = fp
            sdir = workdir / name
            if lead:
                wd.recover(sdir)
            barrier(f"main:recover:{name}")  # multi-host: every process reads the DONE process 0 left
            done = wd.read_done(sdir / "DONE")
            if name not in stages:
                if invalidated and done is not None:  # its inputs were just rebuilt
                    if lead:
                        (sdir / "DONE").unlink()
                elif done is not None and done.get("fingerprint", fp) != fp and stale is None:
                    stale = (name, changed_keys(done.get("settings", {}), settings))
                continue
            if stale is not None:  # its inputs were made under other settings than the ones it would record
                raise StageError(f"{name}: the earlier stage {stale[0]!r} was finished under other settings (changed: "
                                 f"{', '.join(stale[1]) or 'an earlier stage'}); rerun from there (add it to --stages, "
                                 "or --rerun_changed without --stages)")
            if done is not None and not (force or invalidated):
                if done.get("fingerprint", fp) == fp:
                    print(f"[main] {name}: done already ({sdir / 'DONE'}), skipping")
                    clock.skip(name)
                    continue
                keys = changed_keys(done.get("settings", {}), settings)
                if not rerun_changed:
                    raise StageError(f"{name}: finished under other settings (changed: {', '.join(keys) or 'an earlier stage'}); "
                                     "rerun with --rerun_changed (this stage and every later one) or --force")
                print(f"[main] {name}: settings changed ({', '.join(keys) or 'upstream'}), rerunning")
            print(clock.header(name))
            print(f"[main] {name}: running {config[name].fn}", flush=True)
            prev = wd.set_aside(sdir) if lead else None
            sdir.mkdir(parents=True, exist_ok=True)
            barrier(f"main:start:{name}")
            t0, c0 = time.perf_counter(), compilation()[1]
            try:
                stages[name](config, str(workdir), name)
            except BaseException as e:
                if prev is not None:  # the old, complete outputs go back; the partial new ones go
                    shutil.rmtree(sdir, ignore_errors=True)
                    prev.rename(sdir)
                e.stage = name  # main() names it in its one-line report
                raise
            seconds, compiling = round(time.perf_counter() - t0, 1), round(compilation()[1] - c0, 1)
            print(f"[main] {name}: finished in {seconds:.0f} s ({compiling:.0f} s of it tracing and compiling)")
            clock.done(name, seconds)
            if lead:
                wd.write_done(sdir / "DONE", {"fingerprint": fp, "settings": settings, "seconds": seconds,
                                              "compile_seconds": compiling, "provenance": stage_hash(sdir)})
                if prev is not None:
                    shutil.rmtree(prev, ignore_errors=True)
            barrier(f"main:done:{name}")
            invalidated = True
            timings[name] = seconds
    if len(timings) > 1:
        total = sum(timings.values())
        print(f"[main] wall time per stage ({total / 60:.1f} min in all): "
              + ", ".join(f"{n} {t:.0f} s" for n, t in sorted(timings.items(), key=lambda kv: -kv[1])))
    return list(timings)


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def compilation_cache(workdir: Path) -> None:
    """XLA's persistent compilation cache in <workdir>/.xla_cache, unless one is set (JAX_COMPILATION_CACHE_DIR):
    stages that compile the same program (the sampler or a train step at the same shapes) compile it once per run,
    and a rerun in the workdir reuses them. The cached executables are the ones a compile would make, so results
    do not change (the tiny pipeline's results.csv is byte-identical with and without it; its compile seconds fell
    from 291 to 259 s)."""
    import jax

    if jax.config.jax_compilation_cache_dir:
        return
    jax.config.update("jax_compilation_cache_dir", str(workdir / ".xla_cache"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.3)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    from absl import logging

    logging.set_verbosity(logging.WARNING)  # orbax logs every save at INFO
    if _WORKDIR.value is None:
        raise app.UsageError("--workdir is required")
    quiet()
    with LogFile(Path(_WORKDIR.value) / "log.txt"):  # the console's text, progress-bar redraws collapsed
        _main()


def _main():
    from jaxrag.train.checkpoint import CheckpointCorrupt
    from jaxrag.train.loop import ConfigChanged, NonFiniteLoss

    if "://" in _WORKDIR.value:  # pathlib would read gs://b/x as the local folder gs:/b/x
        print(f"error: --workdir={_WORKDIR.value}: object-storage workdirs are not supported (stages write through "
              "local paths); give a local or shared-filesystem (NFS, GCS FUSE mount) path", file=sys.stderr)
        sys.exit(2)
    config = _CONFIG.value
    overrides = config_flags.get_override_values(flags.FLAGS["config"])
    print(f"[main] config {config_flags.get_config_filename(flags.FLAGS['config'])}"
          + "".join(f" --config.{k}={v!r}" for k, v in sorted(flatten(overrides).items()))
          + f" (in effect after the preset; all {len(flatten(config.to_dict()))} settings in "
          + f"{Path(_WORKDIR.value) / 'config.json'})", flush=True)
    compilation_cache(Path(_WORKDIR.value))
    try:
        run(config, _WORKDIR.value, _STAGES.value, _FORCE.value, _RERUN_CHANGED.value)
    except (StageError, WorkdirError, CheckpointCorrupt, ConfigChanged, NonFiniteLoss) as e:
        # errors the user acts on: one line, last in the output, no traceback (options named relative to the stage)
        stage = getattr(e, "stage", None)
        print(f"error: {f'stage {stage!r} (config.{stage}): ' if stage else ''}{e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    flags.mark_flags_as_required(["config"])
    app.run(main)
