"""A run's ``curves.png``, drawn by a second process that imported matplotlib while the run trained.

Importing matplotlib takes about half a second of CPU, a quarter of what
``fedrecgel train --set federation.rounds=1`` spends outside training
(``benchmarks/cli_startup.py``). ``train`` starts this process before it
imports torch; on a machine with a core to spare the import then costs no wall
time, and at the end ``train`` hands the process the run directory, prints
its results while the process draws, and waits for the file. The process draws with
:func:`~fedrecgel_secure.study.plots.draw_run`, the function ``train`` would
call itself, so the file is the same; whenever the process gives no answer
(one usable core, it could not start, it died) ``train`` draws the file itself.

The process reads one run directory (a JSON string) on stdin and answers one
line on stdout, ``drawn`` or ``none`` (no round evaluated yet). It runs in a
session of its own, so a Ctrl-C meant for the run does not reach it. When
``train`` ends without asking (bad input, an error, an interrupt) it stops the
process; if ``train`` itself is killed, the process sees its stdin close and
exits without drawing anything.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from fedrecgel_secure.machine import cores

ANSWER_TIMEOUT_S = 120  # drawing takes a fraction of a second; past this the process is taken to be stuck


class CurvesProcess:
    """The drawing process of one ``train``: ``with CurvesProcess() as curves: ... curves.ask(out); ...
    plot_run(out, draw=curves.draw)`` (``ask`` is optional: it starts the drawing before ``train`` prints)."""

    def __init__(self) -> None:
        self.process: subprocess.Popen | None = None
        self.asked: Path | None = None  # the run directory the process was asked to draw
        if cores() < 2:  # nothing to overlap with: importing matplotlib twice would only cost
            return
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-m", __name__],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,  # a failure is reproduced in process, where it is reported
                text=True,
                start_new_session=True,
            )
        except OSError:
            self.process = None

    def ask(self, run_dir: Path) -> None:
        """Have the process start drawing ``RUN_DIR/curves.png`` (a finished run's) while ``train`` prints its
        results; :meth:`draw` then waits for the file."""
        if self.process is None or self.asked is not None:
            return
        try:
            self.process.stdin.write(json.dumps(str(run_dir)) + "\n")
            self.process.stdin.flush()
        except OSError:  # it died: draw() draws here
            pass
        self.asked = Path(run_dir)

    def draw(self, run_dir: Path) -> Path | None:
        """``RUN_DIR/curves.png`` drawn by the process, or here if it cannot; None if no round was evaluated."""
        from fedrecgel_secure.runs.directory import CURVES
        from fedrecgel_secure.study.plots import draw_run

        run_dir = Path(run_dir)
        self.ask(run_dir)
        if self.process is not None and self.asked == run_dir:
            process, self.process = self.process, None
            try:
                answer, _ = process.communicate(timeout=ANSWER_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                answer, _ = process.communicate()
            if process.returncode == 0 and answer.strip() in ("drawn", "none"):
                return run_dir / CURVES if answer.strip() == "drawn" else None
        self.close()  # it was asked for another directory: its answer is not about this one
        return draw_run(run_dir)

    def close(self) -> None:
        """Stop an unasked process: it has written nothing (it writes only when asked), so ``train`` need not wait
        for it to finish importing."""
        process, self.process = self.process, None
        if process is None:
            return
        process.kill()
        process.wait()
        process.stdin.close()
        process.stdout.close()

    def __enter__(self) -> CurvesProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def serve() -> None:
    """The process: import the drawing code, then draw the one run directory asked for, if any."""
    from .startup import lasting_imports, own_process

    own_process()
    with lasting_imports():
        import matplotlib.backends.backend_agg  # what savefig loads, imported ahead of the request
        import matplotlib.figure  # noqa: F401

        from fedrecgel_secure.study.plots import draw_run

    request = sys.stdin.readline()
    if not request:  # train ended without asking
        return
    drawn = draw_run(Path(json.loads(request)))
    print("none" if drawn is None else "drawn", flush=True)


if __name__ == "__main__":
    serve()
