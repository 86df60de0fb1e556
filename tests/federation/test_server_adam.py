"""The server's Adam is torch.optim.Adam bit for bit: same parameters, same state, checkpoints either way."""

from __future__ import annotations

import pytest
import torch

from fedrecgel_secure.federation.server import Adam


def params(dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(shape, generator=g, dtype=dtype)) for shape in [(7, 5), (5,), (3, 2, 4)]]


def grads(ps, step):
    g = torch.Generator().manual_seed(1000 + step)
    return [torch.randn(p.shape, generator=g, dtype=p.dtype) * 10 ** (step % 4 - 2) for p in ps]


def torch_steps(opt, ps, steps, start=0):
    for t in range(start, start + steps):
        for p, g in zip(ps, grads(ps, t)):
            p.grad = g
        opt.step()


def ours_steps(opt, ps, steps, start=0):
    for t in range(start, start + steps):
        opt.step(grads(ps, t))


def same_state(a: dict, b: dict) -> None:
    assert a["param_groups"] == b["param_groups"]
    assert a["state"].keys() == b["state"].keys()
    for i in a["state"]:
        for key in ("step", "exp_avg", "exp_avg_sq"):
            x, y = a["state"][i][key], b["state"][i][key]
            assert x.dtype == y.dtype and torch.equal(x, y), (i, key)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_server_adam_equals_torch_adam_bit_for_bit(dtype):
    ref, ours = params(dtype), params(dtype)
    torch_opt = torch.optim.Adam(ref, lr=0.003, foreach=False)
    our_opt = Adam(ours, lr=0.003)
    torch_steps(torch_opt, ref, 25)
    ours_steps(our_opt, ours, 25)
    for a, b in zip(ref, ours):
        assert torch.equal(a, b)
    same_state(torch_opt.state_dict(), our_opt.state_dict())


def test_a_checkpoint_moves_between_torch_adam_and_the_server_adam():
    ref, ours = params(torch.float32), params(torch.float32)
    torch_opt = torch.optim.Adam(ref, lr=0.01, foreach=False)
    torch_steps(torch_opt, ref, 4)
    for a, b in zip(ref, ours):
        b.data.copy_(a.data)
    our_opt = Adam(ours, lr=0.5)  # the state's lr wins, as in torch
    our_opt.load_state_dict(torch_opt.state_dict())
    torch_steps(torch_opt, ref, 6, start=4)
    ours_steps(our_opt, ours, 6, start=4)
    for a, b in zip(ref, ours):
        assert torch.equal(a, b)
    back = torch.optim.Adam(params(torch.float32, seed=1), lr=0.5, foreach=False)
    back.load_state_dict(our_opt.state_dict())
    same_state(back.state_dict(), torch_opt.state_dict())


def test_a_state_for_other_parameters_is_refused():
    opt = Adam(params(torch.float32), lr=0.1)
    other = torch.optim.Adam([torch.nn.Parameter(torch.zeros(2))], lr=0.1)
    with pytest.raises(ValueError, match="1 parameters, not 3"):
        opt.load_state_dict(other.state_dict())


def test_the_servers_sgd_is_torchs_plain_sgd_bit_for_bit():
    # the server's other optimiser (federation.server_optimizer = "sgd"): torch.optim.SGD without momentum
    import torch

    from fedrecgel_secure.federation.server import SGD

    gen = torch.Generator().manual_seed(0)
    mine = [torch.randn(5, 3, generator=gen), torch.randn(4, generator=gen)]
    theirs = [p.clone().requires_grad_(True) for p in mine]
    ours, ref = SGD(mine, lr=0.3), torch.optim.SGD(theirs, lr=0.3, foreach=False)
    for _ in range(3):
        grads = [torch.randn(p.shape, generator=gen) for p in mine]
        ours.step(grads)
        for p, g in zip(theirs, grads, strict=True):
            p.grad = g.clone()
        ref.step()
    assert all(torch.equal(a, b.detach()) for a, b in zip(mine, theirs, strict=True))
    assert ours.state_dict()["param_groups"][0].keys() == ref.state_dict()["param_groups"][0].keys()
