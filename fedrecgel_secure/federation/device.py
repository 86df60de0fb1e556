"""Which torch device the simulator runs on, the determinism settings a GPU run needs, and its CPU threads.

``federation.device = "auto"`` takes a CUDA GPU when one is present and the CPU
otherwise. The CPU path is the same code as before devices existed: every
tensor the engine makes is moved with ``.to(device)``, a no-op on the CPU.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.utils.deterministic

from fedrecgel_secure.errors import BadInputError
from fedrecgel_secure.machine import cores


def resolve_device(name: str) -> torch.device:
    """The device a ``federation.device`` value names; on a GPU, with torch's deterministic algorithms on.

    Determinism: with the same seed on the same GPU two runs give identical
    metrics. cuBLAS needs a fixed workspace for that (CUBLAS_WORKSPACE_CONFIG,
    read when cuBLAS starts, so it is set before the first GPU operation);
    ``warn_only`` keeps an op that has no deterministic CUDA kernel running,
    with a warning, instead of failing the run.
    """
    if name == "cpu" or (name == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise BadInputError("federation.device: 'cuda' asked for, but torch sees no CUDA GPU; use 'auto' or 'cpu'")
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=True)
    # Deterministic mode also fills every new tensor with NaN, in case code reads memory it never wrote: an
    # extra kernel and a full write per allocation. The engine writes every tensor it allocates before reading.
    torch.utils.deterministic.fill_uninitialized_memory = False
    torch.backends.cudnn.benchmark = False
    # float32 matmuls stay float32 (no TF32): the agreement with the float64 oracle is stated for true float32.
    torch.backends.cuda.matmul.allow_tf32 = False
    return torch.device("cuda")


_share: int | None = None  # cores this process may use at most: a study's parallel run gets its share of them


def limit_threads(share: int) -> None:
    """Cap every later :func:`use_threads` of this process at ``share`` (a study's worker: cores // jobs)."""
    global _share
    _share = max(1, share)
    torch.set_num_threads(_share)


def use_threads(setting: int | str) -> int:
    """Set torch's intra-op threads from ``federation.threads`` (an int, or "auto": every core this process may
    use), at most this process's share; returns the count."""
    n = cores() if setting == "auto" else int(setting)
    n = max(1, n if _share is None else min(n, _share))
    torch.set_num_threads(n)
    return n


@contextmanager
def one_thread() -> Iterator[None]:
    """torch on one intra-op thread inside the block, its count before restored after (an exception too): for work
    too small to share, where idle pool threads only spin and contend with the machine's other work."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
