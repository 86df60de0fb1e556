"""Top-K recommendations from a trained model: a user's best-scored items, the ones it trained on left out.

:func:`top_k` ranks the whole catalogue for a batch of users (the item side of
NeuMF computed once, :func:`~fedrecgel_secure.model.item_side`); the simulator's
run directory (:class:`TrainedRun`, ``fedrecgel recommend``) and a deployment's
node (:mod:`fedrecgel_secure.deploy.node.recommendations`, its own users only)
both call it, and both write lists with :func:`write_lists`: one row per
recommendation, ``user,rank,item,score``, best first (rank 1).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from fedrecgel_secure.data.split import Split, csr_rows
from fedrecgel_secure.errors import BadInputError
from fedrecgel_secure.model import NeuMF, head, item_side
from fedrecgel_secure.runs.directory import atomic_write_bytes

SCORE_CELLS = 2**22  # users x items x first tower width per pass: 16 MiB of activations; measured fastest here
COLUMNS = ("user", "rank", "item", "score")
LISTS_MODE = 0o600  # what each user is recommended follows from its private data: readable by the owner only


def check_k(k: int, n_items: int) -> None:
    if k <= 0:
        raise BadInputError(f"-k {k}: must be at least 1")
    if k > n_items:
        raise BadInputError(f"-k {k}: the catalogue has only {n_items:,} items")


def users_per_pass(model: NeuMF) -> int:
    n_items, width = model.item_embeddings.shape[0], model.mlp[0].out_features
    return max(1, SCORE_CELLS // (n_items * width))


@torch.no_grad()
def top_k(
    model: NeuMF, theta: torch.Tensor, split: Split, users: np.ndarray, k: int, include_seen: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` best items of each of ``users`` (rows of ``theta`` and ``split``): item indices (len(users), k)
    and their scores (logits), best first. The items a user trained on are left out unless ``include_seen``;
    where fewer than ``k`` items are left, the row ends in item -1, score -inf."""
    users = np.asarray(users, dtype=np.int64)
    side = item_side(model.tower(), model.item_embeddings)
    items_out, scores_out = [], []
    step = users_per_pass(model)
    for s in range(0, users.size, step):
        batch = users[s : s + step]
        seen = None if include_seen else csr_rows(split.train_indptr, split.train_items, batch)
        items, scores = rank_rows(model, theta[torch.from_numpy(batch)], k, seen, side=side)
        items_out.append(items)
        scores_out.append(scores)
    if not items_out:
        return np.empty((0, k), dtype=np.int64), np.empty((0, k))
    return np.concatenate(items_out), np.concatenate(scores_out)


