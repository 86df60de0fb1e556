"""A real deployment on Flower 1.42 (Message API): a SuperLink, one SuperNode per shard of users, a ServerApp.

The algorithm is the simulator's: the server runs :class:`~fedrecgel_secure.federation.trainer.Trainer`'s
round loop (:mod:`.remote` only replaces where the clients' local training and
evaluation happen), and each node runs the same engine on its own users
(:mod:`.node`). Flower is imported only by :mod:`.serverapp`, :mod:`.clientapp`
and :mod:`.stages`; the rest imports without it.
"""
