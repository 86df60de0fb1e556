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

    Secure aggregation and distributed DP need their multi-stage protocols on
    the nodes. Running them on the server over plaintext uploads would look
    like a secure run while the server saw every upload, so they are refused
    rather than simulated.
    """
    secagg = policy.privacy.secure_aggregation
    if secagg.scheme != "none":
        raise BadInputError(
            f"privacy.secure_aggregation.scheme = {secagg.scheme!r} cannot be deployed yet: the deployment sends"
            " plaintext uploads to the server; use 'none' (or fedrecgel train to simulate the protocol)"
        )
    dp = policy.privacy.dp
    if dp.enabled and dp.mode == "distributed":
        raise BadInputError(
            "privacy.dp.mode = 'distributed' cannot be deployed yet: it needs secure aggregation on the nodes;"
            " use mode = 'central'"
        )
