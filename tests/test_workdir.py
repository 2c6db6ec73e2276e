"""A workdir you can trust (jaxrag/workdir.py via jaxrag.main.run): settings fingerprints, refusal of changed
settings, --rerun_changed, atomic --force reruns, the lock. Stages here are pure Python (no JAX): fast."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import ml_collections
import pytest

from jaxrag.main import StageError, run
from jaxrag.workdir import Lock, WorkdirError

CALLS = []
CODE = {}      # stage -> a suffix its output gains: a change of the stage's code, not of its settings
FAIL_IN = set()  # stages that fail (a kill or a full disk), outside the settings


def write_stage(config, workdir, name):
    """Writes <name>/out.txt = the value of its `value` key + the previous stage's out.txt."""
    CALLS.append(name)
    before = ""
    i = list(config.stages).index(name)
    if i:
        before = open(os.path.join(workdir, config.stages[i - 1], "out.txt")).read()
    if config[name].get("fail") or name in FAIL_IN:
        with open(os.path.join(workdir, name, "out.txt"), "w") as f:
            f.write("partial")
        raise OSError(28, "No space left on device (injected)")
    with open(os.path.join(workdir, name, "out.txt"), "w") as f:
        f.write(before + str(config[name].value) + CODE.get(name, ""))


def _config(**values):
    c = ml_collections.ConfigDict()
    c.seed = 0
    c.stages = ["a", "b", "c"]
    for n in c.stages:
        c[n] = ml_collections.ConfigDict({"fn": "test_workdir:write_stage", "value": values.get(n, 1), "fail": False})
    return c


def _out(wd, name):
    return (wd / name / "out.txt").read_text()


def test_unchanged_rerun_skips_and_config_is_saved(tmp_path):
    CALLS.clear()
    assert run(_config(), tmp_path) == ["a", "b", "c"]
    assert run(_config(), tmp_path) == [] and CALLS == ["a", "b", "c"]
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["config"]["a"]["value"] == 1 and "git_commit" in saved
    assert json.loads((tmp_path / "b" / "DONE").read_text())["settings"]["b"]["value"] == 1


def test_changed_setting_is_refused_naming_the_key(tmp_path):
    run(_config(), tmp_path)
    with pytest.raises(StageError, match=r"b: finished under other settings \(changed: b.value\)"):
        run(_config(b=2), tmp_path)
    with pytest.raises(StageError, match="changed: seed"):
        c = _config()
        c.seed = 7
        run(c, tmp_path)
    assert _out(tmp_path, "c") == "111"  # nothing was touched


@pytest.mark.parametrize("text", ["", '{"fingerprint": "0123', "[]", '{"settings": {}}', "\xff"])
def test_a_done_record_that_cannot_be_read_is_not_a_finished_stage(tmp_path, text, capsys):
    """A truncated, empty or foreign DONE never counts as finished: a planned stage reruns under the settings now
    given (and says why); as an earlier stage left as is, it refuses the planned stages after it."""
    run(_config(), tmp_path)
    done = tmp_path / "b" / "DONE"
    done.write_text(text, encoding="latin-1")
    with pytest.raises(StageError, match=r"c: the earlier stage 'b' is not known to be finished \(.*b/DONE: not a "
                                         r"DONE record"):
        run(_config(c=3), tmp_path, only=["c"])
    assert _out(tmp_path, "c") == "111"                    # refused before anything changed
    CALLS.clear()
    capsys.readouterr()
    assert run(_config(b=4), tmp_path, only=["b"]) == ["b"] and CALLS == ["b"]
    assert "b/DONE: not a DONE record" in capsys.readouterr().out
    assert json.loads(done.read_text())["settings"]["b"]["value"] == 4 and _out(tmp_path, "b") == "14"
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["config"]["b"]["value"] == 4              # the config the outputs were made under


def test_rerun_changed_reruns_exactly_the_affected_stages(tmp_path):
    run(_config(), tmp_path)
    CALLS.clear()
    assert run(_config(b=5), tmp_path, rerun_changed=True) == ["b", "c"] and CALLS == ["b", "c"]
    assert _out(tmp_path, "c") == "151"
    assert run(_config(b=5), tmp_path) == []


