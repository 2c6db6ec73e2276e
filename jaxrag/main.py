"""python -m jaxrag.main --config=configs/X.py[:preset] --workdir=DIR [--config.a.b=value] [--stages=a,b]
                        [--force | --rerun_changed] [--debug]

Runs `config.stages` in order (ARCHITECTURE.md "Stages"): for each name, `config[name].fn = "module:function"` is
called as fn(config, workdir, name) and `workdir/<name>/DONE` (with the stage's settings fingerprint, its wall
time, the part of it spent tracing and compiling, and a content hash of what it wrote: jaxrag/provenance.py) is
written when it returns; the run ends with the wall time per stage. Finished stages are skipped on reruns; one
whose settings changed is refused with the keys named (--rerun_changed reruns it and everything after it; --force
reruns the planned stages). --stages picks a subset.
A config file's preset is its get_config argument, applied before any --config.* override, so overrides win.
Every stage's fn is imported and the config is checked before any stage runs, so a typo fails before compute
(unknown --config keys and wrong types are rejected by ml_collections; every stage's trainer sections and input
paths are checked too). One run per workdir (jaxrag/workdir.py). An error the user can act on ends the run with
exit 2 and one line (jaxrag/cli_errors.py; --debug shows the traceback); docs/faults.md lists the faults and tests.
Each stage starts with a `[i/N] name` header (time so far, an estimate where the config has `expected_seconds`);
the console's text is also appended to <workdir>/log.txt, progress-bar redraws collapsed (jaxrag/console.py).
"""

from __future__ import annotations

import sys
import time
import uuid
from pathlib import Path

from jaxrag import cpu_numerics

cpu_numerics.pin()  # before JAX starts its CPU backend: the CLI's runs compute the same bits on every x86-64 CPU

import jax  # noqa: E402
from absl import app, flags, logging
from ml_collections import config_flags

from jaxrag import cli_errors, workdir as wd
from jaxrag.compilation import compilation
from jaxrag.console import LogFile, StageClock, quiet
from jaxrag.provenance import stage_hash
from jaxrag.settings import flatten
from jaxrag.stage_fn import StageError, resolve_fn
from jaxrag.train import config as tconfig, objectives, preemption
from jaxrag.train.distributed import barrier, maybe_initialize

