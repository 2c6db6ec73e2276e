"""Shared fixtures: tiny random Hugging Face checkpoints built and saved by transformers itself."""

import os
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# On a GPU, JAX would take 75% of its memory per process; the subprocess tests (resume-after-kill) start several.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
# Tests read nothing outside the checkout: the benchmark files' slices in data/benchmarks (the full files' names) stand
# in for the full files, so the configs' "shared" variant runs on them whatever a user's JAXRAG_BENCHMARKS says.
os.environ["JAXRAG_BENCHMARKS"] = str(Path(__file__).resolve().parents[1] / "data" / "benchmarks")


def _session_compilation_cache() -> str | None:
    """One persistent XLA compilation cache for the whole test session, set through the environment before JAX is
    imported: the xdist workers (started by this process after it imports this file) and every CLI run a test starts
    inherit it, so a program compiled once (the tiny pipeline's train steps and samplers, rerun by the kill, resume
    and multi-process tests) is read back instead of compiled again. A cache hit is the executable a compile makes,
    so no result changes. The tiny pipeline on this project's 2-core CPU: 90 s cold, 51 s with the cache warm.
    Unset where the user chose a cache (JAX_COMPILATION_CACHE_DIR) or JAXRAG_TEST_XLA_CACHE=0. Returns the folder
    this process made (removed at the session's end) or None."""
    if "JAX_COMPILATION_CACHE_DIR" in os.environ or os.environ.get("JAXRAG_TEST_XLA_CACHE") == "0":
        return None
    import tempfile

    path = tempfile.mkdtemp(prefix="jaxrag-test-xla-cache-")
    os.environ.update(JAX_COMPILATION_CACHE_DIR=path, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
                      JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
    return path


_MY_CACHE = _session_compilation_cache()

from jaxrag import cpu_numerics  # noqa: E402

cpu_numerics.pin()  # XLA:CPU's portable math before any test computes, as jaxrag.main does (jaxrag/cpu_numerics.py)

import pytest
from hypothesis import settings

# Property tests draw the same examples on every run (CI must not turn red on a draw it never saw before); a new
# failure found by exploring locally (HYPOTHESIS_PROFILE=explore) becomes an explicit case in its test.
settings.register_profile("ci", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


# `make test` runs the suite on 2 workers (pytest-xdist, --dist loadfile). A scope runs whole on one worker: a test
# file (its module fixtures are built once), except that every file using the session's synthetic pipeline run
# (synthetic_run, minutes) is one scope, so that run is made once. Scopes start longest first (the files' measured
# share of the suite), so no long file starts last and leaves the other worker idle.
LONGEST_FIRST = ("synthetic_run", "test_continuous.py", "test_kv_sessions.py", "test_multihost_synthetic.py",
                 "test_multihost.py", "test_cpu_numerics.py", "test_paper_training_rows.py", "test_paper_configs.py",
                 "test_train.py", "test_generate.py", "test_prefix_tree.py", "test_fsdp_collectives.py",
                 "test_interrupts.py", "test_ablations.py")
HERE = Path(__file__).resolve().parent
SHARES_THE_RUN = frozenset(p.name for p in HERE.rglob("test_*.py") if "synthetic_run" in p.read_text())


def _scope(path: str) -> str:
    name = Path(path.split("::", 1)[0]).name
    return "synthetic_run" if name in SHARES_THE_RUN else name


def pytest_collection_modifyitems(config, items):
    rank = {g: i for i, g in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda it: rank.get(_scope(it.nodeid), len(rank)))   # stable: each scope keeps its own order


def pytest_unconfigure(config):
    if _MY_CACHE is not None:
        import shutil

        shutil.rmtree(_MY_CACHE, ignore_errors=True)


@pytest.hookimpl(optionalhook=True)   # an xdist hook: pytest without xdist ignores it
def pytest_xdist_make_scheduler(config, log):
    """--dist loadfile with the files sharing the synthetic run as one scope (xdist's loadgroup marks do not reach
    the scheduler under pytest 9: it reads them from a node id pytest no longer takes from `_nodeid`)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class Scopes(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _scope(nodeid)

    return Scopes(config, log)


def _mapped_regions() -> int:
    try:
        with open("/proc/self/maps") as f:
            return sum(1 for _ in f)
    except OSError:   # not Linux: no per-process limit on memory maps to stay under
        return 0


@pytest.fixture(autouse=True)
def _release_compiled_programs():
    """Drop JAX's compiled programs once the process holds 20,000 memory maps. XLA:CPU maps every compiled program
    into regions of its own (about three; more for a larger program) and the suite compiles thousands of programs;
    in one process that passed Linux's vm.max_map_count (65,530) near the end of the suite, and the next mmap
    aborted the process deep inside XLA or tensorstore (seen in CI at test_train.py). Fixtures recompile on their
    next use."""
    yield
    if _mapped_regions() > 20_000:
        import gc

        import jax

        jax.clear_caches()
        gc.collect()


def _tiny_hf(kind: str, path):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed({"llama3": 0, "llama_tied": 1, "qwen2": 2}[kind])
    common = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                  bos_token_id=1, eos_token_id=2, pad_token_id=0)
    if kind == "llama3":
        cfg = LlamaConfig(**common, rope_theta=500000.0, rope_scaling={
            "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64})
        model = LlamaForCausalLM(cfg)
    elif kind == "llama_tied":
        cfg = LlamaConfig(**{**common, "num_key_value_heads": 4}, tie_word_embeddings=True)
        model = LlamaForCausalLM(cfg)
    else:
        cfg = Qwen2Config(**common, rope_theta=1000000.0, tie_word_embeddings=False)
        model = Qwen2ForCausalLM(cfg)
        with torch.no_grad():  # random (non-zero) q/k/v biases so the test sees them
            for layer in model.model.layers:
                for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                    proj.bias.normal_(0, 0.5)
    model = model.eval()
    model.save_pretrained(path)
    return model


@pytest.fixture(scope="session", params=["llama3", "llama_tied", "qwen2"])
def hf_checkpoint(request, tmp_path_factory):
    """(kind, torch model, checkpoint dir) for each architecture variant."""
    path = tmp_path_factory.mktemp(request.param)
    model = _tiny_hf(request.param, path)
    return request.param, model, path


@pytest.fixture(scope="session")
def llama3_checkpoint(tmp_path_factory):
    """The Llama-3.1-style tiny checkpoint alone (error-case tests need just one)."""
    path = tmp_path_factory.mktemp("llama3_only")
    return _tiny_hf("llama3", path), path


@pytest.fixture(scope="session")
def synthetic_run(tmp_path_factory):
    """The synthetic pipeline's tiny preset, run ONCE per test session: (config, workdir, stages that ran).
    Every test that reads a pipeline output uses this run instead of running its own."""
    import importlib.util
    from pathlib import Path

    from jaxrag import main as jmain

    # the findings config: every stage of the main job (configs/synthetic/pipeline.py) and the studies after them
    path = Path(__file__).resolve().parents[1] / "configs" / "synthetic" / "findings.py"
    spec = importlib.util.spec_from_file_location("synthetic_pipeline", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    config = mod.get_config("tiny")
    workdir = tmp_path_factory.mktemp("synthetic")
    ran = jmain.run(config, workdir)
    return config, str(workdir), ran
