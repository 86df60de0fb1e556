"""Training into a run directory, the one way: check it, hold it, open a trainer, run, close.

The Python API (:func:`fedrecgel_secure.api.train`), ``fedrecgel train`` and
studies all train through :func:`training`, so what a run directory is held
for, and when, is decided here once: from before the trainer is built (its
checkpoint is read under the lock) until the trainer is closed. What a run
directory holds is described in :mod:`fedrecgel_secure.runs.directory`. The
checkpoint records the digest of the resolved policy, so a run only ever
continues under the policy it started with.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from fedrecgel_secure.data.prepare import load_split
from fedrecgel_secure.errors import BadInputError
from fedrecgel_secure.federation.trainer import Trainer
from fedrecgel_secure.interrupt import StopBetweenRounds
from fedrecgel_secure.policy import Policy, load_policy
from fedrecgel_secure.runs.checkpoint import load_checkpoint
from fedrecgel_secure.runs.directory import CHECKPOINT, RESOLVED, check_out_dir, hold_run_dir

PolicySource = str | Path | Policy | None
"""A policy file, a packaged policy's name, a :class:`Policy` already made, or None for the default."""


def open_trainer(
    out_dir: Path, policy: PolicySource = None, overrides: Sequence[str] = (), *, resume: bool = False
) -> Trainer:
    """A trainer for ``out_dir``, fresh or (``resume``) restored from its checkpoint; it neither checks nor holds the
    directory (:func:`training` does both).

    With a :class:`Policy`, ``overrides`` must be empty: change the object instead. With ``resume`` and no policy,
    the run's own resolved policy is used, and ``overrides`` may change ``federation.rounds`` to extend the run.
    """
    out_dir = Path(out_dir)
    if resume and policy is None and (out_dir / RESOLVED).is_file():
        policy = out_dir / RESOLVED
    if isinstance(policy, Policy):
        if overrides:
            raise BadInputError("overrides apply to a policy file; change the Policy object itself instead")
    else:
        policy = load_policy(policy, list(overrides))
    trainer = Trainer(policy, load_split(policy.data))
    if resume:
        trainer.resume_from(out_dir)
    return trainer


@contextmanager
def training(
    out_dir: str | Path, policy: PolicySource = None, overrides: Sequence[str] = (), *, resume: bool = False
) -> Iterator[Trainer]:
    """``with training(out, policy) as trainer: trainer.run(out)``: the trainer of :func:`open_trainer`, with ``out``
    held for this process (:func:`~fedrecgel_secure.runs.directory.hold_run_dir`) until it is closed.

    ``out`` is checked before any data is loaded: it must be writable, and hold no run unless ``resume``; with
    ``resume`` it must hold a checkpoint.
    """
    out_dir = Path(out_dir)
    check_out_dir(out_dir, resume)
    with hold_run_dir(out_dir):
        trainer = open_trainer(out_dir, policy, overrides, resume=resume)
        try:
            yield trainer
        finally:
            trainer.close()


def train_into(
    out_dir: str | Path,
    policy: PolicySource = None,
    overrides: Sequence[str] = (),
    *,
    resume: bool = False,
    on_round: Callable | None = None,
    stop: StopBetweenRounds | None = None,
) -> Trainer:
    """Train ``policy`` into ``out_dir`` to its last round (:func:`training`, then ``Trainer.run``); the closed
    trainer."""
    with training(out_dir, policy, overrides, resume=resume) as trainer:
        trainer.run(Path(out_dir), on_round, stop=stop)
    return trainer


def restore_trainer(run_dir: str | Path) -> Trainer:
    """The trainer a run directory's checkpoint holds, under the run's own resolved policy (to evaluate or audit)."""
    run_dir = Path(run_dir)
    if not (run_dir / RESOLVED).is_file():
        raise BadInputError(f"{run_dir}: not a run directory (no {RESOLVED})")
    policy = load_policy(run_dir / RESOLVED)
    trainer = Trainer(policy, load_split(policy.data))
    trainer.load_state_dict(load_checkpoint(run_dir / CHECKPOINT, "evaluate"), str(run_dir / CHECKPOINT))
    return trainer


def evaluate_run(run_dir: str | Path) -> dict:
    """Metrics of the model a run directory's checkpoint holds, recomputed from scratch."""
    trainer = restore_trainer(run_dir)
    return {"round": trainer.round, **trainer.evaluate()}
