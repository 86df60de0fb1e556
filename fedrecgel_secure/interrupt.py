"""Stopping a run between rounds, so that an interruption keeps every finished round.

Inside :class:`StopBetweenRounds`, the first SIGINT (Ctrl-C), SIGTERM or SIGHUP
only asks the run to stop: the trainer finishes the round in progress, saves
its checkpoint and returns (:meth:`Trainer.run` polls :attr:`requested`). A
round is never cut in half, so the checkpoint is always a state the run
really reached. A second signal raises :class:`KeyboardInterrupt` at once, for
a user who will not wait; the last checkpoint then stays as it was.
"""

from __future__ import annotations

import signal
import threading

SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))


class StopBetweenRounds:
    def __init__(self) -> None:
        self.requested: int | None = None  # the signal that asked to stop
        self._previous: dict = {}

    def _handle(self, signum, frame) -> None:
        if self.requested is not None:
            raise KeyboardInterrupt
        self.requested = signum

    def __enter__(self) -> StopBetweenRounds:
        if threading.current_thread() is threading.main_thread():  # handlers can only be set there
            for s in SIGNALS:
                self._previous[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous.clear()
