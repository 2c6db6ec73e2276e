"""Where the real benchmark data lives.

SAMPLE is the repository's own `data/benchmarks/`: slices of the benchmark files under the full files' names
(100 or 50 questions each and the corpus passages they need; NOTICE.md there), which the tests and the configs' smoke
variants read. BENCHMARKS is a folder of the full files, optional: `$JAXRAG_BENCHMARKS`, else `data/benchmarks_full/`
(git-ignored; put or link the files there); the configs' "shared" variant reads it and stops at once when it is missing.
"""

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "data" / "benchmarks"
BENCHMARKS = Path(os.environ.get("JAXRAG_BENCHMARKS", REPO / "data" / "benchmarks_full"))


class MissingBenchmarks(ValueError):
    """The full benchmark files are not where JAXRAG_BENCHMARKS says."""


def require_benchmarks(what: str) -> Path:
    """BENCHMARKS, or one line naming `what` needs it, the variable and the way out."""
    if not BENCHMARKS.is_dir():
        raise MissingBenchmarks(
            f"{what} reads the full benchmark files: JAXRAG_BENCHMARKS={BENCHMARKS}: no such directory (set "
            f"JAXRAG_BENCHMARKS to a folder holding them; {SAMPLE.relative_to(REPO)}/NOTICE.md says where each comes "
            f"from; the 'smoke' variant runs on the slices in {SAMPLE.relative_to(REPO)})")
    return BENCHMARKS


def bench_data() -> Path:
    """What the benchmark modules read: the full files when BENCHMARKS exists, else the repository's slices."""
    return BENCHMARKS if BENCHMARKS.is_dir() else SAMPLE
