"""jaxrag.main: stages run in order with DONE markers; bad configs fail before any compute."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import ml_collections
import pytest

from jaxrag.main import StageError, plan, run

ROOT = Path(__file__).resolve().parents[1]


def cli(*args, cwd=ROOT, own_cache=False):
    """`python -m jaxrag.main *args`; own_cache: without the suite's compilation cache (tests/conftest.py), so the CLI
    keeps its own in the workdir."""
    env = {k: v for k, v in os.environ.items() if not (own_cache and k == "JAX_COMPILATION_CACHE_DIR")}
    env.update(JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "jaxrag.main", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


def test_plan_errors_name_the_key():
    c = ml_collections.ConfigDict({"stages": ["a"]})
    with pytest.raises(StageError, match="no 'a' section"):
        plan(c)
    c.a = ml_collections.ConfigDict({"fn": "jaxrag.nope:f"})
    with pytest.raises(StageError, match=r"config.a.fn: cannot import module 'jaxrag.nope'"):
        plan(c)
    c.a.fn = "jaxrag.pipelines.train:no_such"
    with pytest.raises(StageError, match="has no function 'no_such'"):
        plan(c)


def test_stage_config_checked_before_any_stage_runs(tmp_path):
    import configs.train_sft as mod

    c = mod.get_config()
    with c.sft.train.unlocked():
        c.sft.train.loss = "dpoo"
    with pytest.raises(ValueError, match="loss"):
        run(c, tmp_path)
    assert not (tmp_path / "data").exists()  # the data stage before it did not run


def test_unknown_override_and_wrong_type_fail_fast(tmp_path):
    p = cli("--config=configs/train_sft.py", f"--workdir={tmp_path}", "--config.sft.train.optimizer.lrr=1")
    assert p.returncode != 0 and "lrr" in p.stderr
    p = cli("--config=configs/train_sft.py", f"--workdir={tmp_path}", "--config.sft.train.steps=abc")
    assert p.returncode != 0 and "steps" in p.stderr
    assert not any(tmp_path.iterdir())


def test_runs_stages_writes_done_and_skips_on_rerun(tmp_path):
    args = ("--config=configs/train_sft.py", f"--workdir={tmp_path}", "--config.sft.train.steps=2",
            "--config.sft.train.progress=False")
    p = cli(*args, own_cache=True)
    assert p.returncode == 0, p.stderr[-3000:]
    for stage in ("data", "sft"):
        done = json.loads((tmp_path / stage / "DONE").read_text())
        assert done["seconds"] >= done["compile_seconds"] >= 0
    assert done["compile_seconds"] > 0  # the sft stage jit-compiles its train step
    summary = re.search(r"wall time per stage \([\d.]+ min in all\): (.*)", p.stdout)
    assert summary and sorted(summary.group(1).split(", ")) == sorted(
        f"{s} {json.loads((tmp_path / s / 'DONE').read_text())['seconds']:.0f} s" for s in ("data", "sft"))
    assert (tmp_path / "sft" / "model" / "config.json").exists()
    assert len((tmp_path / "sft" / "metrics.jsonl").read_text().splitlines()) == 2
    p = cli(*args, own_cache=True)
    assert p.returncode == 0 and p.stdout.count("skipping") == 2
    # the CLI keeps XLA's compilation cache in the workdir; a forced rerun compiled from it trains the same numbers
    assert any((tmp_path / ".xla_cache").iterdir())
    losses = [json.loads(r)["loss"] for r in (tmp_path / "sft" / "metrics.jsonl").read_text().splitlines()]
    p = cli(*args, "--force", own_cache=True)
    assert p.returncode == 0, p.stderr[-3000:]
    assert [json.loads(r)["loss"] for r in (tmp_path / "sft" / "metrics.jsonl").read_text().splitlines()] == losses


def test_preset_applies_before_overrides_and_the_effective_config_is_shown(tmp_path):
    import configs.synthetic.pipeline as mod

    assert mod.get_config("tiny").sft.train.steps != 7
    p = cli("--config=configs/synthetic/pipeline.py:tiny", f"--workdir={tmp_path}", "--config.sft.train.steps=7",
            "--stages=world")
    assert p.returncode == 0, p.stderr[-3000:]
    assert json.loads((tmp_path / "config.json").read_text())["config"]["sft"]["train"]["steps"] == 7
    assert p.stdout.count("--config.sft.train.steps=7") == 1 and str(tmp_path / "config.json") in p.stdout


def test_run_time_errors_are_one_line_naming_the_stage_and_the_way_out(tmp_path):
    args = ("--config=configs/train_sft.py", f"--workdir={tmp_path}", "--config.sft.train.steps=4",
            "--config.sft.train.checkpoint.every_steps=2", "--config.sft.train.checkpoint.async_save=False")
    assert cli(*args).returncode == 0
    (tmp_path / "sft" / "DONE").unlink()  # as if killed after its last checkpoint
    for f in (tmp_path / "sft" / "checkpoints" / "4").rglob("*"):
        if f.is_file() and "state" in f.parts:
            f.write_bytes(b"garbage")
    p = cli(*args)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("error: stage 'sft' (config.sft): checkpoint") and "restore_step=2" in last
    # a changed setting under a half-trained stage: ConfigChanged, one line, the key named
    p = cli(*args, "--config.sft.train.optimizer.lr=0.05")
    assert p.returncode == 2 and "Traceback" not in p.stderr and "optimizer.lr differ" in p.stderr.splitlines()[-1]
    # the way out the message names; the option then does not block a plain rerun
    assert cli(*args, "--config.sft.train.checkpoint.restore_step=2").returncode == 0
    assert (tmp_path / "sft" / "checkpoints" / "4.set_aside").is_dir()
    p = cli(*args)
    assert p.returncode == 0 and "sft: done already" in p.stdout


def test_cli_stage_resolving_a_fn_reference(tmp_path):
    """A stage that resolves a "module:function" reference (a judge of kind fn) under `python -m jaxrag.main`:
    the resolver lives outside the CLI module, which runs as __main__ (importing jaxrag.main again used to define
    its flags twice: DuplicateFlagError)."""
    (tmp_path / "fn_stage.py").write_text(
        "def judge(jc, workdir):\n    return 'judge ' + jc['fn']\n\n\n"
        "def stage(config, workdir, name):\n"
        "    from jaxrag.pipelines.collect import make_judge\n\n"
        "    j = make_judge({'kind': 'fn', 'fn': 'fn_stage:judge'}, workdir, None)\n"
        "    open(f'{workdir}/{name}/out.txt', 'w').write(j)\n")
    (tmp_path / "cfg.py").write_text(
        "import ml_collections\n\n\ndef get_config():\n"
        "    return ml_collections.ConfigDict({'stages': ['j'], 'j': {'fn': 'fn_stage:stage'}})\n")
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": f"{ROOT}{os.pathsep}{tmp_path}"}
    r = subprocess.run([sys.executable, "-m", "jaxrag.main", f"--config={tmp_path / 'cfg.py'}",
                        f"--workdir={tmp_path / 'wd'}"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert (tmp_path / "wd" / "j" / "out.txt").read_text() == "judge fn_stage:judge"


def _paper_config(name: str, variant: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"cfg_{name.replace('/', '_')}", ROOT / "configs" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.get_config(variant)


def test_a_paper_configs_missing_paths_are_all_named_before_the_first_stage(tmp_path):
    """Issue 45: a missing eval_medqa policy used to surface only after the whole eval stage had run."""
    c = _paper_config("rag_gym/table2", "shared")
    c.eval.policy.path = str(tmp_path / "no_policy")
    c.eval_medqa.policy.path = "models/none"
    c.eval_medqa.retriever.index_dir = "indexes/medcorp"
    with pytest.raises(StageError, match="input paths not found") as e:
        run(c, tmp_path / "wd")
    for key in ("config.eval.policy.path", "config.eval_medqa.policy.path", "config.eval_medqa.retriever.index_dir",
                "config.eval_medqa.retriever.encoder", "config.eval_medqa.retriever.query_encoder"):
        assert key in str(e.value)
    assert "retriever.corpus" not in str(e.value)  # beside an index_dir the corpus is not read
    assert not (tmp_path / "wd" / "eval").exists()


PAPER_CONFIGS = ["arena/fig3", "arena/grpo", "arena/table2", "rag_gym/dpo", "rag_gym/fig4",
                                  "rag_gym/ppo", "rag_gym/sft", "rag_gym/table2", "rag_gym/table3", "rag_gym/table4",
                                  "reasonrag/table2", "reasonrag/table3", "smartsearch/grpo", "smartsearch/table1",
                                  "smartsearch/table3"]


@pytest.mark.parametrize("name", PAPER_CONFIGS)
def test_every_smoke_variant_finds_all_its_input_paths(tmp_path, name):
    """The up-front path check reads only what the stages read (no false alarm on a section's unused keys)."""
    from jaxrag.workdir import input_paths, missing_inputs

    c = _paper_config(name, "smoke")
    missing_inputs(c, list(c.stages), tmp_path)
    assert any(input_paths(c, s, tmp_path) for s in c.stages)  # it did look at some


def test_smoke_variants_read_only_the_repository_and_shared_stops_in_one_line(tmp_path):
    """With JAXRAG_BENCHMARKS at a missing folder (a clone with nothing beside it), every paper config's smoke variant
    names only files inside the repository, all present; the "shared" variant (the full files) stops on load, and
    the CLI says so in one line naming the variable."""
    script = f"""
import importlib.util, json, sys
from pathlib import Path
ROOT = Path({str(ROOT)!r})
sys.path.insert(0, str(ROOT))
from jaxrag.paths import MissingBenchmarks
def load(name, variant):
    spec = importlib.util.spec_from_file_location("c" + name.replace("/", "_"), ROOT / "configs" / f"{{name}}.py")
    mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
    return mod.get_config(variant)
def strings(x):
    if isinstance(x, dict):
        for v in x.values(): yield from strings(v)
    elif isinstance(x, (list, tuple)):
        for v in x: yield from strings(v)
    elif isinstance(x, str):
        yield x
out = {{}}
for name in {PAPER_CONFIGS!r}:
    c = load(name, "smoke").to_dict()
    out[name] = sorted({{p for p in strings(c) if p.startswith("/")}})
    try:
        load(name, "shared")
        out[name + ":shared"] = "loaded"
    except MissingBenchmarks as e:
        out[name + ":shared"] = str(e)
    except ValueError as e:   # a config without a shared variant
        out[name + ":shared"] = "no variant" if "unknown variant" in str(e) else repr(e)
print(json.dumps(out))
"""
    env = {**os.environ, "JAXRAG_BENCHMARKS": str(tmp_path / "missing")}
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.splitlines()[-1])
    for name in PAPER_CONFIGS:
        assert out[name], name   # the smoke reads real files (the repository's slices)
        for p in out[name]:
            assert Path(p).is_relative_to(ROOT / "data" / "benchmarks") and Path(p).is_file(), (name, p)
        shared = out[name + ":shared"]
        assert shared == "no variant" or re.match(rf"configs/\w+/\w+\.py:shared reads the full benchmark files: "
                                                  rf"JAXRAG_BENCHMARKS={tmp_path / 'missing'}: no such", shared), shared
    assert sum(out[n + ":shared"] != "no variant" for n in PAPER_CONFIGS) >= 10
    r = subprocess.run([sys.executable, "-m", "jaxrag.main", "--config=configs/rag_gym/table2.py:shared",
                        f"--workdir={tmp_path / 'wd'}"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and f"JAXRAG_BENCHMARKS={tmp_path / 'missing'}" in lines[0], r.stderr
    assert not (tmp_path / "wd").exists()
