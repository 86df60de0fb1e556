"""A message's objects, pulled again after 50 ms instead of flwr's 1 s, wherever a deployment's process pulls them.

Why: flwr 1.42 moves a message as a tree of objects, and a reader may be told of a message before all its objects
have arrived where it reads them: the SuperLink lists a node's reply to the ServerApp, and a SuperNode hands its
task to the SuperExec, while the objects are still on their way. Each reader then pulls a missing object again
after a backoff of 1 s, 2 s, 4 s (``PULL_INITIAL_BACKOFF`` = 1 and ``PULL_BACKOFF_CAP`` = 10 in
``flwr/supercore/constant.py``), so a stage with a large message (DPF's train replies, the key holder's check
request) waited seconds for objects that arrived milliseconds later.

What: in each of the three readers, flwr's own function with :data:`INITIAL_BACKOFF` and :data:`BACKOFF_CAP`, the
rest of it flwr's (its total time limit, the jitter, what it does with an object that never arrives):

* the ServerApp's grid (``flwr/superlink/grid/http_grid.py``: ``pull_objects``, a node's reply);
* the SuperNode's loop (``flwr/supernode/start_client_internal.py``: ``pull_objects``, a message from the
  SuperLink; :mod:`.launch.supernode`);
* the node's engine running a task (``flwr/supernode/runtime/run_clientapp.py``:
  ``pull_and_inflate_object_from_tree``, the message from its SuperNode; :mod:`.node.engine`), which also gives up
  after its policy's stage timeout: a message of a run stopped while its node received it never gets its objects,
  and the engine, which runs one task at a time, would wait on it for minutes while the resumed run's messages
  queued behind it (a resumed deployment lost that node).

A retry is one small request on the machine or its network: at most a few per second, only while a message is
incomplete.
"""

from __future__ import annotations

import functools
import inspect
from types import ModuleType

INITIAL_BACKOFF = 0.05  # seconds before the first retry of an object not yet stored (flwr: 1)
BACKOFF_CAP = 1.0  # the most between two retries (flwr: 10)


def shorten_object_pulls(module: ModuleType, name: str, max_time: float | None = None) -> None:
    """Make ``module.name`` (flwr's object pull, as that module imported it) retry with the short backoff, and give
    up after ``max_time`` seconds where given (flwr: 7200, or 500 tries an object); once: a second call changes
    nothing. A function without flwr 1.42's backoff parameters is refused loudly."""
    pull = getattr(module, name)
    if isinstance(pull, functools.partial):
        return
    if not {"initial_backoff", "backoff_cap", "max_time"} <= set(inspect.signature(pull).parameters):
        raise RuntimeError(f"flwr's {module.__name__}.{name} has no backoff parameters: not the flwr pinned (1.42)")
    bound = {} if max_time is None else {"max_time": max_time}
    setattr(module, name, functools.partial(pull, initial_backoff=INITIAL_BACKOFF, backoff_cap=BACKOFF_CAP, **bound))
