"""A workdir you can trust: one run at a time, settings recorded per stage, outputs visible only when complete.

- Lock: `workdir/.lock` holds the running job's PID and host, created whole (written to a temp name, then linked)
  under an flock on `.lock.guard`, so two starters never both hold it. A second run meets a clear error naming the
  holder; a lock whose process is gone (same host) is stale and taken over; a live holder never is.
- Settings: every check (changed settings, inputs made under other settings) runs before any stage does
  (`plan_steps`); only then is the effective config saved as `workdir/config.json` (with the package version and git
  commit), so a refused run leaves it as the outputs were made. Each finished stage records in `workdir/<stage>/DONE`
  the fingerprint of what it depends on: its own section, the config's global keys (seed, model, index, ...) and
  the fingerprint of the stage before it (so a change upstream reaches every stage downstream). A rerun whose
  settings changed for a finished stage is refused with the changed keys named, unless asked to rerun (`--force`,
  or `--rerun_changed` for exactly the stages whose settings changed and everything after them). Settings that
  cannot change a stage's outputs (settings.NEUTRAL: progress bars, log and checkpoint cadence, which checkpoint to
  resume from) are left out, so e.g. `restore_step` never blocks a rerun.
- Generations: DONE also records the stage's `run_id` and the `run_id` of the stage before it as it was used
  (`upstream_run`). A stage made from other outputs of the stage before it than the ones now there (a --force run
  killed part way: the stages it had rerun are new, the rest old) is rerun by the next run instead of being taken
  for done, so a workdir never mixes generations.
- Atomic reruns: before a finished stage is rerun its old outputs are moved to `<stage>.prev`; they are deleted when
  the new run completes (DONE written) and put back if it fails (or, after a kill, at the next start). A complete
  new stage always wins over `.prev`; a directory is renamed to `<stage>.deleting` before it is deleted, so no
  half-deleted tree ever bears a live name and DONE never stands over missing files.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import os
import shutil
import socket
import subprocess
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from jaxrag.settings import as_before, changed_keys, is_neutral
from jaxrag.stage_fn import StageError


class WorkdirError(RuntimeError):
    pass


# ------------------------------------------------------------------------------------------------------ lock
class Lock:
    """`workdir/.lock` names the running job (pid, host). It is created whole: the record is written to a temp file
    and hard-linked to `.lock` (a link fails if the name exists), so no starter ever reads an empty lock. Deciding
    that a lock is stale and replacing it happens under an flock on `.lock.guard` (released by the kernel when its
    holder dies), so two starters never both take over one stale lock. A live holder is never taken over (an exited
    but unreaped one, a zombie, is not live); a lock from another host is taken for live."""

    def __init__(self, workdir: Path):
        self.path = Path(workdir) / ".lock"
        self.held = False

    def __enter__(self):
        workdir = self.path.parent
        workdir.mkdir(parents=True, exist_ok=True)
        me = json.dumps({"pid": os.getpid(), "host": socket.gethostname()})
        tmp = workdir / f".lock.{os.getpid()}.tmp"
        tmp.write_text(me)
        try:
            with open(workdir / ".lock.guard", "a") as guard:
                fcntl.flock(guard, fcntl.LOCK_EX)
                try:
                    self._take(tmp)
                finally:
                    fcntl.flock(guard, fcntl.LOCK_UN)
        finally:
            tmp.unlink(missing_ok=True)
        self.held = True
        return self

    def _take(self, tmp: Path) -> None:
        for _ in range(2):
            try:
                os.link(tmp, self.path)
                return
            except FileExistsError:
                pass
            holder = self._holder()
            if holder is not None and not self._stale(holder):
                raise WorkdirError(f"{self.path.parent} is in use by another run (pid {holder['pid']} on "
                                   f"{holder['host']}); wait for it, or remove {self.path} if it is gone")
            print(f"[main] taking over a stale lock {self.path} ({holder})", flush=True)
            self.path.unlink(missing_ok=True)
        raise WorkdirError(f"{self.path}: could not take the lock")

    def _holder(self) -> dict | None:
        try:
            rec = json.loads(self.path.read_text())
            return rec if isinstance(rec, dict) else None
        except (OSError, json.JSONDecodeError):
            return None  # unreadable: left by an older version killed while writing it (a lock is written whole)

    @staticmethod
    def _stale(holder: dict) -> bool:
        if holder.get("host") != socket.gethostname():
            return False  # another machine's process: cannot tell, assume alive
        try:
            pid = int(holder["pid"])
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except (PermissionError, ValueError, KeyError, TypeError):
            return False
        return _exited(pid)

    def __exit__(self, *exc):
        if self.held:
            self.path.unlink(missing_ok=True)


def _exited(pid: int) -> bool:
    """A process that has exited but was not yet reaped (a zombie) still answers kill(pid, 0). A run SIGKILLed with
    its launcher leaves its processes orphaned, and where nothing reaps orphans (a container whose PID 1 is not an
    init) they stay zombies for good: their lock is stale. Linux only (/proc); elsewhere a live pid counts as live."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2:][:1] in ("Z", "X")  # the state follows the parenthesized command name


