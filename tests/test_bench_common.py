"""jaxrag.compilation and benchmarks.common: the compilation count a benchmark uses to prove its timed run compiled nothing, and the machine
record every result carries."""
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.common import cpu, write_result
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


def test_bench_rl_append_only_actions_are_their_own_ids():
    """benchmarks.rl --append-only: the scripted action is exactly new_tokens bytes, already canonical (the environment
    renders it back into the next prompt unchanged: format(parse(text)) == text), differs per turn, and the
    completion's ids are the text's own bytes, so the next prompt continues the turn's ids."""
    from types import SimpleNamespace

    from benchmarks import rl as B
    from jaxrag.env.agents.base import format_plain_line, parse_plain_line

    prompts = ["question: Who wrote Kiss and Tell, the 1945 film?\n",
               "question: Who wrote Kiss and Tell, the 1945 film?\nsearch: x\ndoc: t: d\n",
               "question: Who wrote Kiss and Tell, the 1945 film?\nsearch: x\ndoc: t: d\nsearch: y\ndoc: t: d\n"]
    for n in (16, 40):
        texts = [B._script(p, n) for p in prompts]
        assert all(len(t) == n for t in texts) and len(set(texts)) == 3
        assert [format_plain_line(parse_plain_line(t)) for t in texts] == texts
        assert texts[-1].startswith("answer: ")

    class Tok:
        def encode(self, t, add_bos=False):
            return [b + 3 for b in t.encode()]

    policy = B.ScriptedActions(SimpleNamespace(tokenizer=Tok()), append_only=True, new_tokens=16)
    sampled = SimpleNamespace(token_ids=[9] * 5, logprobs=[-0.5] * 5, finish_reason="stop", prompt_ids=[1, 2])
    c = policy.completion(prompts[0], sampled)
    assert c.token_ids == Tok().encode(c.text) and len(c.logprobs) == 16 and c.prompt_ids == [1, 2]
    plain = B.ScriptedActions(SimpleNamespace(tokenizer=Tok())).completion(prompts[0], sampled)
    assert plain.token_ids == [9] * 5   # the default keeps the sampled ids
