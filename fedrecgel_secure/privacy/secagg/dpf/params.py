"""The two-server DPF scheme's parameters, and the rule for a client that touched more rows than the budget.

Concern: the public facts both servers and every client share (the table's shape, the budget R, the values'
group) and the one deterministic function of a client's integers that the scheme sums (:meth:`DPFParams.sparse`),
which the protocol's client and the arithmetic simulation both apply, so the two release the same bits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np

from fedrecgel_secure.errors import BadInputError
from fedrecgel_secure.scheme_facts import NORM_CHECK_GRID_BITS

from ..arithmetic import every_valid_upload
from ..fixedpoint import FixedPoint
from . import group as group_ops
from .point import MAX_WIDTH
from .sparse import Layout

if TYPE_CHECKING:
    from .norm import NormCheck

GROUP_OF_BITS = {32: group_ops.RING, 64: group_ops.FIELD}


@dataclass(frozen=True)
class DPFParams:
    """``budget`` (R): the most item-table rows a client's upload carries (keys for ⌈1.5·R⌉ buckets, whatever it
    touched); ``value_bits``: 64 (Field64, the field the norm proof runs in) or 32 (Z_2^32: half the upload,
    where a round's sum fits: checked at the start); ``rows`` × ``width``: the item table, the leading
    ``rows · width`` values of every upload (the trainer fills them in from the model; the rest of the vector is
    dense and is additively shared).

    ``device`` is no shared fact but this party's choice, kept here because it travels with its settings: where
    its servers expand keys (:func:`.expand_torch.device_for`: ``"cpu"``, the constant-time default, ``"auto"``
    or ``"cuda"``); the two paths give the same bits, so each server may choose its own."""

    budget: int = 256
    value_bits: int = 64
    rows: int = 1
    width: int = 1
    device: str = "cpu"
    norm_bound: float = 0.0  # C: every upload proves its L2 norm on the grid is within C (:mod:`.norm`); 0: unchecked

    def __post_init__(self) -> None:
        for name in ("budget", "rows", "width"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise BadInputError(f"privacy.secure_aggregation.dpf.{name} must be an integer >= 1, got {value!r}")
        if self.width > MAX_WIDTH:  # the value pad's block counter has 16 bits (:func:`.prg.convert`)
            raise BadInputError(f"the DPF scheme takes rows of at most {MAX_WIDTH} values, got {self.width}")
        if self.device not in ("cpu", "auto", "cuda"):
            raise BadInputError(
                f"privacy.secure_aggregation.dpf.device must be 'cpu', 'auto' or 'cuda', got {self.device!r}"
            )
        if self.value_bits not in GROUP_OF_BITS:
            raise BadInputError(f"privacy.secure_aggregation.dpf.value_bits must be 32 or 64, got {self.value_bits!r}")
        if not (isinstance(self.norm_bound, int | float) and math.isfinite(self.norm_bound) and self.norm_bound >= 0):
            raise BadInputError(f"the DPF norm check's bound must be a finite C >= 0, got {self.norm_bound!r}")
        if self.norm_bound and self.value_bits != 64:
            raise BadInputError(
                "privacy.secure_aggregation.dpf.norm_check needs value_bits = 64: the proof runs in Field64"
            )

    @property
    def group(self) -> type:
        return GROUP_OF_BITS[self.value_bits]

    @property
    def table_values(self) -> int:
        return self.rows * self.width

    @cached_property
    def layout(self) -> Layout:
        return Layout(self.rows, self.width, min(self.budget, self.rows), group=self.group)

    def check(self, dim: int, encoding: FixedPoint, max_summands: int) -> None:
        """Fail early if the table does not fit the vector, or a sum of ``max_summands`` clipped uploads could wrap
        the values' group (the capacity rule: at 32 bits it bounds the grid's range and precision)."""
        if self.table_values > dim:
            raise BadInputError(f"a {self.rows} x {self.width} item table does not fit vectors of {dim} values")
        self.norm_check(encoding, dim)  # the bound must fit Field64's squares and wraparound tests
        # Field64's signed range is |s| ≤ (p − 1)/2, just under 2^63: its bit length less one, as BFV's plaintexts
        bits = self.value_bits if self.group is group_ops.RING else int(group_ops.P).bit_length() - 1
        encoding.check_capacity(max_summands, bits, "privacy.secure_aggregation.dpf.value_bits")

    def norm_check(self, encoding: FixedPoint, dim: int) -> NormCheck | None:
        """The norm check of uploads of ``dim`` values on the grid ``encoding``, or None when unchecked; a bound the
        field cannot hold is a :class:`BadInputError` naming the settings to change."""
        if not self.norm_bound:
            return None
        from .norm import NormCheck, grid_bound  # the proofs' modules load only where a run checks norms

        try:
            return NormCheck.of(self.norm_bound, encoding, self.layout.buckets, self.width, dim - self.table_values)
        except BadInputError:
            bound = grid_bound(self.norm_bound, encoding)
            finest = math.floor(NORM_CHECK_GRID_BITS - math.log2(self.norm_bound))
            raise BadInputError(
                f"privacy.secure_aggregation.dpf.norm_check: the clip norm {self.norm_bound} at frac_bits"
                f" {encoding.frac_bits} is {bound} on the grid, past what Field64's squares hold"
                f" (3·B² < p, B < 2^31.2); set privacy.secure_aggregation.frac_bits to {finest} or less"
            ) from None

    def sparse(self, ints: np.ndarray) -> tuple[np.ndarray, int]:
        """The table rows of a client's grid integers the scheme carries, ascending, and how many nonzero rows it
        leaves out. Its nonzero rows go in by decreasing norm (ties: the lower row) while they fit: R of them, each
        in a bucket of its own (:meth:`.sparse.Layout.select`); so a client that touched at most R rows keeps them
        all unless no placement holds them (rare: :data:`.sparse.EXPANSION`), and one that touched more keeps the
        R of largest norm that fit. Dropping rows only shortens the vector, so a clip norm still holds; the release
        is the sum of the vectors with the other rows zeroed (:meth:`restrict`), the same in both simulation
        modes because the rule is deterministic."""
        table = ints[: self.table_values].reshape(self.rows, self.width)
        touched = np.flatnonzero(table.any(axis=1))
        return self.choose(touched, table[touched])

    def choose(self, rows: np.ndarray, row_ints: np.ndarray) -> tuple[np.ndarray, int]:
        """:meth:`sparse` of a table given by its candidate ``rows`` (distinct) and their grid integers."""
        nonzero = row_ints.any(axis=1)
        rows, row_ints = np.asarray(rows)[nonzero], row_ints[nonzero]
        norms = np.square(row_ints.astype(np.float64)).sum(axis=1)
        order = rows[np.lexsort((rows, -norms))]  # largest norm first, then the lower row
        held, left = self.layout.select(order)
        return np.sort(np.fromiter(held.values(), dtype=np.int64, count=len(held))), len(left)

    def restrict(self, ints: np.ndarray) -> tuple[np.ndarray, int]:
        """``ints`` with the table rows :meth:`sparse` leaves out set to zero (a copy), and how many it left out."""
        kept, dropped = self.sparse(ints)
        if not dropped:
            return ints, 0
        out = ints.copy()
        table = out[: self.table_values].reshape(self.rows, self.width)
        keep = np.zeros(self.rows, dtype=bool)
        keep[kept] = True
        table[~keep] = 0
        return out, dropped

    def to_group(self, ints: np.ndarray) -> np.ndarray:
        """Signed grid integers as elements of the group (:func:`.group.from_signed`): sums add as the integers do."""
        return group_ops.from_signed(ints, self.group)

    def from_group(self, values: np.ndarray) -> np.ndarray:
        """A sum in the group read back as signed integers (int64): exact while the capacity rule holds."""
        return group_ops.to_signed(np.asarray(values, dtype=self.group))

    def arithmetic_contributors(
        self, cohort: list[int], survivors: list[int], *, min_clients: int, round_idx: int, round_seed: bytes, admit
    ) -> list[int]:
        """Who a round sums, decided without the cryptography (:func:`..arithmetic.contributors`): both servers
        sum every upload both accepted, if min_clients or more."""
        return every_valid_upload(survivors, min_clients=min_clients, round_idx=round_idx, admit=admit)
