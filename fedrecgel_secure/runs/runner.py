"""Run directories: start a run, resume it after a crash, evaluate what it saved.

What a run directory holds is described in :mod:`fedrecgel_secure.runs.directory`. The
checkpoint records the digest of the resolved policy, so a run only ever
continues under the policy it started with.
"""

from __future__ import annotations

from pathlib import Path

from fedrecgel_secure.data.prepare import load_split
from fedrecgel_secure.errors import BadInputError
from fedrecgel_secure.federation.trainer import Trainer
from fedrecgel_secure.policy import Policy, load_policy
from fedrecgel_secure.runs.checkpoint import load_checkpoint
from fedrecgel_secure.runs.directory import CHECKPOINT, RESOLVED, check_out_dir


def open_run(
    out_dir: Path, policy_path: Path | Policy | None = None, overrides: list[str] = (), *, resume: bool = False
) -> Trainer:
    """A trainer for ``out_dir``: fresh, or restored from its checkpoint with ``resume``.

    ``policy_path`` is a policy file, a packaged policy's name, or a :class:`Policy` already made (then
    ``overrides`` must be empty: change the object instead).

    ``out_dir`` is checked before any data is loaded: it must be writable, and
    hold no run unless ``resume``; with ``resume`` it must hold a checkpoint. With
    ``resume`` and no policy file, the run's own resolved policy is used, and
    ``overrides`` may change ``federation.rounds`` to extend the run.
    """
    out_dir = Path(out_dir)
    check_out_dir(out_dir, resume)
    if resume and policy_path is None and (out_dir / RESOLVED).is_file():
        policy_path = out_dir / RESOLVED
    if isinstance(policy_path, Policy):
        if overrides:
            raise BadInputError("overrides apply to a policy file; change the Policy object itself instead")
        policy = policy_path
    else:
        policy = load_policy(policy_path, overrides)
    trainer = Trainer(policy, load_split(policy.data))
    if resume:
        trainer.resume_from(out_dir)
    return trainer


def load_run(run_dir: Path) -> tuple[Policy, Trainer]:
    run_dir = Path(run_dir)
    if not (run_dir / RESOLVED).is_file():
        raise BadInputError(f"{run_dir}: not a run directory (no {RESOLVED})")
    policy = load_policy(run_dir / RESOLVED)
    trainer = Trainer(policy, load_split(policy.data))
    trainer.load_state_dict(load_checkpoint(run_dir / CHECKPOINT, "evaluate"), str(run_dir / CHECKPOINT))
    return policy, trainer


def evaluate_run(run_dir: Path) -> dict:
    """Metrics of the model a run directory's checkpoint holds, recomputed from scratch."""
    _, trainer = load_run(run_dir)
    return {"round": trainer.round, **trainer.evaluate()}
