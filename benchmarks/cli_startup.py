"""How long each command that does not train takes, and what a one-round `train` spends outside training.

    python benchmarks/cli_startup.py [--repeat 5] [--study-dir DIR] [--json] [--output FILE]

Each command runs ``--repeat`` times in a fresh interpreter (after one untimed
warm-up run, which also fills the prepared-split cache of ``data info``); the
table gives the minimum and the median wall time, and which heavy packages the
command imported (from one extra run under ``python -X importtime``). None of
these commands trains, so none should import torch, opacus or tenseal; the
target is under 0.6 s each.

``train --set federation.rounds=1`` runs ``--repeat`` times into fresh run
directories: its wall time as a process, minus the training time its
``summary.json`` records (the round and its evaluation), is the time spent
outside training (start-up, loading, checkpoint, summary, plot); the target is
at most 2 s. On a loaded machine wall times stretch, so the CPU seconds are
recorded too: those of the `train` process itself (its critical path when a
core is free: the curves are drawn by a second process, cli/curves.py, that
imports matplotlib meanwhile) and of all its processes, and the wall time of
the interpreter's exit after the last atexit handler. Where the floor lies is
shown by the parts measured alone, each in a fresh interpreter: importing
torch, and importing matplotlib and drawing a run's curves; and what keeping
torch's objects out of the garbage collector's passes saves (cli/startup.py):
the CPU seconds of a whole process that imports torch, plainly and as
``fedrecgel`` does.

The figures go to ``--output`` (JSON, default benchmarks/results/cli_startup.json).

``study report`` needs a study directory: without ``--study-dir`` a tiny one
(bundled FilmTrust, 2 settings x 1 seed x 2 rounds) is trained first, untimed.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fedrecgel_secure.policy import POLICY_DIR

TARGET_S = 0.6
TRAIN_TARGET_S = 2.0  # wall time outside training of `train --set federation.rounds=1`
OUTPUT = Path(__file__).parent / "results" / "cli_startup.json"
HEAVY = ("torch", "opacus", "tenseal", "matplotlib")
STUDY = """name = "startup benchmark"
base = "default"
overrides = ["federation.rounds=2", "privacy.dp.delta=1e-4", "privacy.dp.clip_norm=0.5"]
seeds = [1]
[grid]
"privacy.dp.target_epsilon" = [8.0, inf]
"""


def commands(study_dir: Path) -> dict[str, list[str]]:
    return {
        "--help": ["--help"],
        "policy validate": ["policy", "validate", str(POLICY_DIR / "default.toml")],
        "policy show": ["policy", "show"],
        "policy schema": ["policy", "schema"],
        "data list": ["data", "list"],
        "data info": ["data", "info", "filmtrust"],
        "study report": ["study", "report", str(study_dir)],
    }


# `python -m fedrecgel_secure.cli.main`, which also reports, on its last line, the CPU seconds of the process itself
# and when its last atexit handler ran (the interpreter's exit follows: module teardown, torch's C++ destructors)
SELF_CPU = """import atexit, resource, runpy, sys, time
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    print(f"self-cpu {r.ru_utime + r.ru_stime} {time.time()}", file=sys.stderr)
atexit.register(cpu)
sys.argv[0] = "fedrecgel"
runpy.run_module("fedrecgel_secure.cli.main", run_name="__main__", alter_sys=True)
"""


def fedrecgel(args: list[str], env: dict[str, str], *flags: str, self_cpu: bool = False) -> subprocess.CompletedProcess:
    entry = ["-c", SELF_CPU] if self_cpu else ["-m", "fedrecgel_secure.cli.main"]
    argv = [sys.executable, *flags, *entry, *args]
    result = subprocess.run(argv, capture_output=True, text=True, env=env)
    if result.returncode != 0:
        raise SystemExit(f"fedrecgel {' '.join(args)} failed ({result.returncode}):\n{result.stderr}")
    return result


def heavy_imports(args: list[str], env: dict[str, str]) -> list[str]:
    """The heavy top-level packages a command imports, from ``-X importtime`` (one line per module, name last)."""
    stderr = fedrecgel(args, env, "-X", "importtime").stderr
    lines = [line for line in stderr.splitlines() if line.startswith("import time:")]
    names = {line.rsplit("|", 1)[-1].strip().split(".")[0] for line in lines}
    return [h for h in HEAVY if h in names]


def measure(args: list[str], env: dict[str, str], repeat: int) -> dict:
    fedrecgel(args, env)  # warm-up: bytecode, page cache, prepared-split cache
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fedrecgel(args, env)
        times.append(time.perf_counter() - start)
    return {
        "min_s": round(min(times), 3),
        "median_s": round(statistics.median(times), 3),
        "heavy_imports": heavy_imports(args, env),
    }


ADAM_AB = """
import time, torch
from fedrecgel_secure.federation.server import Adam
p = [torch.nn.Parameter(torch.zeros(1))]
t = time.process_time(); Adam(p, lr=0.1); ours = time.process_time() - t
t = time.process_time(); torch.optim.Adam(p, lr=0.1); theirs = time.process_time() - t
print(ours, theirs)
"""


PARTS = """
import sys, time
from pathlib import Path
if sys.argv[1] == "torch":
    t = time.process_time()
    import torch
