"""Content hashes of what a stage wrote, so two runs can be compared stage by stage (the first stage where they part).

`stage_hash(dir)` is a SHA-256 over the stage directory's result files, taken in sorted path order (independent of
the filesystem's listing order) and over each file's *content*, not its bytes where the bytes carry more than the
content:
- safetensors: the tensors' names, dtypes, shapes and bytes (not the header's layout or metadata);
- npz (a zip, whose entries carry the time they were written): each array's name, dtype, shape and bytes;
- JSON / JSONL: parsed and re-serialized with sorted keys, minus the keys that time a run (`TIMING_KEYS`);
- anything else: its bytes.
Skipped, as they differ between identical runs: the DONE record itself, logs, TensorBoard events, training-state
checkpoints (orbax; the stage's exported model is hashed instead), compilation caches, lock and temporary files.

`main` stores the hash (and one per file) in each stage's DONE record; the synthetic report gathers them into a
`provenance` table and `provenance.json` (docs/reproducibility_provenance.md).
"""
from __future__ import annotations

import hashlib
import json
import struct
import sys
from pathlib import Path

import numpy as np

# Keys whose values are wall-clock measurements (seconds, rates, dates): dropped from JSON before hashing.
TIMING_KEYS = frozenset({"seconds", "compile_seconds", "wall_seconds", "elapsed", "elapsed_s", "time", "timestamp",
                         "wall", "tok_s", "tokens_per_s", "steps_per_s", "step_s", "it_s", "date", "created",
                         "started", "finished", "host", "hostname"})
# ... and any key named as a duration or a rate: "<what>_s", "<what>_seconds", "<what>_per_s" (step_time_s,
# judge_s, states_per_s) and the RL loop's "time/<part>_s"
TIMING_SUFFIXES = ("_s", "_seconds", "_per_s", "_ms")


def timing_key(key) -> bool:
    """True for a key whose value is a wall-clock measurement (not a result): dropped before hashing."""
    return isinstance(key, str) and (key in TIMING_KEYS or key.endswith(TIMING_SUFFIXES) or key.startswith("time/"))


SKIP_NAMES = frozenset({"DONE", "DONE.tmp", ".lock", "provenance.json"})
SKIP_DIRS = frozenset({"tb", "checkpoints", ".xla_cache", "__pycache__", "logs"})
SKIP_SUFFIXES = (".log", ".tmp", ".pid", ".lock")


def _skipped(rel: Path) -> bool:
    if rel.name in SKIP_NAMES or rel.name.endswith(SKIP_SUFFIXES) or rel.name.startswith("events.out.tfevents"):
        return True
    return any(part in SKIP_DIRS or part.startswith(".") for part in rel.parts[:-1])


def result_files(root: str | Path) -> list[Path]:
    """The files under `root` that the hash covers, as paths relative to it, sorted."""
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(p.relative_to(root) for p in root.rglob("*") if p.is_file() and not _skipped(p.relative_to(root)))


def _drop_timing(obj, workdir: str = ""):
    """obj without timing keys, and with the run's workdir in strings written as $WORKDIR (stats name their files)."""
    if isinstance(obj, dict):
        return {k: _drop_timing(v, workdir) for k, v in obj.items() if not timing_key(k)}
    if isinstance(obj, list):
        return [_drop_timing(v, workdir) for v in obj]
    if workdir and isinstance(obj, str) and workdir in obj:
        return obj.replace(workdir, "$WORKDIR")
    return obj


_WORKDIR = [""]  # the workdir of the stage being hashed (set by stage_hash)


def _canonical_json(obj) -> bytes:
    return json.dumps(_drop_timing(obj, _WORKDIR[0]), sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _array_digest(h, name: str, dtype: str, shape, data: bytes) -> None:
    h.update(f"{name}|{dtype}|{list(shape)}|{len(data)}\n".encode())
    h.update(data)


def _safetensors(path: Path, h) -> None:
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        base = 8 + n
        for name in sorted(k for k in header if k != "__metadata__"):
            t = header[name]
            start, end = t["data_offsets"]
            f.seek(base + start)
            _array_digest(h, name, t["dtype"], t["shape"], f.read(end - start))


def _npz(path: Path, h) -> None:
    with np.load(path, allow_pickle=False) as z:
        for name in sorted(z.files):
            a = np.ascontiguousarray(z[name])
            _array_digest(h, name, a.dtype.str, a.shape, a.tobytes())


def _json(path: Path, h) -> None:
    h.update(_canonical_json(json.loads(path.read_text())))


def _jsonl(path: Path, h) -> None:
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                h.update(_canonical_json(json.loads(line)) + b"\n")


def _bytes(path: Path, h) -> None:
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)


_READERS = {".safetensors": _safetensors, ".npz": _npz, ".json": _json, ".jsonl": _jsonl}


def file_hash(path: str | Path) -> str:
    """SHA-256 (hex) of one file's content (see the module docstring for what 'content' is per kind)."""
    path = Path(path)
    h = hashlib.sha256()
    reader = _READERS.get(path.suffix, _bytes)
    try:
        reader(path, h)
    except (ValueError, KeyError, struct.error, OSError):  # a malformed file still gets a (byte) hash
        if reader is _bytes:
            raise
        h = hashlib.sha256(b"unparsed\n")
        _bytes(path, h)
    return h.hexdigest()


def stage_hash(root: str | Path) -> dict:
    """{"sha256": hash of the whole stage, "files": {relative path: hash}} over `result_files(root)`; paths into the
    run's workdir (root's parent) count as the same in any workdir."""
    _WORKDIR[0] = str(Path(root).resolve().parent)
    try:
        files = {str(rel): file_hash(Path(root) / rel) for rel in result_files(root)}
    finally:
        _WORKDIR[0] = ""
    h = hashlib.sha256()
    for rel, digest in files.items():  # sorted by result_files
        h.update(f"{rel}\0{digest}\n".encode())
    return {"sha256": h.hexdigest(), "files": files}


def short(digest: str, n: int = 12) -> str:
    return digest[:n]


def collect(workdir: str | Path, stages) -> dict:
    """{stage: {"sha256", "files"}} from the DONE records of `stages` under `workdir` (absent or unreadable ones left out)."""
    out = {}
    for name in stages:
        done = Path(workdir) / name / "DONE"
        try:
            rec = json.loads(done.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if isinstance(rec, dict) and isinstance(rec.get("provenance"), dict):
            out[name] = rec["provenance"]
    return out


def first_divergence(mine: dict, theirs: dict, order) -> tuple[str, list[str]] | None:
    """The first stage (in `order`) whose hash differs between two `collect` results, with the differing files."""
    for name in order:
        a, b = mine.get(name), theirs.get(name)
        if a is None or b is None or a["sha256"] == b["sha256"]:
            continue
        fa, fb = a.get("files", {}), b.get("files", {})
        return name, sorted(k for k in set(fa) | set(fb) if fa.get(k) != fb.get(k))
    return None


def stage_order(workdir: str | Path) -> list[str]:
    """The run's stage order, from the effective config main saved (workdir/config.json); [] if there is none."""
    try:
        return list(json.loads((Path(workdir) / "config.json").read_text())["config"]["stages"])
    except (OSError, KeyError, TypeError, json.JSONDecodeError):
        return []


def main(argv=None) -> None:
    """python -m jaxrag.provenance DIR [DIR2]: the stage hashes of a run (its stage directories), or where two part."""
    args = sys.argv[1:] if argv is None else argv
    if not args or len(args) > 2:
        raise SystemExit("usage: python -m jaxrag.provenance WORKDIR [OTHER_WORKDIR]")
    runs = [{p.name: stage_hash(p) for p in sorted(Path(a).iterdir()) if (p / "DONE").exists()} for a in args]
    order = stage_order(args[0]) or sorted(runs[0])
    runs = [{n: run[n] for n in order if n in run} for run in runs]
    if len(runs) == 1:
        for name, rec in runs[0].items():
            print(f"{name:14s} {short(rec['sha256'], 16)}  ({len(rec['files'])} files)")
        return
    diverged = first_divergence(runs[0], runs[1], order)
    print("identical in every common stage" if diverged is None else
          f"first differing stage: {diverged[0]} (files: {', '.join(diverged[1])})")


if __name__ == "__main__":
    main()
