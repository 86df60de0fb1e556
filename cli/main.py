"""The `fedrecgel` command: one module per command group, each thin over the library.

* :mod:`.train`: ``train`` and ``evaluate``; :mod:`.recommend`: ``recommend``; :mod:`.export`: ``export``;
  :mod:`.audit`: ``audit``; :mod:`.runs`: ``runs``;
* :mod:`.policy`, :mod:`.data`, :mod:`.study`, :mod:`.deploy`: the command groups of those names;
* :mod:`.common`: the consoles, bad input as exit 2, the shared options; :mod:`.crash`: internal errors.

Exit codes: 0 success, 2 bad input (a clear message, no traceback), 1 internal error.
"""

from __future__ import annotations

import sys

import typer

from . import audit, data, deploy, export, policy, recommend, runs, study, train
from .common import err
from .crash import write_crash_log
from .startup import own_process

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    # never print locals: in a DP run they include the noise secret (main() reports internal errors instead)
    pretty_exceptions_enable=False,
    pretty_exceptions_show_locals=False,
    help="FedRecGEL federated recommendation with secure aggregation and client-level DP.",
)
app.command()(train.train)
app.command()(train.evaluate)
app.command()(recommend.recommend)
app.command()(export.export)
app.command()(audit.audit)
app.command("runs")(runs.list_runs)
app.add_typer(policy.app, name="policy")
app.add_typer(data.app, name="data")
app.add_typer(study.app, name="study")
app.add_typer(deploy.app, name="deploy")


def main() -> None:
    own_process()
    try:
        app()
    except Exception as exc:  # an internal error: a short message, the traceback in a file, no locals anywhere
        log = write_crash_log(exc)
        where = f"the full traceback is in {log}" if log else "no traceback file could be written"
        err.print(
            f"internal error: {type(exc).__name__}: {exc}\n{where}", highlight=False, markup=False, soft_wrap=True
        )
        sys.exit(1)


if __name__ == "__main__":
    sys.exit(main())
