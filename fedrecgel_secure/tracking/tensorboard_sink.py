"""TensorBoard: event files in ``RUN_DIR/tensorboard/``, written with torch's ``SummaryWriter``."""

from __future__ import annotations

from pathlib import Path

import tomli_w

from fedrecgel_secure.runs.directory import Evaluation
from fedrecgel_secure.tracking.records import (
    TENSORBOARD,
    public_file,
    public_policy,
    scalars,
    seeded_noise,
    write_state,
)


class TensorBoardSink:
    """Scalars with the round as step; the policy, ``summary.json`` and ``audit.json`` as text.

    A run that starts or resumes rewrites its event files from its history, as
    ``metrics.jsonl`` is rewritten: the rounds logged after the last checkpoint are
    gone, and every reader (TensorBoard's or another) sees each round once.
    """

    def __init__(self, run_dir: Path, policy, history: list[Evaluation] | None):
        from torch.utils.tensorboard import SummaryWriter

        self.seeded = seeded_noise(policy)
        logdir = Path(run_dir) / TENSORBOARD
        if history is not None:
            for old in logdir.glob("events.out.tfevents.*"):
                old.unlink()
        self.writer = SummaryWriter(str(logdir))
        if history is not None:
            write_state(run_dir, tensorboard=TENSORBOARD)
            self.writer.add_text("policy", "```toml\n" + tomli_w.dumps(public_policy(policy)) + "```", 0)
            for record in history:
                self._add(record)
            self.writer.flush()

    def _add(self, record: Evaluation) -> None:
        for name, value in scalars(record).items():
            self.writer.add_scalar(name, value, record["round"])

    def record(self, record: Evaluation) -> None:
        self._add(record)
        self.writer.flush()  # a reader sees the round now, and a kill loses none

    def checkpointed(self) -> None:
        pass

    def file(self, path: Path) -> None:
        if path.suffix == ".json" and path.is_file():  # a PNG of curves TensorBoard draws itself is left out
            self.writer.add_text(path.name, "```json\n" + public_file(path, self.seeded) + "```", 0)

    def close(self, finished: bool | None) -> None:
        self.writer.close()
