"""orbax checkpoints of the train state + a JSON meta record (step, data position), keep-N, async saves.

A checkpoint that cannot be read back (corrupt or partial files) raises CheckpointCorrupt naming its directory and
how to resume from an older one (train.checkpoint.restore_step), or, with none, which folder to delete to start
over; nothing is deleted: resuming from an older step
moves the later step directories aside (`<step>.set_aside`) so training can save those steps again.
"""

from __future__ import annotations

from pathlib import Path

import orbax.checkpoint as ocp


class CheckpointCorrupt(RuntimeError):
    pass


class Checkpointer:
    def __init__(self, directory: str | Path, keep: int = 3, async_save: bool = True):
        self.directory = Path(directory).absolute()
        options = ocp.CheckpointManagerOptions(max_to_keep=keep, enable_async_checkpointing=async_save, create=True)
        self.manager = ocp.CheckpointManager(self.directory, options=options)

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def all_steps(self) -> list[int]:
        return list(self.manager.all_steps())

    def save(self, step: int, state, meta: dict) -> None:
        args = ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta))
        self.manager.save(step, args=args, force=True)

    def restore(self, abstract_state, step: int | None = None) -> tuple[dict, dict]:
        step = self.latest_step() if step is None else step
        where = self.directory / str(step)
        if step is None or step not in self.manager.all_steps():
            raise FileNotFoundError(f"no checkpoint for step {step} under {self.directory}")
        try:
            out = self.manager.restore(step, args=ocp.args.Composite(
                state=ocp.args.StandardRestore(abstract_state), meta=ocp.args.JsonRestore()))
            state, meta = out["state"], out["meta"]
        except Exception as e:  # orbax raises many types (ValueError, FileNotFoundError, tensorstore errors)
            others = [s for s in self.all_steps() if s != step]
            hint = (f"; to resume from step {max(others)} set train.checkpoint.restore_step={max(others)}"
                    if others else f"; no older step to resume from: delete {where} to train this stage from the "
                    "start")
            raise CheckpointCorrupt(
                f"checkpoint {where} is corrupt or partial and was left untouched (other steps: {others}{hint}): "
                f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}") from None
        if not isinstance(meta, dict) or "data_position" not in meta:
            raise CheckpointCorrupt(f"checkpoint {where}: meta record lacks 'data_position': {meta!r}")
        return state, meta

    def set_aside_after(self, step: int) -> list[Path]:
        """Rename every saved step after `step` to `<n>.set_aside` (orbax no longer sees it), so a run resumed from
        `step` can save those steps again; returns the new paths."""
        moved = []
        for s in sorted(self.all_steps()):
            if s > step:
                dst = self.directory / f"{s}.set_aside"
                n = 1
                while dst.exists():
                    dst, n = self.directory / f"{s}.set_aside.{n}", n + 1
                (self.directory / str(s)).rename(dst)
                moved.append(dst)
        if moved:
            self.manager.reload()
        return moved

    def wait(self) -> None:
        self.manager.wait_until_finished()

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()