def test_failed_forced_rerun_keeps_previous_outputs(tmp_path):
    run(_config(), tmp_path)
    c = _config(b=9)
    c.b.fail = True
    with pytest.raises(OSError, match="injected"):
        run(c, tmp_path, only=["b"], force=True)
    assert _out(tmp_path, "b") == "11" and (tmp_path / "b" / "DONE").exists()
    assert not (tmp_path / "b.prev").exists()
    assert run(_config(), tmp_path) == []  # the old, complete outputs still stand


def test_forced_rerun_of_one_stage_invalidates_later_ones(tmp_path):
    run(_config(), tmp_path)
    assert run(_config(), tmp_path, only=["a"], force=True) == ["a"]
    assert (tmp_path / "a" / "DONE").exists() and not (tmp_path / "b" / "DONE").exists()
    assert run(_config(), tmp_path) == ["b", "c"]


def test_interrupted_rerun_is_recovered(tmp_path):
    run(_config(), tmp_path)
    (tmp_path / "b").rename(tmp_path / "b.prev")  # what a SIGKILL during a forced rerun of b leaves
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "out.txt").write_text("partial")
    assert run(_config(), tmp_path) == [] and _out(tmp_path, "b") == "11"


def test_lock_names_the_holder_and_stale_lock_is_taken_over(tmp_path):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / ".lock").write_text(json.dumps({"pid": sleeper.pid, "host": os.uname().nodename}))
        with pytest.raises(WorkdirError, match=f"in use by another run \\(pid {sleeper.pid}"):
            run(_config(), tmp_path)
    finally:
        sleeper.kill()
        sleeper.wait()
    assert run(_config(), tmp_path) == ["a", "b", "c"]  # the holder is gone: stale, taken over
    assert not (tmp_path / ".lock").exists()
    with Lock(tmp_path), pytest.raises(WorkdirError, match="in use"):
        run(_config(), tmp_path)


