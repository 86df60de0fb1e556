"""The default policy's FilmTrust rounds on a quiet machine and beside a second training process, by thread count.

    python benchmarks/loaded_machine.py [--rounds 10] [--out FILE]

For each ``federation.threads`` setting (1, the default, and 2, torch's own default on this 2-core machine), the
same ``--rounds`` rounds (training, aggregation and evaluation, as ``fedrecgel train`` runs them, after a warm-up
round) are timed twice: alone, then while another process trains the default policy with torch's default threads
(started before the timed rounds and stopped by its PID after them). The ratio loaded/quiet is what a shared
machine multiplies a run's time by; the first-run estimate in the README comes from this table.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from _markdown import table

from fedrecgel_secure.data.prepare import load_split
from fedrecgel_secure.federation.trainer import Trainer
from fedrecgel_secure.policy import load_policy

# the second process: the default policy, training round after round until it is stopped
COMPETITOR = """
from fedrecgel_secure.data.prepare import load_split
from fedrecgel_secure.federation.trainer import Trainer
from fedrecgel_secure.policy import load_policy
policy = load_policy(None, ["federation.threads=2", "federation.rounds=100000"])
trainer = Trainer(policy, load_split(policy.data))
print("ready", flush=True)
while True:
    trainer.train_round()
"""


def timed_rounds(threads: int, rounds: int) -> float:
    """Seconds for ``rounds`` rounds of the default policy (each trained and evaluated), after a warm-up round."""
    policy = load_policy(None, [f"federation.threads={threads}"])
    trainer = Trainer(policy, load_split(policy.data))
    trainer.train_round()
    trainer.evaluate()
    start = time.perf_counter()
    for _ in range(rounds):
        trainer.train_round()
        trainer.evaluate()
    return time.perf_counter() - start


def with_competitor(threads: int, rounds: int) -> float:
    """:func:`timed_rounds` while another process trains; that process is stopped by its PID, also on failure."""
    competitor = subprocess.Popen([sys.executable, "-c", COMPETITOR], stdout=subprocess.PIPE, text=True)
    try:
        if competitor.stdout.readline().strip() != "ready":  # its data loaded: it is training from now on
            raise RuntimeError("the competing training process did not start")
        return timed_rounds(threads, rounds)
    finally:
        os.kill(competitor.pid, signal.SIGTERM)
        competitor.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--out", type=Path, default=None, help="Also write the table to this file.")
    args = parser.parse_args()
    rows = []
    for threads in (1, 2):
        quiet = timed_rounds(threads, args.rounds)
        loaded = with_competitor(threads, args.rounds)
        rows.append([threads, f"{quiet:.1f}", f"{loaded:.1f}", f"{loaded / quiet:.1f}×"])
        print(rows[-1], flush=True)
    text = (
        f"The default policy on FilmTrust, {args.rounds} rounds (each trained and evaluated, after a warm-up round),"
        f" alone and beside a second process training the default policy with two threads"
        f" (`python benchmarks/loaded_machine.py --rounds {args.rounds}`, {time.strftime('%Y-%m-%d')},"
        f" {os.cpu_count()} cores).\n\n" + table(["federation.threads", "quiet s", "loaded s", "loaded / quiet"], rows)
    )
    print(text)
    if args.out is not None:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
