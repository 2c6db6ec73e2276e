"""Where the shared real data lives: `$JAXRAG_BENCHMARKS`, else ../shared/benchmarks beside the repository."""

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BENCHMARKS = Path(os.environ.get("JAXRAG_BENCHMARKS", REPO.parent / "shared" / "benchmarks"))

