"""Train, recommend, evaluate and export from Python (fedrecgel_secure.api), on the bundled FilmTrust.

    python examples/python_api.py [--out runs/api-example] [--rounds 5]

The same as `fedrecgel train --out DIR --set federation.rounds=N`, then `fedrecgel recommend DIR --user ID`,
`fedrecgel evaluate DIR` and `fedrecgel export DIR --out DIR/export`. CI runs it with one round
(tests/cli/test_api.py).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from fedrecgel_secure import api


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/api-example"), help="run directory (must be new)")
    parser.add_argument("--rounds", type=int, default=5, help="federation rounds")
    args = parser.parse_args()

    run = api.train("default", args.out, overrides=[f"federation.rounds={args.rounds}"])
    best = run.summary.best
    print(f"trained {run.dir}: best HR@10 {best['hr@10']:.4f} at round {best['round']}")

    user = "7"  # FilmTrust's own user id (the file's first column), not an index
    for rank, (item, score) in enumerate(run.recommend(user, k=5), 1):
        print(f"user {user}, #{rank}: item {item} (score {score:.4f})")

    again = api.open_run(args.out)  # a run directory opened again later, by the API or after `fedrecgel train`
    metrics = again.evaluate()
    print(f"evaluated the checkpoint again: HR@10 {metrics['hr@10']:.4f}")

    for path in again.export(args.out / "export"):
        print(f"exported {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
