"""Each secure-aggregation scheme's parts in a deployment, in one table that the server, the nodes and the launcher
read instead of comparing the scheme's name.

A row adds to the scheme's shared facts (:class:`~fedrecgel_secure.privacy.secagg.schemes.Scheme`: sealed uploads,
a key holder) where its server and node code live, and the fields its replies add to those every scheme sends
(:data:`.replies.FIELDS`). The code is named as ``"module:attribute"`` and imported only by
the role that runs it (``part``): the launcher and the node's relay read this table without loading torch
or a protocol, and a server never imports a node's code. :class:`Setup` is what every party of a session derives
from the policy, so the server and the nodes agree on it without sending it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from fedrecgel_secure.deploy.messages import DPF_UPLOAD
from fedrecgel_secure.privacy.secagg.fixedpoint import FixedPoint
from fedrecgel_secure.privacy.secagg.schemes import SCHEMES, Scheme, scheme_of
from fedrecgel_secure.privacy.secagg.settings import encoding, norm_bound


@dataclass(frozen=True)
class Setup:
    """What every party derives from the policy: vector length, protocol parameters, value grid, threshold."""

    dim: int
    params: Any  # MaskingParams, BFVParams or DPFParams (the scheme's :attr:`Scheme.params`)
    encoding: FixedPoint
    min_clients: int


def setup_of(policy, dim: int, table: tuple[int, int] | None = None) -> Setup:
    """The session set-up of the policy's scheme for vectors of ``dim`` values (a sealed scheme only).

    ``table``: the item table's (rows, width), whose values lead every vector; a sparse scheme's parameters carry
    it (DPF's keys address its rows), and each party takes it from what it holds itself: the server and the
    nodes from their model, the key holder from the public manifest and its policy (:func:`item_table`)."""
    settings = policy.privacy.secure_aggregation
    scheme = scheme_of(settings)
    params = scheme.params(settings)
    if scheme.sparse:
        if table is None:
            raise ValueError(f"scheme {scheme.name!r} addresses the item table's rows: its setup needs the table")
        params = dataclasses.replace(params, rows=int(table[0]), width=int(table[1]))
    if scheme.norm_check:  # every party checks against its own policy's clip norm and reported metrics
        from fedrecgel_secure.federation.reports import report_count, scope_of

        reports = report_count(policy, scope_of(policy, deployed=True))
        params = dataclasses.replace(params, norm_bound=norm_bound(policy, reports))
    return Setup(dim, params, encoding(settings), settings.min_clients)


def item_table(policy, n_items: int) -> tuple[int, int]:
    """The model's item table, (rows, width), for a catalogue of ``n_items``: one row of GMF and MLP values an
    item (:class:`~fedrecgel_secure.model.NeuMF`), for a party that holds no model (the key holder)."""
    return int(n_items), policy.model.gmf_dim + policy.model.mlp_dim


@dataclass(frozen=True)
class Deployed:
    """One scheme in a deployment. A sealed scheme names both sides of its protocol; an unsealed one names none
    (the server sums the uploads in the clear, as the simulator does).

    ``server_summer``: ``(setup, exchange, key_holder, users_of) -> summer``, the server's side, standing where the
    simulator's summer stands in the aggregation rule (:meth:`.server.remote.RemoteTrainer.make_summer`).
    ``node_role``: ``(state_dir, users, setup) -> role``, a node's users in the protocol (:mod:`.node.handlers`):
    ``keys_reply()`` (the ``keys`` set-up stage), ``join_session(request, directory)`` (``join``) and
    ``train_reply(round_idx, clients, vectors, noise_shares, sampled, request)`` (what the train reply carries in
    place of the vectors); masking's role also runs its protocol stages (``step``).
    ``key_holder_role``: where :attr:`Scheme.key_holder` is set, ``(state_dir, policy, dim, catalogue) -> role``,
    the key holder's node (:func:`.node.handlers.keyholder`): ``answer(request, noise)``, its reply to each of
    its stages; ``key_holder_state``: the files it keeps, as the plan states them.
    The launcher reads :attr:`Scheme.key_holder` (one more SuperNode, ``role=keyholder``), ``round_stages`` (to
    bound how long a run may take) and ``server_sees`` (for the line it prints on start).
    ``shares`` and ``protocol_fields``: the fields its nodes' and key holder's replies add to those every scheme
    sends, as :data:`.replies.FIELDS` declares them (``*`` a user or node id): its shares of the secure sum, and
    its protocol messages and public keys, which carry no function of the users' data.
    """

    scheme: Scheme
    server_sees: str  # what the server learns of the uploads, as the launcher states it
    round_stages: int = 0  # the protocol's stages in each round, besides train and evaluate
    server_summer: str | None = None
    node_role: str | None = None
    key_holder_role: str | None = None
    key_holder_state: tuple[str, ...] = ()
    shares: tuple[str, ...] = ()
    protocol_fields: tuple[str, ...] = ()


_ROLES = "fedrecgel_secure.deploy"
DEPLOYED = {
    "none": Deployed(SCHEMES["none"], "the server sees every upload"),
    "masking": Deployed(
        SCHEMES["masking"],
        "masking: the server sees the sum only",
        round_stages=4,  # share, masked, confirm, unmask (the adverts ride on the train stage)
        server_summer=f"{_ROLES}.server.masking_summer:NodeMaskingSum.for_deployment",
        node_role=f"{_ROLES}.node.masking_node:MaskingNode",
        shares=("group",),  # the node's users' masked inputs, summed
        # a user's signed reply to a masking stage (advert, encrypted shares, confirmation, unmasking shares), and
        # a user's refusal: a reason class (``wrong_round``, ``inconsistent``, ...)
        protocol_fields=("r:*", "x:*"),
    ),
    "bfv": Deployed(
        SCHEMES["bfv"],
        "bfv: the server sees ciphertexts and the sum only",
        round_stages=1,  # the key holder's decryption (the ciphertexts ride on the train stage)
        server_summer=f"{_ROLES}.server.bfv_summer:NodeBFVSum",
        node_role=f"{_ROLES}.node.bfv_node:BFVNode",
        key_holder_role=f"{_ROLES}.node.bfv_node:KeyHolderNode.for_node",
        key_holder_state=(
            "keyholder.key (the BFV secret key and tag master key, made on first use, 0600),",
            "session.json (the last round it released)",
        ),
        shares=("partial", "total"),  # the node's users' vectors as one ciphertext; the key holder's release
        # the node's public sealing key (its keys reply), the key holder's public context and the tag keys it
        # sealed to each node (its start reply)
        protocol_fields=("seal", "context", "sealed:*"),
    ),
    "dpf": Deployed(
        SCHEMES["dpf"],
        "dpf: the server sees one DPF key of each pair, the dense values padded, and the sum only",
        round_stages=2,  # the key holder's check and its release (the uploads ride on the train stage)
        server_summer=f"{_ROLES}.server.dpf_summer:NodeDPFSum",
        node_role=f"{_ROLES}.node.dpf_node:DPFNode",
        key_holder_role=f"{_ROLES}.node.dpf_node:DPFKeyHolderNode.for_node",
        key_holder_state=(
            "dpf-seal.key (its X25519 sealing key, made on first use, 0600),",
            "dpf-session.json (the last round it released), dpf-pending.npz (the share it checked, until released)",
        ),
        # a user's upload, its rows as DPF keys and its dense values padded, sealed to each server; the key
        # holder's share of the checked sum, plus its central noise
        shares=(f"{DPF_UPLOAD}*", "share"),
        # the key holder's public sealing key (its start reply), and its check: per user, its digest of the keys'
        # leaf proofs, or a reason class
        protocol_fields=("seal", "answer"),
    ),
}


def deployed(policy) -> Deployed:
    """The row of the policy's ``privacy.secure_aggregation.scheme``."""
    return DEPLOYED[policy.privacy.secure_aggregation.scheme]
