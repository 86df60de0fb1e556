"""The deployment's SuperNode: flwr's own ``flower-supernode``, with its fixed waits shortened.

Why: flwr 1.42's SuperNode loop (``flwr/supernode/start_client_internal.py``) sleeps 3 s whenever its pull of
the SuperLink finds no message, and 0.5 s at a time while it waits for a reply (and for each of the reply's
objects) to push; none of these has a flag or an environment variable. Every stage of a round waits for its
slowest node's poll: with 4 nodes about 2.4 s of the 3 s a stage, and the reply waits up to another 0.5 s.

What: the same loop, its ``time`` module seen through :class:`Waits`, which makes those two sleeps
:data:`POLL` and :data:`REPLY_WAIT` and leaves every other call alone. The values are what a 2-core machine
sustains: an idle SuperNode then asks the SuperLink a few times a second, a request of a few milliseconds of
CPU each on either side (``benchmarks/deploy_round.py`` measures the CPU of a deployment's processes).
Everything else (its Fleet connection, TLS, node authentication, the Runtime API, its SuperExec secret) is
flwr's, unchanged; :func:`check_flwr` pins the sleeps' code and fails loudly on an flwr that changed it.

Usage: ``python -m fedrecgel_secure.deploy.launch.supernode [flower-supernode arguments]``.
"""

from __future__ import annotations

import inspect
import sys
import time

POLL = 0.25  # seconds after a pull that found no message (flwr: 3)
REPLY_WAIT = 0.05  # seconds between looks for the reply to push, and for each of its objects (flwr: 0.5)
FLWR_POLL, FLWR_REPLY_WAIT = 3, 0.5  # flwr 1.42's literals, which check_flwr finds in its source


class Waits:
    """``time`` for flwr's SuperNode loop: its idle poll and reply waits shortened, the rest of ``time`` as is."""

    def __init__(self, poll: float = POLL, reply_wait: float = REPLY_WAIT):
        self._short = {FLWR_POLL: poll, FLWR_REPLY_WAIT: reply_wait}

    def sleep(self, seconds: float) -> None:
        time.sleep(self._short.get(seconds, seconds))

    def __getattr__(self, name: str):
        return getattr(time, name)


def check_flwr(module) -> None:
    """Refuse an flwr whose SuperNode loop no longer sleeps as 1.42's does: shortening blind could change more."""
    source = inspect.getsource(module)
    for literal in (f"time.sleep({FLWR_POLL})", f"time.sleep({FLWR_REPLY_WAIT})"):
        if literal not in source:
            raise RuntimeError(f"flwr's SuperNode loop has no {literal}: this flwr is not the one pinned (1.42)")


def main(argv: list[str] | None = None) -> None:
    import flwr.supernode.start_client_internal as loop
    from flwr.supernode.cli.flower_supernode import flower_supernode

    from fedrecgel_secure.deploy.object_pull import shorten_object_pulls

    check_flwr(loop)
    loop.time = Waits()
    shorten_object_pulls(loop, "pull_objects")  # a message's objects, as they arrive from the SuperLink
    sys.argv = ["flower-supernode", *(sys.argv[1:] if argv is None else argv)]
    flower_supernode()


if __name__ == "__main__":
    main()
