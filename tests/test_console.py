"""jaxrag.console: the numbers, headers and log file a person reads while a run goes."""

import logging
import os
import subprocess
import sys
from pathlib import Path

from jaxrag.console import LogFile, StageClock, num, quiet, standard_error, summary
from jaxrag.train.metrics_log import postfix

ROOT = Path(__file__).resolve().parents[1]


def test_numbers_have_four_significant_digits_and_dicts_one_line():
    assert [num(x) for x in (0.29031415926, 1.2345678e-5, 720, True, "react", 12345.678)] == \
        ["0.2903", "1.235e-05", "720", "True", "react", "1.235e+04"]
    line = summary({"steps": 720, "final_loss": 0.123456789, "train": {"rows": 512, "fill": 0.91234}, "ids": [1, 2]})
    assert line == "steps 720, final_loss 0.1235, train.rows 512, train.fill 0.9123, ids 2"
    assert summary({"a": 1.0, "b": 2.0, "c": 3}, ("c", "missing", "a")) == "c 3, a 1"
    assert round(standard_error(0.29, 200), 4) == 0.0321   # the demo's SFT cell on 200 test questions


def test_stage_headers_count_and_scale_the_reference_times_by_the_pace():
    t = [0.0]
    clock = StageClock(["world", "sft", "eval"], {"world": 10, "sft": 300, "eval": 100}, clock=lambda: t[0])
    assert clock.header("world") == "[1/3] world · 0 s so far · expect ~10 s for it, ~6.8 min to the end"
    t[0] = 20.0
    clock.done("world", 20.0)  # twice the reference's time: the rest is expected to take twice as long too
    assert clock.header("sft") == "[2/3] sft · 20 s so far · expect ~10.0 min for it, ~13.3 min to the end"
    bare = StageClock(["a", "b"], None, clock=lambda: 0.0)
    bare.skip("a")
    assert bare.header("b") == "[2/2] b · 0 s so far"


def test_log_file_keeps_each_progress_bar_once_without_carriage_returns(tmp_path, capsys):
    from tqdm import tqdm

    with LogFile(tmp_path / "log.txt"):
        print("[main] sft: running")
        bar = tqdm(total=50, desc="train", file=sys.stderr, mininterval=0)
        for _ in range(50):
            bar.update(1)
        bar.close()
        print("[sft] 50 steps")
    text = (tmp_path / "log.txt").read_text()
    assert "\r" not in text and "\r" in capsys.readouterr().err   # the terminal still gets the redraws
    lines = text.splitlines()
    assert lines[0] == "[main] sft: running" and lines[-1] == "[sft] 50 steps"
    assert len(lines) == 3 and lines[1].startswith("train: 100%") and "50/50" in lines[1]


def test_rl_bars_show_the_reward_and_training_bars_the_loss():
    assert postfix({"loss": 1.234e-4, "reward/mean": 0.28125}, 812.3) == {"reward": "0.2812", "tok_s": "812"}
    assert postfix({"loss": 0.5}, 10.0) == {"loss": "0.5", "tok_s": "10"}


def test_quiet_silences_bm25s_below_warning_even_after_it_resets_its_level(caplog):
    quiet()
    logger = logging.getLogger("bm25s")
    logger.setLevel(logging.DEBUG)  # what importing bm25s does
    with caplog.at_level(logging.DEBUG):
        logger.debug("Building index from tokens")
        logger.warning("a real problem")
    assert [r.message for r in caplog.records if r.name == "bm25s"] == ["a real problem"]


def test_the_cli_numbers_its_stages_and_writes_a_clean_log(tmp_path):
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, "-m", "jaxrag.main", "--config=configs/train_sft.py", f"--workdir={tmp_path}",
                        "--config.sft.train.steps=3"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "[1/2] data · " in p.stdout and "[2/2] sft · " in p.stdout
    log = (tmp_path / "log.txt").read_text()
    assert "\r" not in log and "[2/2] sft · " in log and "Building index from tokens" not in p.stderr + p.stdout
    assert sum(line.startswith("train: 100%") for line in log.splitlines()) == 1   # one line for the whole bar