_CONFIG = config_flags.DEFINE_config_file("config", None, "ml-collections config file (get_config()).", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for every stage's inputs and outputs.")
_STAGES = flags.DEFINE_list("stages", None, "Run only these stages (default: config.stages).")
_FORCE = flags.DEFINE_bool("force", False, "Rerun the planned stages even if finished (and every later stage).")
_RERUN_CHANGED = flags.DEFINE_bool("rerun_changed", False,
                                   "Rerun the finished stages whose settings changed, and every stage after them.")
flags.DEFINE_bool("debug", False, "Show the traceback of a user error too (also JAXRAG_DEBUG=1).")


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
        check_train_sections(config, name)
        out.append((name, fn))
    return out


def check_train_sections(config, name: str) -> None:
    """Every trainer section of a stage (a dict with `loss`, `steps` and `optimizer`) passes the trainer's checks
    (train.config.validate) before any stage runs: a bad value (steps=-5) fails naming its key, not after the stages
    before it have run. In a stage with an `rl` section the loop sets the batch size itself; it is left out."""
    def walk(v, key):
        if hasattr(v, "items"):
            if all(k in v for k in ("loss", "steps", "optimizer")):
                yield key, v
            for k, x in v.items():
                yield from walk(x, f"{key}.{k}")

    for key, section in walk(config[name], f"config.{name}"):
        try:
            t = tconfig.resolve(section.to_dict() if hasattr(section, "to_dict") else dict(section), check=False)
            if "rl" in config[name]:
                groups = objectives.get(t.loss).layout == "groups"
                t.batch_size = t.grad_accum * (t.grpo.group_size if groups else 1)
            tconfig.validate(t)
        except (ValueError, KeyError, TypeError) as e:
            msg = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
            raise StageError(f"{key}.{msg.removeprefix('train config: ')}") from None


def run(config, workdir: str | Path, only: list[str] | None = None, force: bool = False,
        rerun_changed: bool = False) -> list[str]:
    """Run the planned stages under the workdir lock; returns the names that ran (skipped ones excluded).

    What each stage does is decided before any runs (workdir.plan_steps): a finished stage is skipped when its
    recorded settings fingerprint matches; a changed one is refused (naming the keys) unless `rerun_changed` (rerun
    it and everything after it) or `force` (rerun every planned stage and forget the DONE of every stage after the
    first one rerun); one made from an older generation of its inputs reruns. See jaxrag/workdir.py.
    """
    maybe_initialize()
    compilation()
    workdir = Path(workdir)
    stages = dict(plan(config, only))
    timings: dict[str, float] = {}  # the stages that ran -> their wall seconds
    lead = jax.process_index() == 0
    clock = StageClock(list(stages), config.get("expected_seconds"))
    with wd.Lock(workdir) if lead else _Null():
        if lead:
            for name in config.stages:
                wd.recover(workdir / name)
        barrier("main:recover")  # multi-host: every process plans from the DONE records process 0 left
        steps = wd.plan_steps(config, workdir, list(stages), force, rerun_changed)  # refusals before any change
        wd.missing_inputs(config, [s.name for s in steps if s.action == "run"], workdir)
        if lead:
            wd.save_effective_config(workdir, config)
        upstream_run = ""  # the run_id of the stage before (DONE), recorded by the next stage that runs
        for step in steps:
            name, sdir = step.name, workdir / step.name
            if step.action in ("keep", "forget"):
                if step.action == "forget" and lead:  # its inputs were just rebuilt
                    (sdir / "DONE").unlink()
                upstream_run = wd.done_run_id(sdir / "DONE")
                continue
            if step.action == "skip":
                print(f"[main] {name}: done already ({sdir / 'DONE'}), skipping")
                clock.skip(name)
                upstream_run = wd.done_run_id(sdir / "DONE")
                continue
            preemption.check()  # a SIGTERM during the last stage's final step stops the run here
            if step.why:
                print(f"[main] {name}: {step.why}")
            print(clock.header(name))
            print(f"[main] {name}: running {config[name].fn}", flush=True)
            inputs = wd.input_records(config, name, workdir) if lead else {}
            prev = wd.set_aside(sdir) if lead else None
            sdir.mkdir(parents=True, exist_ok=True)
            barrier(f"main:start:{name}")
            t0, c0 = time.perf_counter(), compilation()[1]
            try:
                stages[name](config, str(workdir), name)
            except BaseException as e:
                if prev is not None:  # the old, complete outputs go back; the partial new ones go
                    wd.restore(sdir, prev)
                e.stage = name  # main() names it in its one-line report
                e.restored = prev is not None
                raise
            seconds, compiling = round(time.perf_counter() - t0, 1), round(compilation()[1] - c0, 1)
            print(f"[main] {name}: finished in {seconds:.0f} s ({compiling:.0f} s of it tracing and compiling)")
            clock.done(name, seconds)
            run_id = uuid.uuid4().hex[:16]
            if lead:
                wd.write_done(sdir / "DONE", {"fingerprint": step.fingerprint, "settings": step.settings,
                                              "seconds": seconds, "compile_seconds": compiling, "run_id": run_id,
                                              "upstream_run": upstream_run, "inputs": inputs,
                                              "provenance": stage_hash(sdir)})
                wd.finish(prev)
            barrier(f"main:done:{name}")
            upstream_run = run_id
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
    if jax.config.jax_compilation_cache_dir:
        return
    jax.config.update("jax_compilation_cache_dir", str(workdir / ".xla_cache"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.3)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")

    logging.set_verbosity(logging.WARNING)  # orbax logs every save at INFO
    cli_errors.quiet_disk_errors()  # a full disk is reported in one line at the end, not by every failed write
    if _WORKDIR.value is None:
        raise app.UsageError("--workdir is required")
    if "://" in _WORKDIR.value:  # pathlib would read gs://b/x as the local folder gs:/b/x
        print(f"error: --workdir={_WORKDIR.value}: object-storage workdirs are not supported (stages write through "
              "local paths); give a local or shared-filesystem (NFS, GCS FUSE mount) path", file=sys.stderr)
        sys.exit(2)
    quiet()
    with LogFile(Path(_WORKDIR.value) / log_name()):  # the console's text, progress-bar redraws collapsed
        _main()


def log_name() -> str:
    """log.txt: process 0's console, the run's log (one copy of each line); on several processes (docs/multihost.md)
    process p > 0 writes log.process<p>.txt beside it (its own errors stay readable)."""
    if not maybe_initialize():
        return "log.txt"

    return "log.txt" if jax.process_index() == 0 else f"log.process{jax.process_index()}.txt"


def _main():
    config = _CONFIG.value
    overrides = config_flags.get_override_values(flags.FLAGS["config"])
    print(f"[main] config {config_flags.get_config_filename(flags.FLAGS['config'])}"
          + "".join(f" --config.{k}={v!r}" for k, v in sorted(flatten(overrides).items()))
          + f" (in effect after the preset; all {len(flatten(config.to_dict()))} settings in "
          + f"{Path(_WORKDIR.value) / 'config.json'})", flush=True)
    compilation_cache(Path(_WORKDIR.value))
    preemption.install()  # SIGTERM: the training loops checkpoint at the next step and stop (exit 143)
    try:
        run(config, _WORKDIR.value, _STAGES.value, _FORCE.value, _RERUN_CHANGED.value)
    except KeyboardInterrupt as e:  # Ctrl-C: one line, exit 130
        cli_errors.interrupted(e)
    except Exception as e:  # noqa: BLE001  a user error: one line, exit 2 (jaxrag/cli_errors.py); a bug raises
        cli_errors.report(e, _WORKDIR.value)


if __name__ == "__main__":
    flags.mark_flags_as_required(["config"])
    app.run(main, flags_parser=cli_errors.parse_flags)