def test_a_lock_held_by_an_exited_unreaped_process_is_stale(tmp_path):
    """A run SIGKILLed with its launcher leaves orphans that stay zombies where PID 1 does not reap them (CI's
    container): kill(pid, 0) still succeeds for them, and the rerun used to be refused as "in use"."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])  # exits; not waited for, so it stays a zombie
    try:
        stat = Path(f"/proc/{child.pid}/stat")
        deadline = time.time() + 60
        while stat.read_text().rsplit(")", 1)[1].split()[0] != "Z":
            assert time.time() < deadline
            time.sleep(0.05)
        os.kill(child.pid, 0)  # still answers as if alive
        (tmp_path / ".lock").write_text(json.dumps({"pid": child.pid, "host": os.uname().nodename}))
        assert run(_config(), tmp_path) == ["a", "b", "c"]
        assert not (tmp_path / ".lock").exists()
    finally:
        child.wait()


def test_result_neutral_settings_do_not_block_a_rerun(tmp_path):
    c = _config()
    c.b.train = ml_collections.ConfigDict({"progress": True, "checkpoint": {"restore_step": 4, "every_steps": 2}})
    run(c, tmp_path)
    c.b.train.progress, c.b.train.checkpoint.restore_step, c.b.train.checkpoint.every_steps = False, None, 5
    assert run(c, tmp_path) == []  # progress bars, checkpoint cadence and the step resumed from change no output
    assert "progress" not in json.loads((tmp_path / "b" / "DONE").read_text())["settings"]["b"]["train"]


def test_a_key_added_later_at_its_old_meaning_keeps_the_fingerprint_and_the_resume(tmp_path):
    """settings.LATER: rl.continuous = False reads as absent (a workdir made before the key existed is still done,
    a checkpoint recorded without it resumes); True is a change, named."""
    from jaxrag.settings import changed_keys

    c = _config()
    c.b.rl = ml_collections.ConfigDict({"steps": 2})
    run(c, tmp_path)                                   # recorded before rl.continuous existed
    with c.b.rl.unlocked():
        c.b.rl.continuous = False
    assert run(c, tmp_path) == []
    c.b.rl.continuous = True
    with pytest.raises(StageError, match=r"changed: b\.rl\.continuous"):
        run(c, tmp_path)
    old = {"rl": {"steps": 2}}
    assert changed_keys(old, {"rl": {"steps": 2, "continuous": False}}) == []
    assert changed_keys(old, {"rl": {"steps": 2, "continuous": True}}) == ["rl.continuous"]


def test_a_subset_run_refuses_inputs_made_under_other_settings(tmp_path):
    run(_config(), tmp_path)
    c = _config()
    c.seed = 7  # e.g. --force --stages=report --config.seed=7 would title seed-0 results "seed 7"
    with pytest.raises(StageError, match=r"c: the earlier stage 'a' was finished under other settings \(changed: seed\)"):
        run(c, tmp_path, only=["c"], force=True)
    with pytest.raises(StageError, match=r"'b' .*changed: b.value"):
        run(_config(b=3), tmp_path, only=["c"], force=True)
    assert _out(tmp_path, "c") == "111" and (tmp_path / "c" / "DONE").exists()
    assert run(c, tmp_path, only=["a", "b", "c"], force=True) == ["a", "b", "c"]  # rerun from there: accepted


@pytest.mark.parametrize("prev_done", [True, False])
def test_a_kill_while_the_old_outputs_are_deleted_keeps_the_new_stage(tmp_path, prev_done):
    """Issue 45: a kill while `<stage>.prev` was deleted after a successful rerun. The complete new stage (its DONE)
    stays; the half-deleted old one goes (it used to be restored over the new one: data loss)."""
    run(_config(), tmp_path)
    assert run(_config(b=5), tmp_path, only=["b"], force=True) == ["b"]
    half = tmp_path / "b.prev"   # what rmtree leaves when killed part way: some files gone, maybe DONE still there
    half.mkdir()
    if prev_done:
        (half / "DONE").write_text((tmp_path / "b" / "DONE").read_text())
    assert run(_config(b=5), tmp_path, only=["b"]) == []
    assert _out(tmp_path, "b") == "15" and (tmp_path / "b" / "DONE").exists() and not half.exists()


def test_a_kill_mid_restore_or_mid_delete_leaves_no_done_over_missing_files(tmp_path):
    run(_config(), tmp_path)
    (tmp_path / "b").rename(tmp_path / "b.prev")  # a failed rerun killed while restoring: partial new one deleted
    (tmp_path / "b.deleting").mkdir()
    assert run(_config(), tmp_path) == [] and _out(tmp_path, "b") == "11"
    assert not (tmp_path / "b.prev").exists() and not (tmp_path / "b.deleting").exists()
    for d in ("a", "b", "c"):
        assert (tmp_path / d / "DONE").exists() == (tmp_path / d / "out.txt").exists()


def test_an_interrupted_forced_run_never_mixes_generations(tmp_path):
    """Issue 45: --force killed part way (here: b fails after a reran under new code). The next plain run reruns what
    was made from the old `a` instead of exiting 0 over new upstream and old downstream outputs."""
    run(_config(), tmp_path)
    CODE["a"], FAIL_IN_before = "x", set(FAIL_IN)
    FAIL_IN.add("b")
    try:
        with pytest.raises(OSError, match="injected"):
            run(_config(), tmp_path, force=True)
        assert _out(tmp_path, "a") == "1x" and _out(tmp_path, "b") == "11"  # b's old outputs came back
        FAIL_IN.discard("b")
        CALLS.clear()
        assert run(_config(), tmp_path) == ["b", "c"] and _out(tmp_path, "c") == "1x11"
        assert run(_config(), tmp_path) == []
        # --force --stages=a killed after a finished, before b's DONE was dropped: a subset run of c is refused,
        # naming the stage to rerun; a plain run reruns b and c
        old_b = (tmp_path / "b" / "DONE").read_text()
        run(_config(), tmp_path, only=["a"], force=True)
        (tmp_path / "b" / "DONE").write_text(old_b)
        with pytest.raises(StageError, match="the earlier stage 'b' was made from other outputs of 'a'"):
            run(_config(), tmp_path, only=["c"])
        assert run(_config(), tmp_path) == ["b", "c"]
    finally:
        CODE.clear()
        FAIL_IN.clear()
        FAIL_IN.update(FAIL_IN_before)


def test_a_refused_run_leaves_config_json_as_the_outputs_were_made(tmp_path):
    run(_config(), tmp_path)
    c = _config()
    c.seed = 1
    with pytest.raises(StageError, match="changed: seed"):
        run(c, tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["config"]["seed"] == 0


LOCK_TRIAL = """
import sys, time
from jaxrag.workdir import Lock, WorkdirError
start = float(sys.argv[2])
while time.time() < start:
    pass
try:
    with Lock(sys.argv[1]):
        print("held", flush=True)
        time.sleep(1.5)