@torch.no_grad()
def rank_rows(
    model: NeuMF,
    rows: torch.Tensor,
    k: int,
    excluded: tuple[np.ndarray, np.ndarray] | None = None,
    candidates: np.ndarray | None = None,
    side: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` best items (indices, logits; best first) of each user row of ``rows`` (B, d), in one pass:
    ``excluded`` (a CSR ``(indptr, items)`` over the rows) never listed, only ``candidates`` (item indices; None:
    every item) listed. Where fewer than ``k`` items are left, the row ends in item -1, score -inf.
    ``side``: :func:`~fedrecgel_secure.model.item_side` when the caller computed it once for many passes."""
    side = item_side(model.tower(), model.item_embeddings) if side is None else side
    scores = head(model.tower(), rows, side)  # (B, n_items)
    if candidates is not None:
        allowed = torch.zeros(scores.shape[1], dtype=torch.bool)
        allowed[torch.from_numpy(np.asarray(candidates, dtype=np.int64))] = True
        scores[:, ~allowed] = -torch.inf
    if excluded is not None:
        indptr, items = excluded
        at = np.repeat(np.arange(rows.shape[0]), np.diff(indptr))
        scores[torch.from_numpy(at), torch.from_numpy(np.asarray(items, dtype=np.int64))] = -torch.inf
    best = torch.topk(scores, min(k, scores.shape[1]), dim=1)
    items = best.indices.numpy().astype(np.int64)
    items[torch.isinf(best.values).numpy()] = -1
    return items, best.values.double().numpy()


def write_lists(
    path: Path,
    user_ids: np.ndarray,
    items: np.ndarray,
    scores: np.ndarray,
    item_ids: np.ndarray | None = None,
) -> Path:
    """Rows ``user,rank,item,score`` (CSV, or Parquet for a ``.parquet`` path when pyarrow is installed): row ``j``
    of ``items``/``scores`` is user ``user_ids[j]``'s list; items are named by ``item_ids`` (their indices if
    None). Padding (item -1) is left out. The file is created 0600, atomically."""
    path = Path(path)
    n, k = items.shape
    keep = (items >= 0).reshape(-1)
    columns = {
        "user": np.repeat(np.asarray(user_ids), k)[keep],
        "rank": np.tile(np.arange(1, k + 1), n)[keep],
        "item": (items.reshape(-1) if item_ids is None else np.asarray(item_ids)[np.maximum(items, 0)].reshape(-1))[
            keep
        ],
        "score": scores.reshape(-1)[keep],
    }
    if path.suffix == ".parquet":
        pa, pq = _parquet(path)
        buffer = pa.BufferOutputStream()
        pq.write_table(pa.table({c: columns[c] for c in COLUMNS}), buffer)
        atomic_write_bytes(path, buffer.getvalue().to_pybytes(), mode=LISTS_MODE)
        return path
    text = io.StringIO(newline="")
    out = csv.writer(text)
    out.writerow(COLUMNS)
    out.writerows(zip(*(columns[c].tolist() for c in COLUMNS)))
    atomic_write_bytes(path, text.getvalue().encode(), mode=LISTS_MODE)
    return path


def check_list_path(path: Path) -> None:
    """Refuse, before any work, a list file that cannot be written: its folder missing, or Parquet without pyarrow."""
    path = Path(path)
    if not path.parent.is_dir():
        raise BadInputError(f"--out {path}: {path.parent} is not a directory")
    if path.suffix == ".parquet":
        _parquet(path)


def _parquet(path: Path):
    """pyarrow and its Parquet writer; not a dependency of this package: bad input if it is not installed."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise BadInputError(
            f"--out {path}: writing Parquet needs pyarrow (pip install pyarrow); or give a .csv path"
        ) from None
    return pa, pq


def read_lists(path: Path) -> dict[str, list[tuple[str, float]]]:
    """A CSV of :func:`write_lists` back: user id (as text) -> its (item id, score) pairs in rank order."""
    out: dict[str, list[tuple[str, float]]] = {}
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            out.setdefault(row["user"], []).append((row["item"], float(row["score"])))
    return out


@dataclass
class TrainedRun:
    """A simulated run's trained model as its checkpoint holds it: the shared model, every user's embedding,
    the split it trained on (for the items to leave out) and the file ids of its users and items."""

    run_dir: Path
    policy: object
    round: int
    model: NeuMF
    theta: torch.Tensor
    split: Split
    _ids: object = None

    @property
    def ids(self):
        """:class:`~fedrecgel_secure.data.ids.RawIds`, read from the data file on first use."""
        if self._ids is None:
            from fedrecgel_secure.data.ids import raw_ids

            self._ids = raw_ids(self.policy.data)
        return self._ids

    def recommend(self, user: str | int, k: int = 10, include_seen: bool = False) -> list[tuple[object, float]]:
        """User ``user``'s (its id in the data file) ``k`` best items as (item id, score), best first; the score
        is the model's logit."""
        check_k(k, self.split.n_items)
        index = self.ids.user_index(user)
        items, scores = top_k(self.model, self.theta, self.split, np.array([index]), k, include_seen)
        return [(self.ids.items[i].item(), float(s)) for i, s in zip(items[0], scores[0]) if i >= 0]

    def recommend_all(
        self,
        out: Path,
        k: int = 10,
        include_seen: bool = False,
        on_progress: Callable[[int, int], None] | None = None,
        users_per_chunk: int = 1024,
    ) -> Path:
        """Every user's list into ``out`` (:func:`write_lists`, the file ids); ``on_progress(done, total)``."""
        check_k(k, self.split.n_items)
        check_list_path(out)
        users = np.arange(self.split.n_users)
        items, scores = [], []
        for s in range(0, users.size, users_per_chunk):
            got = top_k(self.model, self.theta, self.split, users[s : s + users_per_chunk], k, include_seen)
            items.append(got[0])
            scores.append(got[1])
            if on_progress is not None:
                on_progress(min(s + users_per_chunk, users.size), users.size)
        return write_lists(out, self.ids.users, np.concatenate(items), np.concatenate(scores), self.ids.items)


def open_trained(run_dir: Path) -> TrainedRun:
    """The model a simulated run's checkpoint holds; bad input (exit 2) for a directory that is not a run, a run
    with no checkpoint yet, or a deployment's run directory (its server holds no user embedding)."""
    from fedrecgel_secure.data.prepare import load_split
    from fedrecgel_secure.federation.build import init_model
    from fedrecgel_secure.federation.trainer import CHECKPOINT_FORMAT
    from fedrecgel_secure.policy import load_policy
    from fedrecgel_secure.runs.checkpoint import load_checkpoint
    from fedrecgel_secure.runs.directory import CHECKPOINT, RESOLVED

    run_dir = Path(run_dir)
    if not (run_dir / RESOLVED).is_file():
        raise BadInputError(f"{run_dir}: not a run directory (no {RESOLVED})")
    policy = load_policy(run_dir / RESOLVED)
    state = load_checkpoint(run_dir / CHECKPOINT, "recommend from")
    if state.get("format") != CHECKPOINT_FORMAT:
        raise BadInputError(
            f"{run_dir / CHECKPOINT}: checkpoint format {state.get('format')!r}, this version reads"
            f" format {CHECKPOINT_FORMAT}"
        )
    if state.get("clients") is None:
        raise BadInputError(
            f"{run_dir}: a deployment's run directory holds no user embeddings (they never leave their nodes);"
            " each node writes its own users' lists: `fedrecgel deploy local --recommend K` (docs/deploying.md)"
        )
    split = load_split(policy.data)
    model, _ = init_model(policy, split.n_items)
    model.load_state_dict(state["model"])
    model.eval()
    return TrainedRun(
        run_dir, policy, int(state["round"]), model, state["clients"]["theta"].to(model.item_embeddings.dtype), split
    )
