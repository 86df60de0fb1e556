"""Imports that live as long as the process, kept out of the cyclic garbage collector's passes.

Importing torch makes hundreds of thousands of objects that last until the
process ends. While they are made, CPython's collector runs passes over the
objects allocated so far, full ones among them, and when the command is done
the interpreter's exit makes one more over all of them: together the largest
cost of ``fedrecgel train --set federation.rounds=1`` outside training after
torch's import itself (``benchmarks/cli_startup.py`` measures it).
:func:`lasting_imports` pauses the collector while a command imports, then
moves every object alive to the permanent generation (``gc.freeze``), which no
later pass visits; objects made afterwards (the run's) are collected as before.
Nothing a run writes depends on when the collector runs. The few thousand
objects of cyclic garbage that the imports leave are kept (about a megabyte).

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
