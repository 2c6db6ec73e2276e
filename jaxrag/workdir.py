"""A workdir you can trust: one run at a time, settings recorded per stage, outputs visible only when complete.

- Lock: `workdir/.lock` holds the running job's PID and host. A second run meets a clear error naming them; a lock
  whose process is gone (same host) is stale and taken over.
- Settings: the effective config is saved as `workdir/config.json` (with the package version and git commit).
  Each finished stage records in `workdir/<stage>/DONE` the fingerprint of what it depends on: its own section, the
  config's global keys (seed, model, index, ...) and the fingerprint of the stage before it (so a change upstream
  reaches every stage downstream). A rerun whose settings changed for a finished stage is refused with the changed
  keys named, unless asked to rerun (`--force`, or `--rerun_changed` for exactly the stages whose settings changed
  and everything after them). Settings that cannot change a stage's outputs (settings.NEUTRAL: progress bars, log and
  checkpoint cadence, which checkpoint to resume from) are left out, so e.g. `restore_step` never blocks a rerun.
- Atomic reruns: before a finished stage is rerun its old outputs are moved to `<stage>.prev`; they are deleted when
  the new run completes and put back if it fails (or, after a kill, at the next start), so a failed rerun never
  leaves old markers over new files nor loses the old good outputs.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess
from pathlib import Path

from jaxrag.settings import as_before, is_neutral


class WorkdirError(RuntimeError):
    pass


# ------------------------------------------------------------------------------------------------------ lock
class Lock:
    def __init__(self, workdir: Path):
        self.path = Path(workdir) / ".lock"
        self.held = False

    def __enter__(self):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        me = {"pid": os.getpid(), "host": socket.gethostname()}
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                holder = self._holder()
                if holder is not None and not self._stale(holder):
                    raise WorkdirError(f"{self.path.parent} is in use by another run (pid {holder['pid']} on "
                                       f"{holder['host']}); wait for it, or remove {self.path} if it is gone") from None
                print(f"[main] taking over a stale lock {self.path} ({holder})", flush=True)
                self.path.unlink(missing_ok=True)
                continue
            with os.fdopen(fd, "w") as f:
                json.dump(me, f)
            self.held = True
            return self
        raise WorkdirError(f"{self.path}: could not take the lock")

    def _holder(self) -> dict | None:
        try:
            return json.loads(self.path.read_text())
        except (OSError, json.JSONDecodeError):
            return None  # unreadable: a run killed while writing it

    @staticmethod
    def _stale(holder: dict) -> bool:
        if holder.get("host") != socket.gethostname():
            return False  # another machine's process: cannot tell, assume alive
        try:
            os.kill(int(holder["pid"]), 0)
        except ProcessLookupError:
            return True
        except (PermissionError, ValueError, KeyError):
            return False
        return False

    def __exit__(self, *exc):
        if self.held:
            self.path.unlink(missing_ok=True)


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


def read_done(path: Path) -> dict | None:
    """The DONE record ({"fingerprint", "settings", "upstream"}), {} for a legacy marker, None if absent."""
    if not path.exists():
        return None
    try:
        rec = json.loads(path.read_text())
        return rec if isinstance(rec, dict) else {}
    except json.JSONDecodeError:
        return {}


def write_done(path: Path, record: dict) -> None:
    tmp = path.with_name("DONE.tmp")
    tmp.write_text(json.dumps(record, indent=1, sort_keys=True))
    tmp.replace(path)


def save_effective_config(workdir: Path, config) -> None:
    """workdir/config.json: the config as run, with the package version and git commit (when there is one)."""
    from importlib.metadata import PackageNotFoundError, version

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
def recover(stage_dir: Path) -> None:
    """A `<stage>.prev` left by a killed rerun: its old, complete outputs go back in place."""
    prev = stage_dir.with_name(stage_dir.name + ".prev")
    if prev.exists():
        print(f"[main] {stage_dir.name}: a rerun was interrupted; restoring the previous outputs", flush=True)
        shutil.rmtree(stage_dir, ignore_errors=True)
        prev.rename(stage_dir)


def set_aside(stage_dir: Path) -> Path | None:
    """Move a finished stage's outputs to `<stage>.prev` before rerunning it."""
    if not (stage_dir / "DONE").exists():
        return None
    prev = stage_dir.with_name(stage_dir.name + ".prev")
    shutil.rmtree(prev, ignore_errors=True)
    stage_dir.rename(prev)
    return prev
