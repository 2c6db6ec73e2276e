"""Stage provenance (jaxrag/provenance.py): a content hash of what each stage wrote, in its DONE record."""
import json
import os
import struct
import zipfile

import ml_collections
import numpy as np

from jaxrag.main import run
from jaxrag.provenance import collect, file_hash, first_divergence, stage_hash


def timed_stage(config, workdir, name):
    """Writes results that depend only on the config, plus the things identical runs differ in: timings in its
    stats, a log, TensorBoard events, an orbax-like checkpoint and an npz (a zip stamped with the time written)."""
    out = os.path.join(workdir, name)
    rng = np.random.default_rng(config[name].value)
    with open(os.path.join(out, "rows.jsonl"), "w") as f:
        for i in range(3):
            f.write(json.dumps({"i": i, "x": float(rng.normal()), "seconds": os.urandom(2).hex()}) + "\n")
    with open(os.path.join(out, "stats.json"), "w") as f:
        json.dump({"n": 3, "value": config[name].value, "seconds": os.times().elapsed, "tok_s": os.getpid(),
                   "rows": os.path.join(os.path.abspath(workdir), name, "rows.jsonl")}, f)  # another path per workdir
    with open(os.path.join(out, "run.log"), "w") as f:
        f.write(os.urandom(8).hex())
    os.makedirs(os.path.join(out, "tb"))
    with open(os.path.join(out, "tb", "events.out.tfevents.1"), "wb") as f:
        f.write(os.urandom(8))
    np.savez(os.path.join(out, "head.npz"), w=rng.normal(size=(2, 3)).astype(np.float32))


def _config(value=1):
    c = ml_collections.ConfigDict()
    c.seed = 0
    c.stages = ["a", "b"]
    for n in c.stages:
        c[n] = ml_collections.ConfigDict({"fn": "test_provenance:timed_stage", "value": value if n == "b" else 1})
    return c


def test_identical_runs_give_identical_hashes_and_a_changed_output_changes_its_stage_only(tmp_path):
    run(_config(), tmp_path / "one")
    run(_config(), tmp_path / "two")
    one, two = collect(tmp_path / "one", ["a", "b"]), collect(tmp_path / "two", ["a", "b"])
    assert set(one) == {"a", "b"} and one == two  # timings, logs, tb events and npz timestamps do not count
    assert sorted(one["a"]["files"]) == ["head.npz", "rows.jsonl", "stats.json"]
    run(_config(value=2), tmp_path / "three")
    three = collect(tmp_path / "three", ["a", "b"])
    assert three["a"] == one["a"] and three["b"]["sha256"] != one["b"]["sha256"]
    assert first_divergence(one, three, ["a", "b"]) == ("b", ["head.npz", "rows.jsonl", "stats.json"])
    assert first_divergence(one, two, ["a", "b"]) is None


def _safetensors(path, tensors: dict, order, metadata=None):
    header, blobs, off = {}, [], 0
    for name in order:
        a = tensors[name]
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [off, off + a.nbytes]}
        blobs.append(a.tobytes())
        off += a.nbytes
    if metadata:
        header["__metadata__"] = metadata
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"".join(blobs))


def test_safetensors_hash_by_tensor_content_not_layout(tmp_path):
    t = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.ones(4, np.float32)}
    _safetensors(tmp_path / "x.safetensors", t, ["a", "b"])
    _safetensors(tmp_path / "y.safetensors", t, ["b", "a"], metadata={"format": "pt"})
    assert file_hash(tmp_path / "x.safetensors") == file_hash(tmp_path / "y.safetensors")
    t["b"] = np.nextafter(t["b"], 2).astype(np.float32)  # one ulp
    _safetensors(tmp_path / "z.safetensors", t, ["a", "b"])
    assert file_hash(tmp_path / "z.safetensors") != file_hash(tmp_path / "x.safetensors")


def test_npz_and_json_hash_by_content(tmp_path):
    w = np.arange(4, dtype=np.float32)
    np.savez(tmp_path / "a.npz", w=w)
    with zipfile.ZipFile(tmp_path / "b.npz", "w") as z:  # same array, another time stamp and compression
        info = zipfile.ZipInfo("w.npy", date_time=(1999, 1, 1, 0, 0, 0))
        with z.open(info, "w") as f:
            np.lib.format.write_array(f, w)
    assert (tmp_path / "a.npz").read_bytes() != (tmp_path / "b.npz").read_bytes()
    assert file_hash(tmp_path / "a.npz") == file_hash(tmp_path / "b.npz")
    (tmp_path / "c.json").write_text('{"a": 1, "b": [1, 2], "seconds": 3.5}')
    (tmp_path / "d.json").write_text('{"b":[1,2],"a":1,"seconds":9}')
    (tmp_path / "e.json").write_text('{"b":[2,1],"a":1}')
    assert file_hash(tmp_path / "c.json") == file_hash(tmp_path / "d.json") != file_hash(tmp_path / "e.json")


def test_stage_hash_is_independent_of_creation_order(tmp_path):
    for d, names in (("x", ["p", "q", "sub/r"]), ("y", ["sub/r", "q", "p"])):
        for n in names:
            (tmp_path / d / n).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / d / n).write_text(n)
    assert stage_hash(tmp_path / "x") == stage_hash(tmp_path / "y")
    (tmp_path / "y" / "sub" / "r").write_text("changed")
    assert stage_hash(tmp_path / "x")["sha256"] != stage_hash(tmp_path / "y")["sha256"]


def test_the_durations_and_rates_jaxrag_writes_do_not_count(tmp_path):
    """Two runs of the demo differed only in these keys (the trainer's step_time_s, the RL loop's time/*_s, the
    collection stages' judge_s and states_per_s), and every stage after SFT got another hash: any key named as a
    duration or a rate is left out; a result key changes the hash, whatever its name's last letter."""
    timings = ["step_time_s", "time/step_s", "time/sampling_s", "judge_s", "generate_s", "retrieve_s", "total_s",
               "states_per_s", "episodes_per_s", "tokens_per_s", "trained_tokens_per_s", "judge_seconds"]

    def write(name, stamp, **result):
        rows = [{"step": i, "loss": 0.5, "searches": 2, **result, **{k: stamp * (i + 1) for k in timings}}
                for i in range(2)]
        (tmp_path / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
        return file_hash(tmp_path / name)

    assert write("a.jsonl", 1.0) == write("b.jsonl", 7.5)
    assert write("c.jsonl", 1.0, loss=0.25) != write("a.jsonl", 1.0)
    assert write("d.jsonl", 1.0, searches=3) != write("a.jsonl", 1.0)
