"""A node's contained failures (deploy/node/answers.py) rest on two operations of the upload holders: zeroing some
clients exactly (also where their values are infinite or NaN) and writing a holder to a checkpoint and back bit for
bit. The row holder must agree with the dense one, its oracle."""

from __future__ import annotations

import torch

from fedrecgel_secure.federation.uploads import DenseUploads, RowUploads, uploads_from_state

N_ITEMS, WIDTH, DENSE = 6, 3, 4


def holders() -> tuple[RowUploads, DenseUploads]:
    g = torch.Generator().manual_seed(0)
    owner = torch.tensor([0, 0, 1, 2, 2, 2])
    items = torch.tensor([1, 4, 0, 2, 3, 5])
    rows = torch.randn(6, WIDTH, generator=g)
    rows[3, 1] = float("inf")  # client 2's computation failed
    mlp = torch.randn(3, DENSE, generator=g)
    mlp[2, 0] = float("nan")
    row = RowUploads(rows, owner, items, mlp, N_ITEMS)
    dense = DenseUploads(torch.stack([row.vector(c) for c in range(3)]), N_ITEMS * WIDTH)
    for h in (row, dense):
        h.reports = torch.tensor([[0.5, 1.0], [0.0, 1.0], [float("nan"), 0.0]], dtype=torch.float64)
    return row, dense


def test_zeroed_clients_upload_exactly_zero_and_the_others_are_untouched_in_both_holders():
    failed = torch.tensor([False, False, True])
    for holder in holders():
        assert not torch.isfinite(holder.group_sq_norms()[2]).all()
        out = holder.zeroed(failed)
        assert torch.equal(out.vector(2), torch.zeros_like(out.vector(2)))  # not 0 * inf = NaN
        assert torch.isfinite(out.group_sq_norms()).all()
        for c in (0, 1):
            assert torch.equal(out.vector(c), holder.vector(c))
        assert torch.equal(out.reports[2], torch.zeros(2, dtype=torch.float64))
        assert torch.equal(out.reports[:2], holder.reports[:2])
    row, dense = (h.zeroed(failed) for h in holders())
    assert all(torch.equal(row.vector(c), dense.vector(c)) for c in range(3))


def test_a_holder_written_and_read_back_is_the_same_bit_for_bit():
    for holder in holders():
        back = uploads_from_state(holder.state_dict())
        assert type(back) is type(holder)
        for c in range(3):
            assert torch.equal(back.vector(c).nan_to_num(7.0), holder.vector(c).nan_to_num(7.0))
        assert torch.equal(back.reports.nan_to_num(7.0), holder.reports.nan_to_num(7.0))


def test_spread_uploads_are_the_holders_at_their_positions_and_zero_elsewhere_in_both_holders():
    # The simulator under hidden participation: the drawn clients' uploads among every client's, the rest zero.
    positions = torch.tensor([4, 0, 2])
    for holder in holders():
        out = holder.spread(positions, 5)
        assert out.num_clients == 5
        for c in (1, 3):
            assert torch.equal(out.vector(c), torch.zeros_like(out.vector(c)))
            assert torch.equal(out.reports[c], torch.zeros(2, dtype=torch.float64))
        for i, c in enumerate(positions.tolist()):
            assert torch.equal(out.vector(c).nan_to_num(7.0), holder.vector(i).nan_to_num(7.0))
            assert torch.equal(out.reports[c].nan_to_num(7.0), holder.reports[i].nan_to_num(7.0))
    row, dense = (h.spread(positions, 5) for h in holders())
    assert all(torch.equal(row.vector(c).nan_to_num(7.0), dense.vector(c).nan_to_num(7.0)) for c in range(5))
