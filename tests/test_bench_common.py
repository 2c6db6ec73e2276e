"""jaxrag.compilation and bench.common: the compilation count a benchmark uses to prove its timed run compiled nothing, and the machine
record every result carries."""
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from jaxrag.bench.common import cpu, write_result
from jaxrag.compilation import compilation


def test_compilation_counts_new_programs_not_cached_calls():
    f = jax.jit(lambda x: jnp.sin(x) * 3.0 + 1.0)
    a, b, c = (jax.device_put(np.full(n, v, np.float32)) for n, v in ((7, 1.0), (7, 0.0), (9, 1.0)))
    n0, s0 = compilation()
    f(a).block_until_ready()          # a new program: compiled once
    n1, s1 = compilation()
    f(b).block_until_ready()          # same shapes: the cached executable
    n2, _ = compilation()
    f(c).block_until_ready()          # a new shape: compiled again
    n3, _ = compilation()
    assert (n1 - n0, n2 - n1, n3 - n2) == (1, 0, 1)
    assert s1 > s0


def test_every_result_names_the_cpu_and_its_vector_extensions(tmp_path):
    info = cpu()
    assert info["model"] and all(f.startswith(("avx", "amx", "fma")) for f in info["vector"])
    info_file = Path("/proc/cpuinfo")
    flags = info_file.read_text().split() if info_file.exists() else []
    assert ("avx2" in info["vector"]) == ("avx2" in flags)
    path = write_result("probe", {"rows": []}, tmp_path)
    assert json.loads(path.read_text())["machine"]["cpu"] == info