# ------------------------------------------------------------------------------------------------ settings
def _plain(v):
    if hasattr(v, "to_dict"):
        v = v.to_dict()
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    return v


def _drop_neutral(d, path: str = ""):
    if not isinstance(d, dict):
        return d
    out = {}
    for k, v in d.items():
        key = f"{path}.{k}" if path else k
        if not is_neutral(key) and not as_before(key, v):
            out[k] = _drop_neutral(v, key)
    return out


def stage_settings(config, name: str) -> dict:
    """What a stage depends on in the config: its own section and the global (non-stage) keys, NEUTRAL ones left out."""
    stages = set(config.stages)
    glob = {k: _plain(v) for k, v in config.items() if k not in stages and k != "stages"}
    return _drop_neutral({name: _plain(config[name]), **glob})


def fingerprint(settings: dict, upstream: str) -> str:
    blob = json.dumps({"settings": settings, "upstream": upstream}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


class UnreadableDone(Exception):
    """A DONE file that is not a complete record (truncated, empty, not JSON, no fingerprint)."""


def read_done(path: Path) -> dict | None:
    """The DONE record ({"fingerprint", "settings", "run_id", ...}), None if absent. A file that is not a whole
    record raises UnreadableDone naming it: a stage is finished only under a record that says under what settings."""
    if not path.exists():
        return None
    try:
        rec = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UnreadableDone(f"{path}: not a DONE record ({type(e).__name__}: {e})") from None
    if not isinstance(rec, dict) or not isinstance(rec.get("fingerprint"), str):
        raise UnreadableDone(f"{path}: not a DONE record (no fingerprint)")
    return rec


def done_run_id(path: Path) -> str | None:
    """The run_id of a stage's DONE record; None when it is absent or unreadable."""
    try:
        return (read_done(path) or {}).get("run_id")
    except UnreadableDone:
        return None


def write_done(path: Path, record: dict) -> None:
    tmp = path.with_name("DONE.tmp")
    tmp.write_text(json.dumps(record, indent=1, sort_keys=True))
    tmp.replace(path)


def save_effective_config(workdir: Path, config) -> None:
    """workdir/config.json: the config as run, with the package version and git commit (when there is one)."""
    try:
        ver = version("jaxrag")
    except PackageNotFoundError:
        ver = None
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True,
                                text=True, timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        commit = None
    rec = {"jaxrag_version": ver, "git_commit": commit, "config": _plain(config)}
    tmp = workdir / "config.json.tmp"
    tmp.write_text(json.dumps(rec, indent=1, default=str))
    tmp.replace(workdir / "config.json")


# ------------------------------------------------------------------------------------------ atomic reruns
# A stage's directory is complete exactly when it holds DONE (written last). Every move below is one rename, and a
# directory is deleted only after it was renamed to `<stage>.deleting`, so a kill at any moment leaves: the stage
# (with or without DONE), maybe `<stage>.prev` (complete old outputs), maybe a `.deleting` leftover; `recover`
# resolves each case without ever deleting a complete stage.
def _prev(stage_dir: Path) -> Path:
    return stage_dir.with_name(stage_dir.name + ".prev")


def _discard(path: Path) -> None:
    """Delete a directory by renaming it to `<stage>.deleting` first: a half-deleted tree never bears a live name."""
    if not path.exists():
        return
    trash = path.with_name(path.name.split(".")[0] + ".deleting")
    if trash.exists():
        shutil.rmtree(trash)
    path.rename(trash)
    shutil.rmtree(trash)


def recover(stage_dir: Path) -> None:
    """Resolve what a killed rerun left. A complete new stage (DONE) wins over `<stage>.prev`, which is deleted; an
    incomplete one gives way to the complete old outputs in `<stage>.prev`."""
    stage_dir = Path(stage_dir)
    trash = stage_dir.with_name(stage_dir.name + ".deleting")
    if trash.exists():
        shutil.rmtree(trash)
    prev = _prev(stage_dir)
    if not prev.exists():
        return
    if (stage_dir / "DONE").exists():
        print(f"[main] {stage_dir.name}: the rerun had finished; deleting the previous outputs {prev}", flush=True)
        _discard(prev)
    elif (prev / "DONE").exists():
        print(f"[main] {stage_dir.name}: a rerun was interrupted; restoring the previous outputs", flush=True)
        restore(stage_dir, prev)
    else:  # neither is complete (an older version's half-deleted .prev): the stage runs again
        _discard(prev)


def set_aside(stage_dir: Path) -> Path | None:
    """Move a finished stage's outputs to `<stage>.prev` before rerunning it."""
    if not (stage_dir / "DONE").exists():
        return None
    prev = _prev(stage_dir)
    _discard(prev)
    stage_dir.rename(prev)
    return prev


def restore(stage_dir: Path, prev: Path) -> None:
    """A failed rerun: its partial outputs go, the old complete ones in `prev` come back."""
    _discard(stage_dir)
    prev.rename(stage_dir)


def finish(prev: Path | None) -> None:
    """The rerun completed (its DONE is written): the old outputs go."""
    if prev is not None:
        _discard(prev)


# ------------------------------------------------------------------------------------------------ the plan
@dataclasses.dataclass
class Step:
    """What a run does with one stage of config.stages, decided before any stage runs.
    action: "run" | "skip" (done under these settings) | "keep" (not planned, left as is) | "forget" (not planned,
    its DONE dropped once a stage before it has rerun)."""
    name: str
    action: str
    fingerprint: str
    settings: dict
    why: str = ""


def _stale_note(name: str, before: str | None, keys: str | None, edited: list[str], older: bool) -> str | None:
    """Why a finished stage that this run leaves as is cannot feed the planned stages after it (None: it can)."""
    if keys is not None:
        return f"the earlier stage {name!r} was finished under other settings (changed: {keys or 'an earlier stage'})"
    if edited:
        return f"the input files of the earlier stage {name!r} changed since it finished: {', '.join(edited)}"
    return _generation_note(f"the earlier stage {name!r}", before) if older else None


def _generation_note(name: str, before: str) -> str:
    return (f"{name} was made from other outputs of {before!r} than the ones now in the workdir (an interrupted "
            "--force or rerun)")


def plan_steps(config, workdir: Path, planned: list[str], force: bool = False,
               rerun_changed: bool = False) -> list[Step]:
    """Decide every stage's action up front, so a refusal (changed settings or input files, inputs made under other
    settings) comes before anything runs or is written. Rules: a planned stage runs when it is not done, when
    --force, or after an earlier stage runs; a done one whose settings or input files (`input_paths`) changed is
    refused naming them unless rerun_changed; a done one made from an older generation of the stage before it (its
    DONE's `upstream_run` is not that stage's `run_id`: a forced run killed part way) runs again. A stage that is not
    planned but is stale in one of these ways refuses every planned stage after it."""
    steps, upstream, upstream_run, invalidated, stale = [], "", "", False, None
    before = None
    for name in config.stages:
        settings = stage_settings(config, name)
        fp = fingerprint(settings, upstream)
        upstream = fp
        try:
            done, unreadable = read_done(Path(workdir) / name / "DONE"), None
        except UnreadableDone as e:
            done, unreadable = None, str(e)
        older = (done is not None and upstream_run is not None and "upstream_run" in done
                 and done["upstream_run"] != upstream_run)
        changed = done is not None and done["fingerprint"] != fp
        keys = ", ".join(changed_keys(done.get("settings", {}), settings)) if changed else ""
        edited = [] if done is None or changed else changed_inputs(done.get("inputs"), config, name, workdir)
        if name not in planned:
            step = Step(name, "forget" if invalidated and done is not None else "keep", fp, settings)
            if step.action == "keep" and stale is None:
                stale = (f"the earlier stage {name!r} is not known to be finished ({unreadable})" if unreadable
                         else _stale_note(name, before, keys if changed else None, edited, older))
        else:
            if stale is not None:  # its inputs were made under other settings than the ones it would record
                raise StageError(f"{name}: {stale}; rerun from there (add it to --stages, or --rerun_changed "
                                 "without --stages)")
            step = Step(name, "run", fp, settings)
            if unreadable:
                step.why = f"{unreadable}: not finished, rerunning"
            elif done is None or force or invalidated:
                pass
            elif changed or edited:
                if not rerun_changed:
                    what = (f"finished under other settings (changed: {keys or 'an earlier stage'})" if changed
                            else f"input file changed since the stage finished: {', '.join(edited)}")
                    raise StageError(f"{name}: {what}; rerun with --rerun_changed (this stage and every later one) "
                                     "or --force")
                step.why = (f"settings changed ({keys or 'upstream'}), rerunning" if changed
                            else f"input files changed ({', '.join(edited)}), rerunning")
            elif older:
                step.why = _generation_note(name, before) + "; rerunning"
            else:
                step = Step(name, "skip", fp, settings)
        invalidated = invalidated or step.action == "run"
        upstream_run = None if invalidated or done is None else done.get("run_id")
        before = name
        steps.append(step)
    return steps


# --------------------------------------------------------------------------------------------- input files
# Keys (the last part of a dotted key) whose string value names a file or directory a stage reads: QA files,
# corpora, indexes, encoders, checkpoints, tokenizers. A value naming a stage ("stage:<s>", "<s>" or "<s>/...") is an
# earlier stage's output, covered by the fingerprint chain, and is not an input file.
PATH_KEYS = ("path", "corpus", "index_dir", "encoder", "query_encoder", "tokenizer", "base_model", "data", "records",
             "train_questions", "questions")
HASH_LIMIT = 256 << 20  # files up to this size are hashed (content); larger ones and directories by size and mtime


def _unused(section: dict, key: str) -> bool:
    """A path key its retriever section does not read (pipelines.common.load_retriever): the encoders without an
    `index_dir`, the `corpus` beside one."""
    if "index_dir" not in section:
        return False
    if key in ("encoder", "query_encoder"):
        return not section.get("index_dir")
    return key == "corpus" and bool(section.get("index_dir"))


def _walk(v, key: str = ""):
    """(dotted key with [i] for list items, leaf value, the dict holding it) over a config, lists included."""
    v = _plain(v)
    items = v.items() if isinstance(v, dict) else enumerate(v) if isinstance(v, list) else ()
    for k, x in items:
        sub = f"{key}[{k}]" if isinstance(v, list) else f"{key}.{k}" if key else str(k)
        if isinstance(x, (dict, list)):
            yield from _walk(x, sub)
        elif isinstance(v, dict):
            yield sub, x, v


def input_paths(config, name: str | None, workdir: Path) -> dict[str, Path]:
    """{config key: path} of the files a stage reads that no stage writes (name=None: the config's global keys; a
    section with an `fn` that is not a stage is not read). Paths resolve as pipelines.common.resolve does:
    absolute, or relative to the workdir."""
    stages = set(config.stages)
    if name is None:
        section = {k: v for k, v in _plain(config).items() if k not in stages and k != "stages"
                   and not (isinstance(v, dict) and "fn" in v)}
    else:
        section = config[name]
    out = {}
    for key, value, parent in _walk(section, name or ""):
        last = key.rsplit(".", 1)[-1]
        if last not in PATH_KEYS or not isinstance(value, str) or not value.strip() or _unused(parent, last):
            continue
        if value.startswith("stage:") or value in stages or value.split("/")[0] in stages:
            continue
        p = Path(value).expanduser()
        if not p.is_absolute() and "/" not in value and "." not in value:
            continue  # a plain word (a mode or a name), not a path
        out[key] = p if p.is_absolute() else Path(workdir) / p
    return out


def missing_inputs(config, names: list[str], workdir: Path) -> None:
    """Every input path of the given stages (and the global keys) exists, or one StageError lists all the missing
    ones with their keys, before any stage runs (not hours later, when the stage that reads one starts)."""
    missing = {}
    for name in [None, *names]:
        for key, p in input_paths(config, name, workdir).items():
            if not p.exists():
                missing[key] = p
    if missing:
        listed = "; ".join(f"config.{k} = {p}" for k, p in missing.items())
        raise StageError(f"{len(missing)} input path{'s' if len(missing) > 1 else ''} not found: {listed} (paths "
                         "are absolute or relative to the workdir; fix them with --config.<key>=... before any "
                         "stage runs)")


def _file_record(p: Path, old: dict | None = None) -> dict:
    """size, mtime and (for a file up to HASH_LIMIT) sha256 of a file; a directory: file count, total size and the
    newest mtime of its tree. The hash of an unchanged (size, mtime) is taken from `old` instead of recomputed."""
    if p.is_dir():
        n = size = 0
        mtime = p.stat().st_mtime
        for root, _, files in os.walk(p):
            for f in files:
                try:
                    st = os.stat(os.path.join(root, f))
                except OSError:
                    continue
                n, size, mtime = n + 1, size + st.st_size, max(mtime, st.st_mtime)
        return {"files": n, "size": size, "mtime": round(mtime, 3)}
    st = p.stat()
    rec = {"size": st.st_size, "mtime": round(st.st_mtime, 3)}
    if st.st_size <= HASH_LIMIT:
        if old and old.get("size") == rec["size"] and old.get("mtime") == rec["mtime"] and "sha256" in old:
            rec["sha256"] = old["sha256"]
        else:
            h = hashlib.sha256()
            with p.open("rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    h.update(block)
            rec["sha256"] = h.hexdigest()
    return rec


def input_records(config, name: str, workdir: Path, old: dict | None = None) -> dict:
    """{path: record} of a stage's existing input files (and the global keys'), what DONE keeps as `inputs`."""
    old = old or {}
    paths = {**input_paths(config, None, workdir), **input_paths(config, name, workdir)}
    return {str(p): _file_record(p, old.get(str(p))) for p in paths.values() if p.exists()}


def changed_inputs(recorded: dict | None, config, name: str, workdir: Path) -> list[str]:
    """The input files of a finished stage that changed since it finished (content when hashed, else size or
    mtime). A file only touched (same hash) is unchanged."""
    if not recorded:
        return []
    now = input_records(config, name, workdir, recorded)
    out = []
    for path, rec in recorded.items():
        cur = now.get(path)
        if cur is None:
            continue  # gone: the outputs made from it still stand (a changed path is a changed setting)
        if "sha256" in rec and "sha256" in cur:
            if rec["sha256"] != cur["sha256"]:
                out.append(f"{path} (content changed)")
        elif rec != cur:
            out.append(f"{path} (size or mtime changed)")
    return out