except WorkdirError as e:
    print("refused", e, flush=True)
"""


def test_concurrent_starters_never_both_hold_the_lock(tmp_path):
    """Issue 45: starters racing for one workdir: exactly one holds it (a lock still being written was taken for
    stale, and both held it, in 26 of 40 trials)."""
    import time

    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}
    for trial in range(3):
        wd = tmp_path / f"t{trial}"
        start = time.time() + 2.0
        procs = [subprocess.Popen([sys.executable, "-c", LOCK_TRIAL, str(wd), str(start)], env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for _ in range(6)]
        outs = [p.communicate(timeout=60)[0] for p in procs]
        assert sum(o.startswith("held") for o in outs) == 1, outs
        assert all(o.startswith(("held", "refused")) for o in outs), outs
        assert not (wd / ".lock").exists()


MID_TAKE = """
import fcntl, json, os, socket, sys, time
wd = sys.argv[1]
guard = open(os.path.join(wd, ".lock.guard"), "a")
fcntl.flock(guard, fcntl.LOCK_EX)
open(os.path.join(wd, ".lock"), "w").close()       # a starter caught between creating its lock and filling it
print("ready", flush=True)
time.sleep(1.0)
with open(os.path.join(wd, ".lock"), "w") as f:
    json.dump({"pid": os.getpid(), "host": socket.gethostname()}, f)
fcntl.flock(guard, fcntl.LOCK_UN)
time.sleep(30)
"""


def test_a_lock_being_taken_is_never_taken_over(tmp_path):
    """The deterministic form of the race: a live starter holds the guard while its lock is not yet filled. A
    second starter waits for it and then meets a live holder (it used to read the empty lock as stale and take it)."""
    holder = subprocess.Popen([sys.executable, "-c", MID_TAKE, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        with pytest.raises(WorkdirError, match=f"in use by another run \\(pid {holder.pid}"):
            run(_config(), tmp_path)
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()


def test_an_empty_lock_left_by_an_older_version_is_taken_over(tmp_path):
    (tmp_path / ".lock").write_text("")
    assert run(_config(), tmp_path) == ["a", "b", "c"]


def test_an_input_file_edited_in_place_is_reported_and_reruns_on_request(tmp_path):
    """Issue 45: the fingerprint covers the content of the files a stage reads, not only their path."""
    qa = tmp_path / "qa.jsonl"
    qa.write_text('{"id": "1", "question": "q", "golden_answers": ["a"]}\n')
    c = _config()
    c.b.path = str(qa)
    wd = tmp_path / "wd"
    run(c, wd)
    rec = json.loads((wd / "b" / "DONE").read_text())["inputs"][str(qa)]
    assert rec["size"] == qa.stat().st_size and len(rec["sha256"]) == 64
    os.utime(qa)  # touched, same content: nothing to rerun
    assert run(c, wd) == []
    qa.write_text('{"id": "1", "question": "q", "golden_answers": ["b"]}\n')  # same size, new content
    with pytest.raises(StageError, match=rf"b: input file changed since the stage finished: {qa} \(content changed\)"
                                         r".*--rerun_changed"):
        run(c, wd)
    with pytest.raises(StageError, match=r"c: the input files of the earlier stage 'b' changed"):
        run(c, wd, only=["c"])
    assert run(c, wd, rerun_changed=True) == ["b", "c"]
    assert run(c, wd) == []


def test_every_missing_input_path_is_listed_before_any_stage_runs(tmp_path):
    c = _config()
    c.a.path = "data/here.jsonl"                   # relative to the workdir: present
    c.b.retriever = ml_collections.ConfigDict({"index_dir": "indexes/none", "encoder": "/no/such/encoder"})
    c.c.datasets = [{"name": "x", "path": str(tmp_path / "gone.jsonl")}]
    c.c.records = "b/records.jsonl"                # an earlier stage's output: not an input file
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "here.jsonl").write_text("{}\n")
    with pytest.raises(StageError, match=r"3 input paths not found: config.b.retriever.encoder = /no/such/encoder; "
                                         r"config.b.retriever.index_dir = .*indexes/none; "
                                         r"config.c.datasets\[0\].path = .*gone.jsonl"):
        run(c, tmp_path)
    assert not (tmp_path / "a" / "DONE").exists() and not (tmp_path / "config.json").exists()
