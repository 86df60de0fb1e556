"""A real deployment on Flower 1.42 (Message API): a SuperLink, one SuperNode per shard of users, a ServerApp.

The algorithm is the simulator's: the server runs :class:`~fedrecgel_secure.federation.trainer.Trainer`'s
round loop (:mod:`.remote` only replaces where the clients' local training and
evaluation happen), and each node runs the same engine on its own users
(:mod:`.node`). Flower is imported only by :mod:`.serverapp`, :mod:`.clientapp`
and :mod:`.stages`; the rest imports without it.
"""

from fedrecgel_secure.errors import BadInputError


def check_deployable(policy) -> None:
    """Refuse what the deployment cannot yet run faithfully.

    Masking runs as stages on the nodes (:mod:`.secagg_stages`); BFV, DP with
    masking and distributed DP need parts that do not run on the nodes yet.
    Running them on the server over plaintext uploads would look like a secure
    run while the server saw every upload, so they are refused rather than
    simulated.
    """
    secagg = policy.privacy.secure_aggregation
    dp = policy.privacy.dp
    if secagg.scheme not in ("none", "masking"):
        raise BadInputError(
            f"privacy.secure_aggregation.scheme = {secagg.scheme!r} cannot be deployed yet: its key holder does not"
            " run on a node yet; use 'masking' or 'none' (or fedrecgel train to simulate the protocol)"
        )
    if secagg.scheme == "masking":
        if dp.enabled:
            raise BadInputError(
                "privacy.dp.enabled = true with privacy.secure_aggregation.scheme = 'masking' cannot be deployed yet:"
                " clipping and noise shares do not run on the nodes yet; disable DP or use scheme = 'none'"
            )
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
    if dp.enabled and dp.mode == "distributed":
        raise BadInputError(
            "privacy.dp.mode = 'distributed' cannot be deployed yet: it needs secure aggregation on the nodes;"
            " use mode = 'central'"
        )
