"""The server: one optimiser step (Adam, or plain SGD) on the shared parameters per round, the aggregate as gradient."""

from __future__ import annotations

import torch
from torch.nn.utils import vector_to_parameters

from fedrecgel_secure.model import NeuMF


class Adam:
    """``torch.optim.Adam(params, lr)`` (no weight decay, no amsgrad), its single-tensor update line for line.

    Why not torch's: creating any ``torch.optim.Optimizer`` imports ``torch._dynamo``
    (2 s, most of a short run's start-up; benchmarks/cli_startup.py). The update and
    :meth:`state_dict` are torch's, so checkpoints move between the two either way;
    tests/federation/test_server_adam.py checks both bit for bit against ``torch.optim.Adam(foreach=False)``.
    """

    def __init__(self, params, lr: float, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8):
        self.params = list(params)
        self.lr, self.betas, self.eps = lr, betas, eps
        self.state: dict[int, dict[str, torch.Tensor]] = {}

    @torch.no_grad()
    def step(self, grads: list[torch.Tensor]) -> None:
        beta1, beta2 = self.betas
        for i, (param, grad) in enumerate(zip(self.params, grads, strict=True)):
            state = self.state.get(i)
            if state is None:
                state = self.state[i] = {
                    "step": torch.tensor(0.0, dtype=torch.float32),
                    "exp_avg": torch.zeros_like(param, memory_format=torch.preserve_format),
                    "exp_avg_sq": torch.zeros_like(param, memory_format=torch.preserve_format),
                }
            exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
            state["step"] += 1
            exp_avg.lerp_(grad, 1 - beta1)
            exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
            step = state["step"].item()
            step_size = self.lr / (1 - beta1**step)
            denom = (exp_avg_sq.sqrt() / (1 - beta2**step) ** 0.5).add_(self.eps)
            param.addcdiv_(exp_avg, denom, value=-step_size)

    def state_dict(self) -> dict:
        """``torch.optim.Adam.state_dict()``'s layout and values."""
        group = {
            "lr": self.lr,
            "betas": self.betas,
            "eps": self.eps,
            "weight_decay": 0,
            "amsgrad": False,
            "maximize": False,
            "foreach": False,  # the single-tensor update
            "capturable": False,
            "differentiable": False,
            "fused": None,
            "decoupled_weight_decay": False,
            "params": list(range(len(self.params))),
        }
        return {"state": {i: dict(s) for i, s in self.state.items()}, "param_groups": [group]}

    def load_state_dict(self, state_dict: dict) -> None:
        """Restore a state written by :meth:`state_dict` or by ``torch.optim.Adam`` over the same parameters."""
        (group,) = state_dict["param_groups"]
        if len(group["params"]) != len(self.params):
            raise ValueError(f"optimizer state for {len(group['params'])} parameters, not {len(self.params)}")
        self.lr, self.betas, self.eps = group["lr"], tuple(group["betas"]), group["eps"]
        self.state = {
            int(i): {
                "step": s["step"].detach().to("cpu", torch.float32).clone(),
                "exp_avg": s["exp_avg"].detach().to(self.params[int(i)]).clone(),
                "exp_avg_sq": s["exp_avg_sq"].detach().to(self.params[int(i)]).clone(),
            }
            for i, s in state_dict["state"].items()
        }


class SGD:
    """``torch.optim.SGD(params, lr)`` (no momentum, no weight decay): ``param -= lr * grad``, with torch's
    ``state_dict`` layout. Under it the model is the prefix sum of the released aggregates, which is what banded
    correlated noise minimises the error of (:mod:`fedrecgel_secure.privacy.dp.matrix`)."""

    def __init__(self, params, lr: float):
        self.params, self.lr = list(params), lr

    @torch.no_grad()
    def step(self, grads: list[torch.Tensor]) -> None:
        for param, grad in zip(self.params, grads, strict=True):
            param.add_(grad, alpha=-self.lr)

    def state_dict(self) -> dict:
        group = {
            "lr": self.lr,
            "momentum": 0,
            "dampening": 0,
            "weight_decay": 0,
            "nesterov": False,
            "maximize": False,
            "foreach": False,
            "differentiable": False,
            "fused": None,
            "params": list(range(len(self.params))),
        }
        return {"state": {}, "param_groups": [group]}

    def load_state_dict(self, state_dict: dict) -> None:
        (group,) = state_dict["param_groups"]
        if len(group["params"]) != len(self.params) or "momentum" not in group:
            raise ValueError("not the state of plain SGD over these parameters")
        self.lr = group["lr"]


OPTIMIZERS = {"adam": Adam, "sgd": SGD}


class Server:
    def __init__(self, model: NeuMF, lr: float, optimizer: str = "adam"):
        self.model = model
        self.optimizer = OPTIMIZERS[optimizer](model.parameters(), lr=lr)

    def step(self, aggregate: torch.Tensor) -> None:
        """Take one optimiser step along ``aggregate``, a gradient of the full shared vector (on any device)."""
        grads = [torch.empty_like(p) for p in self.model.parameters()]
        # a protocol's sum arrives on the host: one copy to the model's device
        vector_to_parameters(aggregate.to(grads[0].device, grads[0].dtype), grads)
        self.optimizer.step(grads)
