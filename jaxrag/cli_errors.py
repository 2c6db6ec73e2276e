"""How `python -m jaxrag.main` ends on an error a user can cause or meet: exit status 2 and ONE line, last in the
output, naming the file:line, key, path or stage and the way out. A bug (any other exception) keeps its traceback.
`--debug` (or JAXRAG_DEBUG=1) shows the traceback of every error.

User errors: the config (an unknown --config key, a value of the wrong type or out of range, a missing path), the
workdir (in use, refused settings, unwritable or read-only, a full disk), the data (QA and corpus lines), a corrupt
checkpoint, a diverging loss. Used by jaxrag.main only (this module sits at its layer).
"""

from __future__ import annotations

import errno
import logging
import os
import re
import sys

from absl import flags

from jaxrag.data.qa import QADataError
from jaxrag.retrieval.corpus import CorpusError
from jaxrag.stage_fn import StageError
from jaxrag.train.checkpoint import CheckpointCorrupt
from jaxrag.train.learner import ConfigChanged, NonFiniteLoss
from jaxrag.train.preemption import Preempted
from jaxrag.workdir import WorkdirError

DISK_FULL = (errno.ENOSPC, errno.EDQUOT)
UNWRITABLE = (errno.EROFS, errno.EACCES, errno.EPERM)
_TEXT = {"No space left on device": errno.ENOSPC, "Disk quota exceeded": errno.EDQUOT,
         "Read-only file system": errno.EROFS, "Permission denied": errno.EACCES}


def debug() -> bool:
    """--debug on the command line (also before flags are parsed) or JAXRAG_DEBUG set to a non-empty, non-0 value."""
    return "--debug" in sys.argv[1:] or os.environ.get("JAXRAG_DEBUG", "") not in ("", "0")


def fail(line: str, status: int = 2) -> None:
    """Print the one line last (stdout flushed first) and end the process with `status`. os._exit: orbax's
    background savers would otherwise print pages of "Event loop is closed" tracebacks at interpreter shutdown,
    after the line. Everything a run writes is atomic, so nothing half-written is left to flush."""
    sys.stdout.flush()
    print(f"error: {line}", file=sys.stderr, flush=True)
    os._exit(status)


def _resumes(e: BaseException) -> str:
    """What a stopped run left, for its one line (jaxrag.main.run marks a rerun whose old outputs it put back)."""
    if getattr(e, "restored", False):
        return "its old outputs are back as they were; the same command starts its rerun again"
    return "finished stages are kept; the same command resumes (a training stage from its last checkpoint)"


def interrupted(e: BaseException) -> None:
    """Ctrl-C: one line naming the stage it stopped, exit 130 (--debug: the traceback)."""
    if debug():
        raise e
    stage = getattr(e, "stage", None)
    fail(f"interrupted{f' in stage {stage!r}' if stage else ''}: {_resumes(e)}", 130)


def _chain(e: BaseException):
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e
        e = e.__cause__ or e.__context__


def _os_error(e: BaseException) -> tuple[int, str] | None:
    """(errno, the path or message) of a full disk or an unwritable path anywhere in the exception's chain; orbax and
    tensorstore wrap the OSError in their own types, so their text is read too."""
    for x in _chain(e):
        if isinstance(x, OSError) and x.errno in DISK_FULL + UNWRITABLE:
            return x.errno, str(x.filename or x.strerror or x)
    for x in _chain(e):
        for text, code in _TEXT.items():
            if text in str(x):
                path = re.search(r'"(/[^"]+)"', str(x))  # tensorstore: ... at local file "/path/..."
                return code, path.group(1) if path else str(x).splitlines()[0][:200]
    return None


