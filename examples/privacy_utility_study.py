"""Run a study file (examples/study.toml by default) end to end through the library and say where the report is.

    python examples/privacy_utility_study.py [STUDY.toml] [--out runs/study] [--jobs 2]

The same as `fedrecgel study examples/study.toml --out runs/study --jobs 2`;
`examples/audit_study.toml` adds secure aggregation and the privacy audit.
Interrupt it at any time: running it again continues the unfinished runs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fedrecgel_secure.study import rebuild_report, run_study

STUDY = Path(__file__).resolve().parent / "study.toml"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("study", nargs="?", type=Path, default=STUDY, help="study file (default: examples/study.toml)")
    parser.add_argument("--out", type=Path, default=Path("runs/study"), help="study directory")
    parser.add_argument("--jobs", type=int, default=2, help="runs trained at once, one process each")
    args = parser.parse_args()

    def progress(done, total, outcome):
        if outcome is None:
            print(f"{total} runs, {done} already finished")
        elif outcome.status == "failed":
            print(f"[{done}/{total}] FAILED {outcome.run.name}: {outcome.error}")
        else:
            print(f"[{done}/{total}] {outcome.status} {outcome.run.name} ({outcome.seconds:.0f} s)")

    outcome = run_study(args.study, args.out, jobs=args.jobs, progress=progress)
    # run_study already wrote the report; rebuilding it needs only the run directories,
    # which is how to refresh it after editing the plotting code or copying the runs elsewhere.
    files = rebuild_report(args.out)
    print(f"report: {files.report}")
    print(f"results: {files.results}")
    for plot in files.plots:
        print(f"plot: {plot}")
    if outcome.failed:
        print(f"{len(outcome.failed)} runs failed; run this again to retry them", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
