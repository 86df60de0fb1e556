"""Seconds per round of a deployment on FilmTrust (a SuperLink and N SuperNodes on 127.0.0.1), and where they go.

    python benchmarks/deploy_round.py [--nodes 4] [--rounds 3] [--schemes plaintext,masking,bfv,dpf]

The default policy (batched engine, 10% of the 1,227 users per round, evaluated
every round), once per secure-aggregation scheme; BFV and DPF add the key holder's
node (under DPF the server's ``check`` and ``release`` stages go to it). Per scheme
it prints the wall seconds per round as the ServerApp measured
them (``elapsed_s`` in metrics.jsonl) and the mean seconds of each stage of a
round from the run's ``stages.jsonl`` (train, the protocol's stages, evaluate),
plus the once-per-server set-up (hello, key exchange). Ends with a Markdown
table for docs/results/deploy-round.md, whose seconds per round leave out round 1 (it also
carries the set-up), with the poll floor (stages per round x the SuperNode's 3 s
pull sleep: what a round waits at worst on Flower's poll alone), and a table that
splits each stage into pull wait, process start, imports, the node's work and
push wait (:mod:`fedrecgel_secure.deploy.timing`). ``--report-only`` summarizes the runs already in ``--out``.

Each node's messages go to its resident engine (``deploy/node/engine.py``); with ``--per-message`` each scheme also
runs the plain way, Flower starting a process per message that imports torch and rebuilds the node (the
deployment before the engines), so the before/after ratio comes from one run on one machine state. Under the
engines a stage's ``process_start`` is the relay's (flwr's own process, without torch), ``imports`` the relay's
hand-over to the engine, ``work`` the engine's.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import time
from collections import defaultdict
from pathlib import Path

from fedrecgel_secure.deploy.launch.layout import resolve_policy
from fedrecgel_secure.deploy.launch.local import Deployment
from fedrecgel_secure.deploy.launch.supernode import POLL
from fedrecgel_secure.deploy.timing import PARTS

SUPERNODE_POLL = POLL  # seconds a SuperNode sleeps after a pull that found nothing (flwr 1.42: 3; ours: supernode.py)
SETTLE = 15.0  # seconds after the start-up before the idle CPU is measured
SETUP = ("hello", "secagg-keys", "secagg-join", "keyholder-start")


def stage_kind(stage: str) -> str:
    """``round-3`` -> train, ``eval-3`` -> evaluate, ``secagg-share`` -> share, ``keyholder-decrypt`` -> decrypt
    (``keyholder-check`` -> check, ``keyholder-release`` -> release: DPF's).

    Under ``deployment.evaluate_in_train`` (the default) the train stage of round R also evaluates round R-1
    (its journal line says ``evaluates``), so only the last round has an evaluate stage."""
    if re.fullmatch(r"round-\d+", stage):
        return "train"
    if re.fullmatch(r"eval-\d+", stage):
        return "evaluate"
    return stage.split("-", 1)[1]


KINDS = {  # a deployment process's kind, from its command line
    "launch.supernode": "SuperNode",
    "launch.superlink": "SuperLink",
    "launch.superexec": "SuperExec",
    "node.engine": "engine",
    "flwr-serverapp": "ServerApp",
}


def cpu_seconds(flwr_home: Path) -> dict[str, float]:
    """CPU seconds (user + system) so far of each kind of the deployment's live processes (those whose environment
    names its FLWR_HOME), from /proc."""
    needle, tick = f"\0FLWR_HOME={flwr_home}\0".encode(), os.sysconf("SC_CLK_TCK")
    spent: dict[str, float] = defaultdict(float)
    for d in Path("/proc").iterdir():
        try:
            if not d.name.isdigit() or needle not in b"\0" + (d / "environ").read_bytes() + b"\0":
                continue
            cmd = (d / "cmdline").read_bytes().decode(errors="replace")
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        kind = next((k for s, k in KINDS.items() if s in cmd), "other")
        spent[kind] += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    return dict(spent)


def run(
    label: str,
    scheme: str,
    nodes: int,
    rounds: int,
    out: Path,
    stage_timeout: float,
    resident: bool = True,
    evaluate_in_train: bool = True,
    handover: bool = True,
    idle: float = 20.0,
    extra: tuple[str, ...] = (),
) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    overrides = [
        f"federation.rounds={rounds}",
        "checkpoint.every=1",
        f"deployment.stage_timeout={stage_timeout}",
        f"deployment.evaluate_in_train={str(evaluate_in_train).lower()}",
        f"deployment.task_handover={str(handover).lower()}",
        f"privacy.secure_aggregation.scheme={'none' if scheme == 'plaintext' else scheme}",
        *extra,
    ]
    dep = Deployment(resolve_policy(out, None, overrides, nodes, False), out, resident=resident)
    start = time.perf_counter()
    try:
        dep.start()
        # what the processes cost while no run goes on: the SuperNodes' polls of the SuperLink, the SuperExecs'
        # polls of their Runtime APIs; after the start-up's own work has settled (the SuperExecs, started last,
        # import flwr for about a second of CPU each)
        time.sleep(SETTLE)
        before = cpu_seconds(dep.flwr_home)
        time.sleep(idle)
        after = cpu_seconds(dep.flwr_home)
        idle_cpu = {k: (after.get(k, 0.0) - before.get(k, 0.0)) / idle for k in after}
        dep.wait(dep.launch(False), rounds)
        run_cpu = cpu_seconds(dep.flwr_home)
    finally:
        dep.stop()
    result = summarize(label, out, rounds, time.perf_counter() - start - idle - SETTLE)
    return {**result, "idle_cpu": idle_cpu, "run_cpu": run_cpu}


def summarize(scheme: str, out: Path, rounds: int, total: float | None = None) -> dict:
    """Per-round and per-stage seconds of the run in ``out``."""
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    elapsed = [r["elapsed_s"] for r in records]
    per_round = [b - a for a, b in zip([0.0, *elapsed], elapsed)]
    stages = [json.loads(line) for line in (out / "stages.jsonl").read_text().splitlines()]
    setup = sum(s["seconds"] for s in stages if s["stage"] in SETUP)
    seconds: dict[str, float] = defaultdict(float)
    for s in stages:
        if s["stage"] not in SETUP:
            seconds[stage_kind(s["stage"])] += s["seconds"] / rounds
    dropped = sum(r.get("dropped", 0) for r in records)
    # each stage split into its parts (deploy/timing.py), mean over the rounds' stages of a kind
    parts: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for s in stages:
        if s["stage"] not in SETUP:
            for part, sec in s.get("parts", {}).items():
                parts[stage_kind(s["stage"])][part].append(sec)
    return {
        "scheme": scheme,
        "per_round": per_round,
        "stages": dict(seconds),
        "setup": setup,
        "total": total,
        "dropped": dropped,
        "parts": {k: {p: sum(v) / len(v) for p, v in ps.items()} for k, ps in parts.items()},
        # the SuperNode pulls between 3 s sleeps (flwr 1.42, no setting): a stage waits up to that for its node
        "poll_floor": stages_per_round([s["stage"] for s in stages if s["stage"] not in SETUP]) * SUPERNODE_POLL,
    }


def stages_per_round(names: list[str]) -> float:
    """A round's stages, from its train stage to the next round's: the mean over the rounds but the last, whose
    evaluation has a stage of its own when every other round's rides on the next train stage."""
    rounds: list[int] = []
    for name in names:
        if stage_kind(name) == "train" or not rounds:
            rounds.append(0)
        rounds[-1] += 1
    steady = rounds[:-1] or rounds
    return sum(steady) / max(1, len(steady))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--schemes", default="plaintext,masking,bfv,dpf")
    ap.add_argument("--stage-timeout", type=float, default=600.0, help="Generous: a benchmark must not drop nodes.")
    ap.add_argument("--out", type=Path, default=Path("/tmp/deploy-bench"))
    ap.add_argument("--report-only", action="store_true", help="Summarize the runs already in --out.")
    ap.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="A policy override for every run (repeatable), e.g. federation.fraction=1.0.",
    )
    ap.add_argument("--label", default="", help="Appended to each run's label and directory (runs with --set).")
    ap.add_argument("--idle", type=float, default=20.0, help="Seconds the idle processes' CPU is measured over.")
    ap.add_argument(
        "--per-message",
        action="store_true",
        help="Also run each scheme the plain way: no resident engines, Flower's own process per message runs the"
        " node's handlers (the path before deploy/node/engine.py), for the before/after ratio in one run.",
    )
    ap.add_argument(
        "--no-handover",
        action="store_true",
        help="Also run each scheme with deployment.task_handover = false (a flwr-clientapp process a message relays"
        " it to the engine: flwr's way), for what the handover saves in one run.",
    )
    ap.add_argument(
        "--evaluate-stage",
        action="store_true",
        help="Also run each scheme with deployment.evaluate_in_train = false (an evaluate stage every round, the"
        " plain path), for the stage it saves in one run.",
    )
    args = ap.parse_args()
    results = []
    ways = (
        [(True, True, True)]
        + [(True, True, False)] * args.no_handover
        + [(False, True, True)] * args.per_message
        + [(True, False, True)] * args.evaluate_stage
    )
    for scheme in args.schemes.split(","):
        for resident, in_train, handover in ways:
            out = args.out / (
                scheme
                + args.label
                + ("" if resident else "-per-message")
                + ("" if in_train else "-eval-stage")
                + ("" if handover else "-no-handover")
            )
            label = scheme + (f" {args.label}" if args.label else "")
            label += ("" if resident else " (per message)") + ("" if in_train else " (evaluate stage)")
            label += "" if handover else " (flwr-clientapp a message)"
            if args.report_only:
                r = summarize(label, out, args.rounds)
            else:
                r = run(
                    label,
                    scheme,
                    args.nodes,
                    args.rounds,
                    out,
                    args.stage_timeout,
                    resident,
                    in_train,
                    handover,
                    args.idle,
                    tuple(args.overrides),
                )
            results.append(r)
            _print_run(r, args.nodes)
    _print_tables(results)