class QuietDiskErrors(logging.Filter):
    """Drops the log records of a full disk or an unwritable path (orbax's background savers log each failed write
    with its traceback, dozens of lines): the run ends with the one line that says it (`report`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage() + (str(record.exc_info[1]) if record.exc_info and record.exc_info[1] else "")
        return not any(t in text for t in _TEXT)


def _closed_loop_callback(value: BaseException, tb) -> bool:
    """True for the RuntimeError that asyncio raises when a background thread (tensorstore finishing one of orbax's
    writes after the save already failed) calls `call_soon_threadsafe` on the event loop orbax has closed."""
    if not (isinstance(value, RuntimeError) and str(value) == "Event loop is closed"):
        return False
    names = []
    while tb is not None:
        names.append(tb.tb_frame.f_code.co_name)
        tb = tb.tb_next
    return "call_soon_threadsafe" in names


def quiet_disk_errors() -> None:
    """Unless --debug: install QuietDiskErrors on every handler of the root logger (absl's among them), and drop the
    "Event loop is closed" tracebacks that tensorstore reports (as unraisable: sys.unraisablehook) for each write
    still in flight when a failed save has closed orbax's loop; any other exception is printed as before."""
    if debug():
        return
    for handler in logging.getLogger().handlers:
        handler.addFilter(QuietDiskErrors())
    previous = sys.unraisablehook

    def hook(args):
        if not _closed_loop_callback(args.exc_value, args.exc_traceback):
            previous(args)

    sys.unraisablehook = hook


def user_error(e: BaseException, workdir: str | None = None) -> str | None:
    """The one line that reports `e` to the user, or None when it is a bug (its traceback is worth showing)."""
    stage = getattr(e, "stage", None)
    where = f"stage {stage!r} (config.{stage}): " if stage else ""
    found = _os_error(e)
    if found is not None:
        code, what = found
        if code in DISK_FULL:
            return (f"{where}no space left on the device (writing {what}); free some space (or use another "
                    "--workdir) and rerun the same command: finished stages are kept and the interrupted one starts "
                    "again")
        return (f"{where}cannot write {what} ({os.strerror(code)}); make {workdir or 'the workdir'} writable, or "
                "run with a --workdir you can write to")
    if isinstance(e, Preempted):
        if getattr(e, "restored", False) or e.saved is None:   # no checkpoint of this stop's to resume from
            return f"{where}stopped by SIGTERM: {_resumes(e)}"
        return f"{where}{e}"
    if isinstance(e, (StageError, WorkdirError, CheckpointCorrupt, ConfigChanged, NonFiniteLoss, QADataError,
                      CorpusError)):
        return f"{where}{e}"
    return None


def report(e: BaseException, workdir: str | None = None) -> None:
    """End the run with the one line of a user error; anything else (or --debug) goes on as a traceback. A stop on
    SIGTERM (jaxrag.train.preemption) exits with 143, the status of a process ended by it."""
    line = user_error(e, workdir)
    if line is None or debug():
        raise e
    fail(line, 143 if isinstance(e, Preempted) else 2)


def _unknown_key(e: BaseException, argv: list[str]) -> str | None:
    """ml_collections' "'lrr'\\nDid you mean "lr" instead of "lrr"?" for an override naming no key: the one line."""
    text = str(e)
    for _ in range(3):  # the message is a repr inside a repr: unescape it
        text = text.replace("\\\\", "\\").replace("\\'", "'").replace("\\n", "\n")
    m = re.search(r"'([\w-]+)'", text)
    if m is None:
        return None
    key = m.group(1)
    hint = re.search(r'Did you mean "([^"]+)"', text)
    flag = next((a.split("=", 1)[0] for a in argv if a.startswith("--config.")
                 and a.split("=", 1)[0].rsplit(".", 1)[-1] == key), f"--config...{key}")
    return (f"{flag}: the config has no key {key!r}" + (f"; did you mean {hint.group(1)!r}?" if hint else "")
            + " (the config file lists every key)")


def parse_flags(argv: list[str]):
    """absl's flag parsing with one-line errors (a --config override naming no key, a value of the wrong type, a
    config file that fails to load): what app.run passes to main."""
    try:
        return flags.FLAGS(argv)
    except Exception as e:
        if debug():
            raise
        line = _unknown_key(e, argv) if isinstance(e, (AttributeError, KeyError)) else None
        text = str(e).strip('"').splitlines()[0] if str(e) else repr(e)
        if isinstance(e, flags.Error) and "Traceback (most recent call last)" in str(e):
            # a config file whose get_config raised: absl puts the traceback in the text; its last line is the error
            name, _, why = [t for t in str(e).strip('"').splitlines() if t.strip()][-1].partition(": ")
            text = f"{text.removesuffix('Error whilst parsing config file:').rstrip()} {name.rsplit('.', 1)[-1]}: {why}"
        fail(line or (text if isinstance(e, flags.Error) else f"{type(e).__name__}: {text}"))
