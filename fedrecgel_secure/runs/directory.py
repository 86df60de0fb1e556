"""A run directory: the names of its files, how they are written, and what ``summary.json`` holds.

One run of :class:`~fedrecgel_secure.federation.trainer.Trainer` writes

=========================  =====================================================
``policy.resolved.toml``   the policy with every default filled in
``metrics.jsonl``          one evaluation record per line (round, loss, metrics, ...)
``checkpoint.pt``          everything needed to continue the run exactly (0600)
``releases/round-R.npz``   a deployed masking round's released sum, reused by a resumed server (0600)
``summary.json``           :class:`RunSummary`, written when the run stops
``curves.png``             the run's curves (``fedrecgel train``)
``audit.json``             the privacy audit (``fedrecgel audit``, audited studies)
``study_error.json``       why a study's last attempt at this run failed
``tracking.json``          the run's MLflow run id and store, so a resumed run continues them (``[tracking]``)
``tensorboard/``           TensorBoard event files (``[tracking] tensorboard = true``)
``mlruns/``                the local MLflow file store (``[tracking] mlflow = true``, a run outside a study)
``crash-*.log``            the traceback of an internal error of the command (0600)
``.run.lock``              held by the process training this run (``train``, a study's worker)
=========================  =====================================================

Every file is replaced atomically (:func:`atomic_write_bytes`): a reader sees
the previous content or the new one, never a torn file, whatever kills the
writer. The one exception is ``metrics.jsonl``, appended a line per evaluation;
it is rewritten atomically from the checkpoint when a run resumes
(:class:`fedrecgel_secure.tracking.RunLog`, which also feeds the trackers).

This module imports neither torch nor any other heavy package, so the commands
that only read run directories (``fedrecgel study report``) start fast.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

from pydantic import BaseModel, ConfigDict, ValidationError

from fedrecgel_secure.errors import BadInputError

RESOLVED = "policy.resolved.toml"
METRICS = "metrics.jsonl"
CHECKPOINT = "checkpoint.pt"
SUMMARY = "summary.json"
CURVES = "curves.png"
AUDIT = "audit.json"
STUDY_ERROR = "study_error.json"  # removed once the run succeeds
RUN_LOCK = ".run.lock"


# -- writing ------------------------------------------------------------------------


def atomic_write_bytes(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Replace ``path`` with ``data`` atomically; a new file gets ``mode`` (before the umask).

    The bytes go to a temporary file in the same folder, which is fsynced and
    renamed over ``path``; then the folder is fsynced, so the rename survives a
    power cut. The temporary file has an unpredictable name and is opened with
    O_EXCL | O_NOFOLLOW, so a file or symlink planted by another local user can
    neither capture the bytes nor be reused: the write fails instead. A symlink
    at ``path`` itself is replaced, never followed.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{secrets.token_hex(8)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), mode)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_json(path: Path, data: Any) -> None:
    """``data`` as indented JSON with a final newline, written atomically."""
    atomic_write_bytes(path, (json.dumps(data, indent=2) + "\n").encode())


def check_run_dir(run_dir: Path, option: str = "--out") -> None:
    """Refuse, before any work, a run directory that cannot be written: a file, read-only, or not creatable."""
    run_dir = Path(run_dir)
    existing = next((p for p in (run_dir, *run_dir.parents) if p.exists()), None)
    if run_dir.exists() and not run_dir.is_dir():
        raise BadInputError(f"{option} {run_dir}: is a file, not a run directory")
    if existing is None or not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise BadInputError(f"{option} {run_dir}: cannot be written ({existing} is not a writable directory)")
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise BadInputError(f"{option} {run_dir}: cannot be created ({e.strerror})") from None


def check_out_dir(out_dir: Path, resume: bool) -> None:
    """Refuse a run directory that cannot take this run, before anything is loaded: one that cannot be written,
    one that holds a run already (unless ``resume``), or, with ``resume``, one that holds no checkpoint."""
    checkpoint = Path(out_dir) / CHECKPOINT
    if resume and not checkpoint.is_file():
        raise BadInputError(f"{out_dir}: nothing to resume (no {CHECKPOINT}); run without --resume to start it")
    if checkpoint.exists() and not resume:
        raise BadInputError(
            f"{out_dir}: already holds a run ({CHECKPOINT}); pass --resume to continue it or choose another --out"
        )
    check_run_dir(out_dir)


@contextmanager
def hold_run_dir(run_dir: Path) -> Iterator[None]:
    """Hold ``run_dir`` for one training process: a second one (a second ``train --out``, an orphaned study worker)
    is refused instead of interleaving its rounds into the same files. The lock is the kernel's (``flock``), so
    it is released whatever ends the holder, SIGKILL included."""
    try:
        import fcntl
    except ImportError:  # no advisory locks on this platform
        yield
        return
    with open(Path(run_dir) / RUN_LOCK, "w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise BadInputError(
                f"{run_dir}: another process is training this run (a second `train --out`, or a study still running);"
                " wait for it or choose another directory"
            ) from None
        yield


# -- reading ------------------------------------------------------------------------


def read_json(path: Path) -> Any | None:
    """The JSON in ``path``, or None if there is no such file (or it is not JSON: a foreign file, not ours)."""
    try:
        return json.loads(Path(path).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """The evaluation records of ``metrics.jsonl``, in round order; none if the run has not written any."""
    path = Path(run_dir) / METRICS
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def evaluated(records: list[dict[str, Any]], key: str) -> list[dict[str, Any]]:
    """The records that hold metrics (``key``: the run's ``select_by``), in order. Not every round's does: under
    evaluation scope "round" the metrics of round R's model ride in round R+1's sum, so the last round's record has
    none, nor has a round whose next round released no sum (:mod:`fedrecgel_secure.federation.reports`)."""
    return [r for r in records if key in r]


class RunProgress(NamedTuple):
    """How far a run has got by its ``metrics.jsonl``: the last round with a record, and the latest record that
    holds metrics (None before the first; under evaluation scope "round", one round behind at best)."""

    round: int
    latest: dict[str, Any] | None


def read_progress(run_dir: Path, key: str) -> RunProgress:
    """The :class:`RunProgress` of a run that may be writing its ``metrics.jsonl`` now (a deployment's server): a
    line not yet ended is left for the next read."""
    path = Path(run_dir) / METRICS
    text = path.read_text() if path.is_file() else ""
    records = [json.loads(line) for line in text[: text.rfind("\n") + 1].splitlines() if line.strip()]
    done = evaluated(records, key)
    return RunProgress(records[-1]["round"] if records else 0, done[-1] if done else None)


# -- summary.json -------------------------------------------------------------------


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DataShape(_Record):
    """The prepared split the run trained on."""

    users: int
    items: int
    interactions: int | None = None  # None for a deployment: its server knows no interaction


class PrivacySpent(_Record):
    """What client-level DP gave a run: the budget spent and how it was reached."""

    epsilon: float  # the accounted epsilon: against anyone who sees the released models
    delta: float  # the accountant's delta plus delta_tail
    noise: str  # "secure" or "seeded" (privacy.dp.noise)
    guarantee: str  # what the noise source promises, in words
    accountant: str
    noise_multiplier: float
    update_noise_multiplier: float
    sample_rate: float
    expected_clients: float
    clip_norm: float  # the clip norm of the last round (it moves under adaptive clipping)
    mode: str  # "central" or "distributed"
    max_epsilon: float | None
    # (fields below: None/defaults in summaries written before they existed)
    epsilon_rdp: float | None = None  # RDP's epsilon of the same rounds: a cross-check of the accountant's
    epsilon_server: float | None = None  # against the server, which knows who took part; None: no bound against it
    server_rounds: int | None = None  # rounds in which the server saw the most exposed user's upload
    max_epsilon_against: str = "release"  # whose epsilon max_epsilon bounds: "release" or "server"
    shares: str = "sampled"  # distributed noise shares sized for everyone sampled, or for the survivor threshold
    delta_tail: float = 0.0  # what the noise sampler's truncation added to delta (randomness.tail_delta)
    sampler: str = "poisson"  # privacy.dp.sampler: "cyclic" accounts per user, one epsilon against everyone
    participation: str = "known"  # privacy.dp.participation: "hidden": nodes draw, one epsilon against everyone
    correlation: str = "independent"  # privacy.dp.correlation: "banded" noise (BandMF) across rounds
    simulate_shares: str = "per_client"  # privacy.dp.simulate_shares: "summed" is a study mode, not the protocol's bits


class SecureAggregationRun(_Record):
    """How a run computed its secure sums."""

    scheme: str  # "bfv" or "masking"
    simulation: str  # "protocol" (real cryptography) or "arithmetic" (the same exact sum, no cryptography)
    workers: int | None  # processes that ran the clients' cryptography (protocol mode)

    def describe(self) -> str:
        """``masking (protocol, 2 workers)``, ``bfv (arithmetic)``."""
        how = "arithmetic" if self.simulation == "arithmetic" else f"protocol, {self.workers} worker(s)"
        return f"{self.scheme} ({how})"


Evaluation = dict[str, Any]
"""One line of ``metrics.jsonl``: ``round``, ``loss``, ``hr@5`` ... ``ndcg@20``,
then what the round reported (``epsilon`` ...)."""


class RunSummary(_Record):
    """``summary.json``: how a run ended and its headline results, written by the trainer when it stops.

    ``best`` is the evaluation with the best ``select_by`` metric on the test
    items (the authors' protocol; ties go to the earlier round), ``final`` the
    last one, ``validation_selected`` the best on the validation items when the
    policy holds them out. All three are None if no round was evaluated.
    """

    version: str
    policy_digest: str
    method: str
    rounds_done: int
    rounds_planned: int
    wall_time_s: float
    select_by: str
    data: DataShape
    best: Evaluation | None
    final: Evaluation | None
    validation_selected: Evaluation | None
    best_each: dict[str, float] | None  # the best value each test metric reached, in any round
    stopped_early: str | None  # why training ended before rounds_planned (the privacy budget)
    privacy: PrivacySpent | None  # None without DP
    secure_aggregation: SecureAggregationRun | None = None  # None: uploads summed in the clear

    @property
    def finished(self) -> bool:
        """True once the run will train no more: all planned rounds done, or stopped early."""
        return self.rounds_done == self.rounds_planned or self.stopped_early is not None

    @property
    def epsilon(self) -> float:
        """The privacy budget spent; infinite without DP."""
        return float("inf") if self.privacy is None else self.privacy.epsilon

    def to_json(self) -> str:
        # json.dumps rather than pydantic's serializer: the file stays byte-for-byte what it always was.
        return json.dumps(self.model_dump(), indent=2) + "\n"


def write_summary(run_dir: Path, summary: RunSummary) -> None:
    atomic_write_bytes(Path(run_dir) / SUMMARY, summary.to_json().encode())


def read_summary(run_dir: Path) -> RunSummary | None:
    """The run's summary, or None while it has none (not started, or still training).

    A summary that is JSON but not a summary is bad input, named by file and field.
    """
    path = Path(run_dir) / SUMMARY
    data = read_json(path)
    if data is None:
        return None
    try:
        return RunSummary.model_validate(data)
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(map(str, err['loc'])) or '(top level)'}: {err['msg']}" for err in e.errors())
        raise BadInputError(f"{path}: not a run summary of this version ({problems})") from None
