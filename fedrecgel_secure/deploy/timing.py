"""Where a stage's seconds go: timestamps a node writes into its reply, which the server diffs.

One message's life, on one machine's wall clock (``time.time()``; across machines the
parts that span two clocks carry their skew):

- ``pull_wait``: the server pushed it -> the node's engine took the task (or, on flwr's
  way, ``deployment.task_handover = false``, the ``flwr-clientapp`` process started). The
  SuperNode pulls between idle sleeps (flwr 1.42's 3 s, :data:`~.launch.supernode.POLL`
  here), then its SuperExec polls for the task (``FLWR_SUPEREXEC_TASK_POLL_INTERVAL``,
  0.25 s here).
- ``process_start``: -> the engine pulled the message from the SuperNode's Runtime API
  (flwr's way: the process started -> this project's ClientApp module loaded, the
  interpreter, flwr's own imports, pulling the task and the app; that ClientApp is the
  relay to the node's resident engine, :mod:`.clientapp`, :mod:`.engine`).
- ``imports``: -> the engine began the handler (flwr's way: the relay's hand-over over
  the node's socket; before the engines: torch, the model and the protocols imported).
- ``work``: -> the engine's work done (its state, training, protecting).
- ``push_wait``: the reply made -> the server pulled it: the SuperNode's wait for the
  reply (flwr's 0.5 s, :data:`~.launch.supernode.REPLY_WAIT` here), its push, and the
  ServerApp's own pull interval (``deployment.heartbeat``).
"""

from __future__ import annotations

import os
import time

PARTS = ("pull_wait", "process_start", "imports", "work", "push_wait")


def process_started() -> float | None:
    """This process's start, wall clock (Linux ``/proc``; None elsewhere), to the kernel's clock tick."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22, after the command name
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
        return time.time() - age
    except (OSError, ValueError, AttributeError, IndexError):
        return None


def parts(sent: float, node: dict, received: float) -> dict[str, float] | None:
    """``sent``/``received``: the server's push and pull; ``node``: the reply's ``started``, ``loaded``,
    ``imported``, ``done``. Seconds per part (:data:`PARTS`), or None if the node sent no timestamps."""
    try:
        marks = [sent, node["started"], node["loaded"], node["imported"], node["done"], received]
    except (KeyError, TypeError):
        return None
    return {p: round(b - a, 3) for p, a, b in zip(PARTS, marks, marks[1:])}


def reply_parts(sent: float, reply) -> dict[str, float] | None:
    """:func:`parts` of a Flower reply pulled now (its ``timing`` record, if the node sent one)."""
    received = time.time()
    if reply.has_error() or "timing" not in reply.content:
        return None
    return parts(sent, dict(reply.content["timing"]), received)


def mean_parts(per_reply: list[dict[str, float] | None]) -> dict[str, float]:
    """Each part's mean seconds over the replies that carried timestamps ({} if none did)."""
    timed = [p for p in per_reply if p is not None]
    return {k: round(sum(p[k] for p in timed) / len(timed), 3) for k in PARTS} if timed else {}
