"""Privacy-utility studies: a grid of training runs, their results, a report with plots.

A study file (TOML) names a base policy, overrides applied to every run, a grid
of dotted policy keys with the values to try, and the seeds. The runs are the
cartesian product of the grid values (in file order) times the seeds; each one
is an ordinary run directory ``DIR/runs/<setting>/seed=<s>/`` written by
:class:`~fedrecgel_secure.federation.trainer.Trainer`, so a study interrupted at
any moment continues where every run last checkpointed, and a finished run is
never trained again.

``privacy.dp.target_epsilon`` is the one grid key with a meaning beyond its
field: ``inf`` turns DP off for that setting, a finite epsilon turns it on with
that target and the same ``max_epsilon``, so a privacy-utility curve is a single
grid line.

``DIR/study.resolved.json`` lists every planned run; ``results.csv``,
``report.md`` and the plots are always rebuilt from it and the run directories
alone (:func:`rebuild_report`), so they can be regenerated without training.

The modules follow a study's life:

* :mod:`.spec`: the study file, read and checked; a grid setting as policy overrides;
* :mod:`.plan`: every run, its directory and validated policy, before any training;
* :mod:`.run`: training the runs that are not finished, in this process or a pool;
* :mod:`.results`: each run as its directory shows it now, one row per run;
* :mod:`.report`: results.csv and report.md;
* :mod:`.plots`: the figures, a single run's curves included.

Only :mod:`.run` trains, and it imports torch only in the processes that do;
the others read run directories through :mod:`fedrecgel_secure.runs.directory`.
"""

from fedrecgel_secure.study.plan import PlannedRun, StudyPlan, expand_grid, plan_study, validate_study
from fedrecgel_secure.study.report import ReportFiles, rebuild_report
from fedrecgel_secure.study.results import collect_results
from fedrecgel_secure.study.run import RunOutcome, StudyOutcome, run_study
from fedrecgel_secure.study.spec import EPSILON_KEY, StudySpec, load_study, setting_overrides

__all__ = [
    "EPSILON_KEY",
    "PlannedRun",
    "ReportFiles",
    "RunOutcome",
    "StudyOutcome",
    "StudyPlan",
    "StudySpec",
    "collect_results",
    "expand_grid",
    "load_study",
    "plan_study",
    "rebuild_report",
    "run_study",
    "setting_overrides",
    "validate_study",
]
