"""Multi-host runs end to end through `python -m jaxrag.main`: 2 CPU processes x 2 fake devices each (launch/local.py),
every training stage kind (SFT, DPO with LoRA, critic, file-based GRPO) on an FSDP x tensor mesh, online GRPO and the
eval stage. Each run finishes, writes one copy of every output, its checkpoints load back equal to a one-process run
on the same 4-device mesh, and a run killed mid-stage resumes to the same model (docs/multihost.md)."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]

TRAIN_CONFIG = textwrap.dedent('''
    import ml_collections
    from configs.common.train import tiny_model, toy_data, train_stage


    def get_config(steps="4"):
        c = ml_collections.ConfigDict()
        c.stages = ["data", "sft", "dpo", "critic", "grpo"]
        c.model = tiny_model()
        c.data = toy_data(n=32, group_size=2)
        fn, mesh = "jaxrag.pipelines.train:train_stage", (1, 2, 2)  # FSDP 2 x tensor 2 over the 4 devices
        common = dict(seq_buckets=(32,), mesh=mesh, progress=False)
        c.sft = train_stage(fn, "data/sft.jsonl", loss="sft", steps=int(steps), batch_size=4, **common)
        c.dpo = train_stage(fn, "data/pairs.jsonl", init="stage:sft", loss="dpo", steps=2, batch_size=2, **common)
        c.dpo.train.lora.enabled = True
        c.critic = train_stage(fn, "data/pairs.jsonl", init="stage:sft", loss="bt", steps=2, batch_size=2, **common)
        c.grpo = train_stage(fn, "data/groups.jsonl", init="stage:sft", loss="grpo", steps=2, batch_size=4, **common)
        c.grpo.train.grpo.group_size = 2
        for s in ("sft", "dpo", "critic", "grpo"):
            c[s].train.checkpoint.every_steps = 1
            c[s].train.checkpoint.async_save = False
            c[s].train.optimizer.warmup_steps = 1
            c[s].train.optimizer.min_lr_ratio = 1.0  # a constant lr after warmup: a longer run's first steps are equal
        return c
''')

RL_CONFIG = textwrap.dedent('''
    import ml_collections
    from jaxrag.pipelines.rl import stage_config, tiny_checkpoint_config


    def get_config(world):  # the folder of corpus.jsonl and questions.jsonl
        c = ml_collections.ConfigDict()
        c.stages = ["setup", "rl", "eval"]
        c.setup = tiny_checkpoint_config(f"{world}/corpus.jsonl")
        c.setup.arch.update(dict(d_model=32, n_heads=2, n_kv_heads=1, d_ff=64, max_seq_len=256))
        c.setup.vocab_size = 300
        c.rl = s = stage_config()
        s.policy.path, s.policy.max_prompt_tokens = "stage:setup", 200
        s.retriever.corpus, s.questions.path = f"{world}/corpus.jsonl", f"{world}/questions.jsonl"
        s.agent.name, s.agent.mode, s.agent.max_doc_chars = "react", "plain", 40
        s.rl.update(dict(steps=2, questions_per_step=4, group_size=2, max_new_tokens=8, max_steps=2, k=2,
                         temperature=1.0))
        s.train.update(dict(mesh=(1, 2, 2), seq_buckets=(256,), progress=False))
        s.train.optimizer.update(dict(lr=1e-3, warmup_steps=0))
        s.train.checkpoint.update(dict(every_steps=1, async_save=False))
        c.eval = ml_collections.ConfigDict({
            "fn": "jaxrag.pipelines.eval:eval_stage",
            "agents": [{"name": "react", "opts": {"mode": "plain"}}, {"name": "direct", "opts": {"mode": "plain"}}],
            "datasets": [{"name": "toy", "path": f"{world}/questions.jsonl"}],
            "policy": {"path": "stage:setup", "max_prompt_tokens": 200},
            "retriever": {"corpus": f"{world}/corpus.jsonl"},
            "rollout": {"k": 2, "max_steps": 2, "batch_size": 8, "temperature": 0.0, "max_new_tokens": 8},
            "judge": None})
        return c
''')


def _env(devices: int) -> dict:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'launch'}", "JAX_PLATFORMS": "cpu",
           "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}"}
    return env


def _main_args(config: Path, workdir: Path, *extra) -> list[str]:
    return ["-m", "jaxrag.main", f"--config={config}", f"--workdir={workdir}", *extra]


def run_multi(config, workdir, *extra, timeout=600) -> str:
    """2 processes x 2 devices, through launch/local.py; returns the output."""
    p = subprocess.run([sys.executable, str(ROOT / "launch" / "local.py"), "--num_processes=2", "--",
                        *_main_args(config, workdir, *extra)], env=_env(2), capture_output=True, text=True,
                       timeout=timeout, cwd=ROOT)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]
    return p.stdout


def run_single(config, workdir, *extra, timeout=600) -> str:
    """One process holding all 4 devices: the reference."""
    p = subprocess.run([sys.executable, *_main_args(config, workdir, *extra)], env=_env(4), capture_output=True,
                       text=True, timeout=timeout, cwd=ROOT)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]
    return p.stdout


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def assert_same_model(a: Path, b: Path, rtol=2e-5, atol=2e-6):
    from jaxrag.pipelines.common import load_checkpoint

    (ca, pa, ha), (cb, pb, hb) = load_checkpoint(a, with_head=True), load_checkpoint(b, with_head=True)
    assert ca == cb
    import jax

    for (k, x), y in zip(jax.tree_util.tree_leaves_with_path(pa), jax.tree.leaves(pb)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=rtol, atol=atol, err_msg=str(k))
    assert (ha is None) == (hb is None)
    if ha is not None:
        for k in ha:
            np.testing.assert_allclose(ha[k], hb[k], rtol=rtol, atol=atol, err_msg=k)


@pytest.fixture(scope="module")
def train_runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("mh_train")
    cfg = tmp / "train_cfg.py"
    cfg.write_text(TRAIN_CONFIG)
    run_multi(cfg, tmp / "multi")
    run_single(cfg, tmp / "single")
    return cfg, tmp


@pytest.mark.slow
def test_every_training_stage_kind_on_two_processes(train_runs):
    cfg, tmp = train_runs
    multi, single = tmp / "multi", tmp / "single"
    for stage, steps in (("sft", 4), ("dpo", 2), ("critic", 2), ("grpo", 2)):
        assert (multi / stage / "DONE").is_file()
        train = [r for r in rows(multi / stage / "metrics.jsonl") if r["kind"] == "train"]
        assert [r["step"] for r in train] == list(range(1, steps + 1)), stage  # one copy, not one per process
        assert_same_model(multi / stage / "model", single / stage / "model")
        assert sorted(p.name for p in (multi / stage / "checkpoints").iterdir() if p.name.isdigit()) == \
            sorted(p.name for p in (single / stage / "checkpoints").iterdir() if p.name.isdigit())
        assert not list((multi / stage).glob("*.tmp"))
    assert (multi / "critic" / "model" / "head.npz").is_file()
    assert not (multi / ".lock").exists()
    # the run's log is process 0's console, each line once; process 1's console is beside it
    log = (multi / "log.txt").read_text()
    assert log.count("[main] sft: running") == 1 and "[main] sft: running" in (multi / "log.process1.txt").read_text()


@pytest.mark.slow
def test_killed_two_process_run_resumes_to_the_same_model(train_runs):
    """A 40-step sft on 2 processes, SIGKILLed once its step-2 checkpoint is on disk; the rerun with 4 steps resumes
    from step 2 (restore_step: later steps are moved aside, as process 0 does for all) and ends with the model of the
    uninterrupted 4-step run."""
    cfg, tmp = train_runs
    work = tmp / "killed"
    proc = subprocess.Popen([sys.executable, str(ROOT / "launch" / "local.py"), "--num_processes=2", "--",
                             *_main_args(f"{cfg}:40", work, "--stages=data,sft")],
                            env=_env(2), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
                            start_new_session=True)
    deadline = time.time() + 500
    while not (work / "sft" / "checkpoints" / "2" / "_CHECKPOINT_METADATA").exists():
        assert proc.poll() is None and time.time() < deadline, "the run ended before its step-2 checkpoint"
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (work / "sft" / "DONE").exists()
    from jaxrag.workdir import Lock

    holder = json.loads((work / ".lock").read_text())  # the killed run's: the rerun takes it over once it is dead
    while not Lock._stale(holder):  # SIGKILL is delivered, the process may take a moment to exit
        assert time.time() < deadline, f"{holder} still alive after SIGKILL"
        time.sleep(0.2)
    out = run_multi(cfg, work, "--stages=data,sft", "--config.sft.train.checkpoint.restore_step=2")
    assert "sft: finished" in out
    train = [r["step"] for r in rows(work / "sft" / "metrics.jsonl") if r["kind"] == "train"]
    assert train[:2] == [1, 2] and train[-2:] == [3, 4]
    assert_same_model(work / "sft" / "model", tmp / "multi" / "sft" / "model")


def _world(workdir: Path) -> None:
    workdir.mkdir(parents=True, exist_ok=True)
    words = ["river", "city", "film", "prize", "north", "year", "founded", "long"]
    corpus = [{"id": f"p{i}", "title": f"Title {i}", "text": f"Title {i} is a {words[i % 8]} near {words[(3 * i) % 8]}."}
              for i in range(24)]
    (workdir / "corpus.jsonl").write_text("".join(json.dumps(r) + "\n" for r in corpus))
    qs = [{"id": f"q{i}", "question": f"which {words[i % 8]} is Title {i}?", "golden_answers": [words[i % 8]]}
          for i in range(6)]
    (workdir / "questions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in qs))


@pytest.mark.slow
def test_online_rl_and_eval_on_two_processes(tmp_path):
    cfg = tmp_path / "rl_cfg.py"
    cfg.write_text(RL_CONFIG)
    multi, single, world = tmp_path / "multi", tmp_path / "single", tmp_path / "world"
    _world(world)
    cfg = f"{cfg}:{world}"
    run_multi(cfg, multi)
    # RL: one metrics row per step, every step's B x G episodes once, in group order; the model loads back
    assert [r["step"] for r in rows(multi / "rl" / "metrics.jsonl")] == [1, 2]
    eps = rows(multi / "rl" / "episodes.jsonl")
    assert len(eps) == 2 * 4 * 2
    for step in (1, 2):
        qids = [e["qid"] for e in eps if e["metadata"]["rl_step"] == step]
        assert qids == [q for q in dict.fromkeys(qids) for _ in range(2)] and len(set(qids)) == 4
    from jaxrag.pipelines.common import load_checkpoint

    load_checkpoint(multi / "rl" / "model")
    # eval: each (agent, dataset) once; its episodes in question order, equal to one process's (temperature 0)
    run_single(cfg, single, "--stages=setup,eval")
    m_multi, m_single = rows(multi / "eval" / "metrics.jsonl"), rows(single / "eval" / "metrics.jsonl")
    assert [(r["method"], r["dataset"]) for r in m_multi] == [("react", "toy"), ("direct", "toy")]
    for a, b in zip(m_multi, m_single):
        assert {k: v for k, v in a.items() if k not in ("timing", "episodes_per_s", "processes")} == \
            {k: v for k, v in b.items() if k not in ("timing", "episodes_per_s")}
    for f in ("react__toy.episodes.jsonl", "direct__toy.episodes.jsonl"):
        ea, eb = rows(multi / "eval" / f), rows(single / "eval" / f)
        assert len(ea) == 6
        strip = lambda e: {**{k: v for k, v in e.items() if k != "metadata"},  # wall-clock fields left out
                           "steps": [{k: v for k, v in st.items() if k != "timing"} for st in e["steps"]]}
        assert [strip(e) for e in ea] == [strip(e) for e in eb]
    assert (multi / "eval" / "table.md").is_file()


def test_object_storage_workdir_is_refused_before_compute(tmp_path):
    p = subprocess.run([sys.executable, "-m", "jaxrag.main", f"--config={ROOT / 'configs' / 'train_sft.py'}",
                        "--workdir=gs://bucket/runs/sft"], env=_env(1), capture_output=True, text=True, cwd=tmp_path,
                       timeout=120)
    assert p.returncode == 2
    assert p.stderr.strip().splitlines()[-1].startswith("error: --workdir=gs://bucket/runs/sft: object-storage")
    assert not (tmp_path / "gs:").exists()


def test_shares_cover_the_list_in_order():
    from jaxrag.train.distributed import share

    items = list(range(7))
    for count in (1, 2, 3, 8):
        parts = [share(items, i, count) for i in range(count)]
        assert [x for p in parts for x in p] == items
        assert max(map(len, parts)) - min(map(len, parts)) <= 1


def test_each_process_scores_its_own_share_of_the_step_once(monkeypatch):
    """Multi-host RL: a process samples and scores only its share of the step's groups, process rewards (PPO's PRM)
    included, and returns each episode's step rewards aligned with it (gathering left as identity here; the real
    gather is the same as for the episodes)."""
    from jaxrag.rl import loop as L
    from jaxrag.rl.config import RLConfig
    from jaxrag.train.distributed import share

    rc = RLConfig(group_size=2, questions_per_step=5)
    scored = []
    monkeypatch.setattr(L, "sample_groups", lambda s, qs, rc, rcfg, st: [f"{q}/{g}" for q in qs for g in range(2)])
    monkeypatch.setattr(L, "score_episodes", lambda eps, reward: [len(e) for e in eps])
    monkeypatch.setattr(L, "process_count", lambda: 2)
    monkeypatch.setattr(L, "allgather_objects", lambda obj: [obj])
    monkeypatch.setattr(L, "gather_shares", lambda items: list(items))

    def prm(episodes):
        scored.append(list(episodes))
        return [[float(e.split("/")[1]), 1.0] for e in episodes]

    questions = [f"q{i}" for i in range(5)]
    for p in (0, 1):
        monkeypatch.setattr(L, "process_index", lambda p=p: p)
        monkeypatch.setattr(L, "share", lambda items, p=p: share(items, p, 2))
        eps, rewards, _, steps = L.sample_and_score(None, questions, rc, L.RolloutConfig(), None, {}, prm)
        mine = share(questions, p, 2)
        assert eps == [f"{q}/{g}" for q in mine for g in range(2)] and scored[-1] == eps
        assert steps == [[float(e.split("/")[1]), 1.0] for e in eps] and rewards == [len(e) for e in eps]
    assert sum(len(s) for s in scored) == 5 * 2   # every episode scored once over the two processes
    monkeypatch.setattr(L, "process_count", lambda: 1)
    assert L.sample_and_score(None, questions, rc, L.RolloutConfig(), None, {}, None)[3] is None
