"""A real deployment on Flower 1.42 (Message API): a SuperLink, one SuperNode per shard of users, a ServerApp.

The algorithm is the simulator's: the server runs :class:`~fedrecgel_secure.federation.trainer.Trainer`'s
round loop (:mod:`.server.remote` only replaces where the clients' local training and evaluation happen),
and each node runs the same engine on its own users (:mod:`.node.shard`), in one resident engine process
per node (:mod:`.node.engine`) that the node's Flower ClientApp relays each message to
(:mod:`.node.clientapp`). The code is laid out by the role that runs it, so a machine's role names the
code it loads:

``server/``   the ServerApp and what it drives: the round loop, the stages over Flower's Grid, the protocols'
              server sides (masking's, BFV's and DPF's summers)
``node/``     a SuperNode's side: the relay, the resident engine, the handlers, the shard's users and their
              protocol roles (masking, BFV, DPF, the key holder)
``launch/``   what starts and plans the processes: ``deploy local``, ``deploy plan``, TLS files, the SuperLink
top level     what both roles read: the wire formats (:mod:`.wire`, :mod:`.replies`, and :mod:`.messages`:
              every message type, node-config key and shared format, declared once), the stage timing
              (:mod:`.timing`), the deployment's errors (:mod:`.errors`), the scheme table (:mod:`.schemes`) and
              :func:`check_deployable`; the server never imports node code, nor a node server code
              (tests/test_import_layers.py)

Flower is imported only by :mod:`.server.serverapp`, :mod:`.server.stages`, :mod:`.node.clientapp`,
:mod:`.node.handlers`, :mod:`.node.engine`, :mod:`.launch.superlink` and, when called, the record
functions of :mod:`.wire`; the rest imports without it.
"""

from fedrecgel_secure.errors import BadInputError


def check_deployable(policy) -> None:
    """Refuse what the deployment cannot yet run faithfully.

    Masking runs as stages on the nodes (:mod:`.server.masking_driver`), and under DP
    each node clips its users' uploads and draws their noise shares
    (:meth:`.shard.Node.protect`); under BFV the nodes encrypt and the key
    holder is a node of its own (:mod:`.bfv_node`), and under DPF each user
    splits its upload between the server and that key holder (:mod:`.dpf_node`).
    Running a protocol on the
    server over plaintext uploads would look like a secure run while the server
    saw every upload, so what cannot run on the nodes is refused rather than
    simulated.
    """
    from fedrecgel_secure.privacy.secagg.schemes import scheme_of

    secagg = policy.privacy.secure_aggregation
    dp = policy.privacy.dp
    if scheme_of(secagg).sealed:
        if secagg.cover != "shared":
            raise BadInputError(
                "privacy.secure_aggregation.cover = 'item_embeddings' cannot be deployed: the uncovered part would"
                " reach the server in the clear; use cover = 'shared'"
            )
        if secagg.dropout > 0:
            raise BadInputError(
                "privacy.secure_aggregation.dropout simulates dropouts; a deployment has real ones: set it to 0"
            )
        if secagg.tampered > 0:
            raise BadInputError(
                "privacy.secure_aggregation.tampered simulates altered uploads; a deployment has real ones: set it to 0"
            )
    elif dp.enabled and dp.mode == "distributed":
        raise BadInputError(
            "privacy.dp.mode = 'distributed' cannot be deployed without secure aggregation: each noise share is"
            " too small to protect an upload the server sees alone; set privacy.secure_aggregation.scheme ="
            " 'masking' or 'bfv', or use mode = 'central'"
        )
    if dp.enabled and dp.simulate_shares == "summed":
        raise BadInputError(
            "privacy.dp.simulate_shares = 'summed' is a simulation's study mode: a deployment's clients each draw"
            " their own noise share; set it to 'per_client'"
        )
    banded = dp.enabled and dp.correlation == "banded"
    if banded and scheme_of(secagg).key_holder and dp.adaptive_clipping is not None:
        raise BadInputError(
            "privacy.dp.correlation = 'banded' with adaptive clipping under privacy.secure_aggregation.scheme ="
            f" '{secagg.scheme}' cannot be deployed: the key holder rebuilds the noise of a round it never answered"
            " at the policy's constant clip norm; use a fixed clip norm"
        )
    from fedrecgel_secure.federation.reports import protects_uploads

    if policy.evaluation.scope == "all" and protects_uploads(policy):
        raise BadInputError(
            "evaluation.scope = 'all' cannot be deployed with secure aggregation or DP: a node that returns its users'"
            " metrics for whatever model it is sent tells the server which items they hold out; use 'round' (the"
            " round's users report inside the secure sum), or leave it unset"
        )


def private_run_dir(path) -> None:
    """Make ``path`` a deployment's private directory: 0700 (also if it existed, with looser bits), and every
    file and folder this process and its children create from now on 0600 / 0700 (umask 077). A deployment's
    run directory holds the policy, the logs, each round's metrics and stages, the nodes' pins and, under
    masking, the server's releases: another local account reads none of it."""
    import os
    from pathlib import Path

    os.umask(0o077)
    Path(path).mkdir(parents=True, exist_ok=True, mode=0o700)
    Path(path).chmod(0o700)
