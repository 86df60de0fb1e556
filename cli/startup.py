"""Imports that live as long as the process, kept out of the cyclic garbage collector's passes.

Importing torch makes about a million objects that last until the process
ends. While they are made, CPython's collector runs full passes over every
object allocated so far, again and again, and after the last command finishes
the interpreter makes one more: about half a second of CPU of ``fedrecgel
train --set federation.rounds=1``, a quarter of what it spends outside training
(``benchmarks/cli_startup.py``). :func:`lasting_imports` pauses the collector
while a command imports, then moves every object alive to the permanent
generation (``gc.freeze``), which no later pass visits; objects made afterwards
(the run's) are collected as before. Nothing a run writes depends on when the
collector runs.

Freezing is irreversible for the objects alive at that moment, so it is done
only in a process the command owns (:func:`own_process`, called by ``main()``
and by the curves' process), never when the commands are called from Python
(tests, a notebook), whose objects would then never be collected.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

_owned = False


def own_process() -> None:
    """This process runs one ``fedrecgel`` command and ends: :func:`lasting_imports` may freeze what it imports."""
    global _owned
    _owned = True


@contextmanager
def lasting_imports() -> Iterator[None]:
    """``with lasting_imports(): import torch``: no collection while importing, and none over it afterwards, in a
    process that :func:`own_process` claimed (elsewhere: a plain import)."""
    if not (_owned and gc.isenabled()):
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.enable()