def _print_run(r: dict, nodes: int) -> None:
    stages = ", ".join(f"{k} {v:.1f}" for k, v in r["stages"].items())
    wall = "" if r["total"] is None else f"; total wall {r['total']:.1f} s"
    print(
        f"{r['scheme']}: {nodes} nodes, seconds per round {', '.join(f'{s:.1f}' for s in r['per_round'])};"
        f" per stage {stages}; set-up {r['setup']:.1f} s{wall}; clients dropped {r['dropped']}",
        flush=True,
    )
    if "idle_cpu" in r:
        idle = ", ".join(f"{k} {100 * v:.1f}%" for k, v in sorted(r["idle_cpu"].items()))
        spent = ", ".join(f"{k} {v:.1f} s" for k, v in sorted(r["run_cpu"].items()))
        print(f"  idle CPU (share of one core, all of a kind together): {idle}; CPU by the run's end: {spent}")


def _print_tables(results: list[dict]) -> None:
    print()
    print("| scheme | stage | " + " | ".join(PARTS) + " |")
    print("| --- | --- | " + " | ".join("---" for _ in PARTS) + " |")
    for r in results:
        for kind, ps in r["parts"].items():
            print(f"| {r['scheme']} | {kind} | " + " | ".join(f"{ps.get(p, 0.0):.2f}" for p in PARTS) + " |")
    if any("idle_cpu" in r for r in results):
        print()
        print("| scheme | " + " | ".join(f"idle {k} (% of a core)" for k in KINDS.values()) + " |")
        print("| --- | " + " | ".join("---" for _ in KINDS) + " |")
        for r in results:
            if "idle_cpu" in r:
                cells = [f"{100 * r['idle_cpu'].get(k, 0.0):.1f}" for k in KINDS.values()]
                print(f"| {r['scheme']} | " + " | ".join(cells) + " |")
    kinds = []
    for r in results:
        kinds += [k for k in r["stages"] if k not in kinds]
    print()
    # a round's seconds after the first (which also carries the once-per-server set-up); stages: mean of all rounds
    print("| scheme | s / round | poll floor | " + " | ".join(kinds) + " | set-up (once) |")
    print("| --- | --- | --- | " + " | ".join("---" for _ in kinds) + " | --- |")
    for r in results:
        steady = r["per_round"][1:] or r["per_round"]
        mean = sum(steady) / len(steady)
        cells = [
            f"{r['stages'][k]:.1f} ({100 * r['stages'][k] / mean:.0f}%)" if k in r["stages"] else "" for k in kinds
        ]
        print(f"| {r['scheme']} | {mean:.1f} | {r['poll_floor']:.0f} | " + " | ".join(cells) + f" | {r['setup']:.1f} |")


if __name__ == "__main__":
    main()
