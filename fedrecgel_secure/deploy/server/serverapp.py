"""The ServerApp: the simulator's round loop (:class:`RemoteTrainer`) over the connected SuperNodes.

Run config: ``policy`` (a policy file every node also has), ``out`` (the run
directory, written as by ``fedrecgel train``), ``resume`` (continue from its checkpoint),
``catalogue`` (the shards' public ``manifest.json``: the catalogue size and the number
of users). The server reads no interaction data: each node holds its own shard. With
``deployment.recommend`` a last stage has each node write its users' top-K into its own state directory
(:mod:`.recommendations`).
"""

from __future__ import annotations

from pathlib import Path

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

app = ServerApp()


def run_server(grid, policy_path: Path, out_dir: Path, resume: bool, catalogue: Path) -> dict:
    from fedrecgel_secure.data.shards import load_catalogue
    from fedrecgel_secure.deploy import private_run_dir
    from fedrecgel_secure.deploy.schemes import deployed
    from fedrecgel_secure.deploy.server.remote import RemoteTrainer
    from fedrecgel_secure.deploy.server.stages import STAGES, FlowerStages
    from fedrecgel_secure.errors import BadInputError
    from fedrecgel_secure.policy import load_policy
    from fedrecgel_secure.runs.directory import CHECKPOINT

    policy = load_policy(policy_path)
    public = load_catalogue(catalogue, policy)  # before anything starts: a wrong manifest is a clear error
    if (out_dir / CHECKPOINT).exists() and not resume:
        raise BadInputError(f"{out_dir}: already holds a run; resume it or choose another directory")
    private_run_dir(out_dir)  # 0700, its files 0600: the run's records are the server's alone
    with_key_holder = deployed(policy).scheme.key_holder
    stages = FlowerStages(
        grid, policy.deployment, policy.digest(), with_key_holder, journal=out_dir / STAGES, run_dir=out_dir
    )
    stages.connect(wait=policy.deployment.stage_timeout + (clientapp_lapse() if resume else 0.0))
    trainer = RemoteTrainer(policy, public, stages)
    if resume and (out_dir / CHECKPOINT).exists():
        trainer.resume_from(out_dir)
    result = trainer.run(out_dir)
    if policy.deployment.recommend:  # each node writes its users' lists into its own state directory
        from fedrecgel_secure.deploy.server.recommendations import ask_nodes_to_recommend

        ask_nodes_to_recommend(stages, trainer)
    return result


def clientapp_lapse() -> float:
    """How long a SuperNode may stay busy with an interrupted run's message: Flower frees it (an error reply)
    only when the message's ClientApp has missed its heartbeats, and a SuperNode handles one message at a time.
    A resumed ServerApp waits this much longer for its nodes' hellos."""
    from flwr.common.constant import HEARTBEAT_DEFAULT_INTERVAL, HEARTBEAT_PATIENCE

    return float(HEARTBEAT_PATIENCE * HEARTBEAT_DEFAULT_INTERVAL)


@app.main()
def main(grid: Grid, context: Context) -> None:
    import flwr.superlink.grid.http_grid as flwr_grid

    from fedrecgel_secure.deploy.object_pull import shorten_object_pulls

    shorten_object_pulls(flwr_grid, "pull_objects")  # a reply's objects retried after 50 ms, not flwr's 1 s

    cfg = context.run_config
    run_server(grid, Path(str(cfg["policy"])), Path(str(cfg["out"])), bool(cfg["resume"]), Path(str(cfg["catalogue"])))