elif sys.argv[1] == "plot":
    t = time.process_time()
    from fedrecgel_secure.study.plots import draw_run
    draw_run(Path(sys.argv[2]))
else:  # what a one-round train times as training (summary.json's wall_time_s), in CPU seconds: no files written
    from fedrecgel_secure.data.prepare import load_split
    from fedrecgel_secure.federation.trainer import Trainer
    from fedrecgel_secure.policy import load_policy
    policy = load_policy(None, ["federation.rounds=1"])
    trainer = Trainer(policy, load_split(policy.data))
    t = time.process_time()
    trainer.run(None)
print(time.process_time() - t)
"""


def parts(env: dict[str, str], tmp: Path, repeat: int) -> dict:
    """CPU seconds, each in a fresh process (median of ``repeat``): importing torch; importing matplotlib and
    drawing a run's curves (what the curves process does; in a one-core run, train does it itself); and the
    training of a one-round run, so that the train process's CPU seconds outside training can be told."""

    def cpu(what: str) -> float:
        runs = [
            subprocess.run(
                [sys.executable, "-c", PARTS, what, str(tmp / f"train-{k}")],  # the run directories train wrote
                env=env,
                check=True,
                capture_output=True,
                text=True,
            )
            for k in range(repeat)
        ]
        return round(statistics.median(float(r.stdout) for r in runs), 3)

    return {
        "import_torch_cpu_s": cpu("torch"),
        "matplotlib_and_draw_cpu_s": cpu("plot"),
        "training_cpu_s": cpu("train"),
    }


FROZEN_IMPORT = """
from fedrecgel_secure.cli.startup import lasting_imports, own_process
own_process()
with lasting_imports():
    import torch
"""


def collector(env: dict[str, str], repeat: int) -> dict:
    """CPU seconds of a whole fresh process (its exit included) that imports torch: plainly, and as ``fedrecgel``
    imports it (cli/startup.py: no collection while importing, the objects frozen after), median of ``repeat``."""

    def process_cpu(code: str) -> float:
        runs = []
        for _ in range(repeat):
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            subprocess.run([sys.executable, "-c", code], env=env, check=True)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            runs.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
        return statistics.median(runs)

    plain, frozen = process_cpu("import torch"), process_cpu(FROZEN_IMPORT)
    return {
        "import_torch_process_cpu_s": round(plain, 3),
        "import_torch_frozen_process_cpu_s": round(frozen, 3),
        "collector_saving_ratio": round(frozen / plain, 3),
    }


def optimizer_creation(env: dict[str, str]) -> dict:
    """CPU seconds to create the server's optimizer in a fresh process: ours, then torch.optim.Adam (which imports
    torch._dynamo on its first creation: why the server does not use it)."""
    result = subprocess.run([sys.executable, "-c", ADAM_AB], capture_output=True, text=True, env=env, check=True)
    ours, theirs = map(float, result.stdout.split())
    return {"server_adam_cpu_s": round(ours, 4), "torch_optim_adam_cpu_s": round(theirs, 3)}


