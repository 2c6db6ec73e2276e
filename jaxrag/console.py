"""What a person reads while a run goes: numbered stage headers with a time estimate, one short summary line per
stage (4 significant digits, not raw dicts), and `<workdir>/log.txt`, a copy of the console without progress-bar
redraws. Imports nothing from jaxrag, so any layer may use it.
"""

from __future__ import annotations

import io
import logging
import math
import re
import sys
import time
import warnings
from pathlib import Path


def num(x) -> str:
    """A number as a person reads it: ints as they are, floats to 4 significant digits (0.2903, 1.25e-05)."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return str(x)
    if isinstance(x, int):
        return str(x)
    if not math.isfinite(x):
        return str(x)
    return f"{x:.4g}"


def standard_error(p: float, n: int) -> float:
    """The standard error of a proportion p measured on n questions, sqrt(p (1 - p) / n): the spread of one
    seed's EM from question sampling alone."""
    return math.sqrt(p * (1 - p) / n) if n else float("nan")


def summary(items: dict, keys=None, sep: str = ", ") -> str:
    """`k v` pairs of `items` (only `keys`, in their order, when given), numbers through `num`; a nested dict
    shows as `k.sub v` one level deep, lists by their length. One line, for the stage's last log line."""
    parts = []
    for k in (keys if keys is not None else items):
        if k not in items:
            continue
        v = items[k]
        if isinstance(v, dict):
            parts += [f"{k}.{kk} {num(vv)}" for kk, vv in v.items() if not isinstance(vv, (dict, list, tuple))]
        elif isinstance(v, (list, tuple)):
            parts.append(f"{k} {len(v)}")
        else:
            parts.append(f"{k} {num(v)}")
    return sep.join(parts)


def minutes(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min"


class StageClock:
    """`[3/14] sft` headers: the stage's place in the run, the time since the run started and, where the config
    names `expected_seconds` per stage (a reference run's), this stage's and the rest's expected time, scaled by
    this machine's pace on the stages done so far (their actual over their expected seconds)."""

    def __init__(self, names: list[str], expected: dict | None = None, clock=None):
        expected = expected.to_dict() if hasattr(expected, "to_dict") else expected
        self.names, self.expected = list(names), dict(expected or {})
        self.clock = clock or time.perf_counter
        self.t0 = self.clock()
        self.actual: dict[str, float] = {}  # stages that ran -> seconds
        self.skipped: set[str] = set()  # finished in an earlier run

    def pace(self) -> float:
        done = [n for n in self.actual if self.expected.get(n)]
        ref = sum(self.expected[n] for n in done)
        return sum(self.actual[n] for n in done) / ref if ref > 0 else 1.0

    def header(self, name: str) -> str:
        i = self.names.index(name) + 1
        text = f"[{i}/{len(self.names)}] {name} · {minutes(self.clock() - self.t0)} so far"
        if self.expected.get(name):
            pace = self.pace()
            rest = sum(self.expected.get(n, 0) for n in self.names[i - 1:] if n not in self.skipped)
            text += f" · expect ~{minutes(self.expected[name] * pace)} for it, ~{minutes(rest * pace)} to the end"
        return text

    def done(self, name: str, seconds: float) -> None:
        self.actual[name] = seconds

    def skip(self, name: str) -> None:
        self.skipped.add(name)


class _CollapsedLog(io.TextIOBase):
    """A log file that keeps what a terminal finally shows: text after a carriage return replaces the line so far
    (tqdm redraws), so each bar leaves one line, its last state."""

    def __init__(self, f):
        self.f, self.line, self.cr = f, "", False

    def write(self, s: str) -> int:
        for piece in re.split(r"(\n|\r)", s):
            if piece == "\n":
                self.f.write(self.line + "\n")
                self.line, self.cr = "", False
            elif piece == "\r":
                self.cr = True  # the next text redraws the line from its start
            elif piece:
                self.line, self.cr = (piece if self.cr else self.line + piece), False
        self.f.flush()
        return len(s)

    def flush(self) -> None:
        self.f.flush()

    def close(self) -> None:
        if self.line:
            self.f.write(self.line + "\n")
            self.line = ""
        self.f.flush()


class _Tee(io.TextIOBase):
    def __init__(self, stream, log: _CollapsedLog):
        self.stream, self.log = stream, log

    def write(self, s: str) -> int:
        self.stream.write(s)
        if self.log is not None:
            try:
                self.log.write(s)
            except OSError:  # a full disk: the console goes on, the log stops (the run reports the disk itself)
                self.log = None
        return len(s)

    def flush(self) -> None:
        self.stream.flush()
        if self.log is not None:
            try:
                self.log.flush()
            except OSError:
                self.log = None

    def isatty(self) -> bool:
        return self.stream.isatty()

    def fileno(self) -> int:
        return self.stream.fileno()

    @property
    def encoding(self):
        return getattr(self.stream, "encoding", "utf-8")


class LogFile:
    """`with LogFile(workdir / "log.txt"):` copies stdout and stderr (this process's Python writes) into the file,
    appending, with tqdm's carriage-return redraws collapsed to each bar's last state. The log is best effort: a
    workdir that cannot be written (read-only, full disk) leaves the console as it is, so the run's own one-line
    report of that error (jaxrag/cli_errors.py) is what the user sees."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def __enter__(self):
        self.saved = sys.stdout, sys.stderr
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.file = open(self.path, "a", encoding="utf-8")
        except OSError:
            self.file = None
            return self
        self.logs = _CollapsedLog(self.file), _CollapsedLog(self.file)  # a line buffer per stream
        sys.stdout, sys.stderr = _Tee(sys.stdout, self.logs[0]), _Tee(sys.stderr, self.logs[1])
        return self

    def __exit__(self, *exc):
        sys.stdout, sys.stderr = self.saved
        if self.file is not None:
            try:
                for log in self.logs:
                    log.close()
                self.file.close()
            except OSError:
                pass
        return False


def quiet() -> None:
    """Silence library chatter a run's reader cannot act on: bm25s's per-index DEBUG/INFO lines ("Building index
    from tokens"), and setuptools' and JAX's deprecation warnings of third-party packages."""
    for name in ("bm25s", "jax._src.xla_bridge"):  # a filter: bm25s sets its logger to DEBUG when imported
        logger = logging.getLogger(name)
        if not any(isinstance(f, _AtLeastWarning) for f in logger.filters):
            logger.addFilter(_AtLeastWarning())
    warnings.filterwarnings("ignore", module="setuptools")
    warnings.filterwarnings("ignore", message=".*pkg_resources.*")


class _AtLeastWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING
