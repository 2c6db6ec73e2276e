"""Local multi-process launcher: N processes on this machine joined by jax.distributed (CPU: one device each, or
XLA_FLAGS=--xla_force_host_platform_device_count=D for D fake devices each).

    python launch/local.py --num_processes=2 -- -m jaxrag.main --config=configs/train_sft.py --workdir=runs/x

Each child gets JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID (read by
jaxrag.train.distributed.maybe_initialize). Output of process i is prefixed [i]. When a child fails the others are
ended (they would wait for it at the next collective), as `srun --kill-on-bad-exit` does; exits non-zero if any
child fails. See docs/multihost.md.
"""

import argparse
import os
import socket
import subprocess
import sys
import threading
import time


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(num_processes: int, args: list[str], env: dict | None = None) -> list[int]:
    port = free_port()
    procs = []
    for i in range(num_processes):
        child_env = {**os.environ, **(env or {}), "JAX_COORDINATOR_ADDRESS": f"127.0.0.1:{port}",
                     "JAX_NUM_PROCESSES": str(num_processes), "JAX_PROCESS_ID": str(i)}
        procs.append(subprocess.Popen([sys.executable, *args], env=child_env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))

    def pump(i, p):
        for line in p.stdout:
            print(f"[{i}] {line}", end="")

    threads = [threading.Thread(target=pump, args=(i, p)) for i, p in enumerate(procs)]
    for t in threads:
        t.start()
    while any(p.poll() is None for p in procs):
        if any(p.poll() not in (None, 0) for p in procs):  # one failed: the rest would hang at a collective
            for p in procs:
                if p.poll() is None:
                    p.kill()
        time.sleep(0.2)
    codes = [p.wait() for p in procs]
    for t in threads:
        t.join()
    return codes


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--num_processes", type=int, default=2)
    ap.add_argument("rest", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    rest = a.rest[1:] if a.rest[:1] == ["--"] else a.rest
    codes = launch(a.num_processes, rest)
    sys.exit(max(codes))
