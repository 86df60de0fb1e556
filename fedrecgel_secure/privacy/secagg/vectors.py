"""Checks shared by both schemes' roles on the vectors they are handed."""

from __future__ import annotations

import numpy as np

from fedrecgel_secure.errors import BadInputError


def check_vector(x: object, dim: int, what: str) -> np.ndarray:
    """``x`` as a finite float64 vector of length ``dim``; ``what`` names it in errors ("upload of client 3")."""
    arr = np.asarray(x)
    if arr.ndim != 1 or arr.shape[0] != dim:
        raise BadInputError(f"{what} has shape {arr.shape}, expected ({dim},)")
    if not np.issubdtype(arr.dtype, np.floating):
        raise BadInputError(f"{what} has dtype {arr.dtype}, expected float")
    arr = arr.astype(np.float64, copy=False)
    if not np.isfinite(arr).all():
        raise BadInputError(f"{what} contains NaN or infinity")
    return arr


def check_upload(x: object, dim: int, client_id: int) -> np.ndarray:
    return check_vector(x, dim, f"upload of client {client_id}")


def clip(x: np.ndarray, bound: float) -> tuple[np.ndarray, int]:
    """Clip to [-bound, bound]; returns the clipped copy and how many values were changed."""
    over = int(np.count_nonzero(np.abs(x) > bound))
    return (np.clip(x, -bound, bound) if over else x), over


def check_dim(dim: int) -> int:
    if isinstance(dim, bool) or not isinstance(dim, int) or not 1 <= dim < 2**31:
        raise BadInputError(f"dim must be an integer in [1, 2**31), got {dim!r}")
    return dim
