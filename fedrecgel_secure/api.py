"""The Python API: train from a policy, open a run directory, recommend, evaluate, export.

What the commands ``fedrecgel train``, ``recommend``, ``evaluate`` and ``export`` do, as functions over the same
library code (docs/api.md)::

    from fedrecgel_secure import api

    run = api.train("default", "runs/quick", overrides=["federation.rounds=5"])
    run.summary.best["hr@10"]
    run.recommend("7", k=10)            # [(item id, score), ...] best first, user 7's training items left out
    run.evaluate()                      # the checkpoint's metrics, recomputed
    run.export("exports/quick")         # model.safetensors, items.txt, model_card.json/.md

    run = api.open_run("runs/quick")    # a run trained earlier (by the API or the command)

Every error a user can fix is :class:`~fedrecgel_secure.errors.BadInputError`, with the message the command prints.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import cached_property
from pathlib import Path

from fedrecgel_secure.errors import BadInputError
from fedrecgel_secure.policy import Policy, load_policy
from fedrecgel_secure.runs.directory import RESOLVED, RunSummary, read_metrics, read_summary

__all__ = ["BadInputError", "Policy", "Run", "load_policy", "open_run", "train"]


class Run:
    """A run directory written by :func:`train` or ``fedrecgel train``."""

    def __init__(self, run_dir: str | Path):
        self.dir = Path(run_dir)
        if not (self.dir / RESOLVED).is_file():
            raise BadInputError(f"{self.dir}: not a run directory (no {RESOLVED})")

    def __repr__(self) -> str:
        return f"Run({str(self.dir)!r})"

    @property
    def policy(self) -> Policy:
        """The run's resolved policy."""
        return load_policy(self.dir / RESOLVED)

    @property
    def summary(self) -> RunSummary | None:
        """``summary.json`` (best and final metrics, privacy spent); None while the run has none."""
        return read_summary(self.dir)

    @property
    def metrics(self) -> list[dict]:
        """Every evaluation record of ``metrics.jsonl``, in round order."""
        return read_metrics(self.dir)

    @cached_property
    def _trained(self):
        from fedrecgel_secure.recommend import open_trained

        return open_trained(self.dir)

    def recommend(self, user: str | int, k: int = 10, include_seen: bool = False) -> list[tuple[object, float]]:
        """User ``user``'s (its id in the data file) ``k`` best items as (item id, score), best first; the items it
        trained on are left out unless ``include_seen``."""
        return self._trained.recommend(user, k, include_seen)

    def recommend_all(self, out: str | Path, k: int = 10, include_seen: bool = False) -> Path:
        """Every user's list into ``out`` (CSV, or Parquet with pyarrow): ``user,rank,item,score``."""
        return self._trained.recommend_all(Path(out), k, include_seen)

    def evaluate(self) -> dict:
        """The metrics of the model the checkpoint holds, recomputed from scratch."""
        from fedrecgel_secure.federation.runner import evaluate_run

        return evaluate_run(self.dir)

    def export(self, out_dir: str | Path, include_user_embeddings: bool = False, overwrite: bool = False) -> list[Path]:
        """The shared model in safetensors and its model card (:mod:`fedrecgel_secure.export`); the files.
        ``out_dir`` must be new or empty unless ``overwrite``."""
        from fedrecgel_secure.export import export_run

        return export_run(self.dir, Path(out_dir), include_user_embeddings=include_user_embeddings, overwrite=overwrite)


def open_run(run_dir: str | Path) -> Run:
    """A run directory trained earlier."""
    return Run(run_dir)


def train(
    policy: str | Path | Policy | None,
    out: str | Path,
    *,
    overrides: Sequence[str] = (),
    resume: bool = False,
    on_round: Callable | None = None,
) -> Run:
    """Train ``policy`` (a file, a packaged policy's name, a :class:`Policy`, or None for the default) into the run
    directory ``out``, as ``fedrecgel train --out`` does; ``overrides``: ``section.key=value`` strings (with a
    file); ``on_round``: called with each round's event. The run, once its summary is written."""
    from fedrecgel_secure.federation.runner import train_into

    train_into(out, policy, overrides, resume=resume, on_round=on_round)
    return Run(out)