def measure_train(env: dict[str, str], repeat: int, tmp: Path) -> dict:
    """``train --set federation.rounds=1``: process wall time, training time (summary.json), and their difference."""
    argv = ["train", "--set", "federation.rounds=1", "--out"]
    fedrecgel([*argv, str(tmp / "train-warmup")], env)  # bytecode, page cache, prepared-split cache
    walls, trainings, cpus, self_cpus, exits = [], [], [], [], []
    for k in range(repeat):
        out = tmp / f"train-{k}"
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        result = fedrecgel([*argv, str(out)], env, self_cpu=True)
        walls.append(time.perf_counter() - start)
        ended = time.time()
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
        self_cpu, last_atexit = map(float, result.stderr.rsplit("self-cpu ", 1)[1].split()[:2])
        self_cpus.append(self_cpu)
        exits.append(ended - last_atexit)
        trainings.append(json.loads((out / "summary.json").read_text())["wall_time_s"])
    outside = [w - t for w, t in zip(walls, trainings)]
    return {
        "wall_median_s": round(statistics.median(walls), 3),
        "training_median_s": round(statistics.median(trainings), 3),
        "outside_training_median_s": round(statistics.median(outside), 3),
        "outside_training_min_s": round(min(outside), 3),
        "training_share": round(statistics.median(trainings) / statistics.median(walls), 3),
        # CPU time of all its processes (one torch thread each), and of the train process alone: on an idle
        # machine with a core for the curves process, its wall time is about the latter (plus the drawing's wait)
        "process_cpu_median_s": round(statistics.median(cpus), 3),
        "train_process_cpu_median_s": round(statistics.median(self_cpus), 3),
        # from the train process's last atexit handler to its end, as its parent saw it
        "interpreter_exit_median_s": round(statistics.median(exits), 3),
        **parts(env, tmp, repeat),
        **collector(env, repeat),
        **optimizer_creation(env),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument(
        "--study-dir", type=Path, help="a study directory for `study report` (default: train a tiny one)"
    )
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--train-only", action="store_true", help="measure `train` alone")
    parser.add_argument("--output", type=Path, default=OUTPUT, help="where the figures are written (JSON)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        # A private split cache, and one torch thread for the untimed study (the machine may be shared).
        env = {**os.environ, "FEDRECGEL_CACHE": str(Path(tmp) / "cache"), "OMP_NUM_THREADS": "1"}
        study_dir = args.study_dir
        if study_dir is None and not args.train_only:
            study_dir = Path(tmp) / "study"
            (Path(tmp) / "study.toml").write_text(STUDY)
            fedrecgel(["study", str(Path(tmp) / "study.toml"), "--out", str(study_dir)], env)
        results = {} if args.train_only else {n: measure(a, env, args.repeat) for n, a in commands(study_dir).items()}
        train = measure_train(env, args.repeat, Path(tmp))
    report = {
        "target_s": TARGET_S,
        "train_target_s": TRAIN_TARGET_S,
        "repeat": args.repeat,
        "commands": results,
        "train_one_round": train,
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg(),  # a loaded machine stretches every wall time above
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    if args.json:
        print(json.dumps(report))
        return
    if results:
        print(f"target: each under {TARGET_S} s, importing neither torch, opacus nor tenseal")
        print(f"{'command':<16} {'min s':>7} {'median s':>9}  heavy imports")
    for name, r in results.items():
        flag = "" if r["median_s"] < TARGET_S else "  over target"
        print(f"{name:<16} {r['min_s']:>7.3f} {r['median_s']:>9.3f}  {', '.join(r['heavy_imports']) or '-'}{flag}")
    flag = "" if train["outside_training_median_s"] <= TRAIN_TARGET_S else "  OVER TARGET"
    print(
        f"train --set federation.rounds=1: {train['outside_training_median_s']:.2f} s outside training"
        f" (target <= {TRAIN_TARGET_S} s){flag}: {train['wall_median_s']:.2f} s wall -"
        f" {train['training_median_s']:.2f} s training (medians of {args.repeat}; min outside"
        f" {train['outside_training_min_s']:.2f} s)"
    )
    print(
        f"  CPU {train['process_cpu_median_s']:.2f} s in all its processes, {train['train_process_cpu_median_s']:.2f} s"
        f" in the train process up to its exit; the interpreter's exit {train['interpreter_exit_median_s']:.2f} s wall"
    )
    print(
        f"alone, in a fresh process: importing torch {train['import_torch_cpu_s']:.2f} s CPU, importing matplotlib"
        f" and drawing the curves {train['matplotlib_and_draw_cpu_s']:.2f} s CPU, the training"
        f" {train['training_cpu_s']:.2f} s CPU: the train process spends"
        f" {train['train_process_cpu_median_s'] - train['training_cpu_s']:.2f} s CPU outside training"
    )
    print(
        f"a fresh process importing torch: {train['import_torch_process_cpu_s']:.2f} s CPU, its exit included;"
        f" {train['import_torch_frozen_process_cpu_s']:.2f} s as fedrecgel imports it (no collection over its"
        f" objects: x{train['collector_saving_ratio']:.2f})"
    )
    print(
        f"creating the server optimizer: {train['server_adam_cpu_s']:.4f} s CPU;"
        f" torch.optim.Adam would take {train['torch_optim_adam_cpu_s']:.2f} s"
    )
    print(f"load average {report['load_average'][0]:.1f} on {report['cpus']} CPUs")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
