"""The server: one Adam step on the shared parameters per round, with the aggregate as gradient."""

from __future__ import annotations

import torch
from torch.nn.utils import vector_to_parameters

from fedrecgel_secure.model import NeuMF


class Server:
    def __init__(self, model: NeuMF, lr: float):
        self.model = model
        self.optimizer = torch.optim.Adam(model.parameters(), lr=lr)

    def step(self, aggregate: torch.Tensor) -> None:
        """Take one Adam step along ``aggregate``, a gradient of the full shared vector (on any device)."""
        grads = [torch.empty_like(p) for p in self.model.parameters()]
        # a protocol's sum arrives on the host: one copy to the model's device
        vector_to_parameters(aggregate.to(grads[0].device, grads[0].dtype), grads)
        for p, g in zip(self.model.parameters(), grads):
            p.grad = g
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
