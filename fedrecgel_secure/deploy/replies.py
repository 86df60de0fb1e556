"""What a node sends back to the server, in one place for both sides: the train reply, the evaluation reply, and
the declaration of every field any reply may carry (:data:`FIELDS`; a scheme's own, from its row of the scheme
table, :mod:`.schemes`).

The rule (docs/privacy/threat-model.md): a node sends the server its share of a secure sum, and protocol messages
that carry no function of its users' data; nothing else. Under secure aggregation or DP a train reply carries no
loss and no example count, and a node answers no evaluation of its own (:func:`reports_in_clear`): a server that
samples one user on a node and sends it a crafted model read that user's whole training set from the summed loss,
its number of positives from the count, and which items a node's users hold out from its evaluation sums,
channels neither the secure sum nor DP touches. There the metrics ride inside the round's sum instead
(:mod:`fedrecgel_secure.federation.reports`). Where nothing protects the uploads (no secure aggregation, no DP)
the server sees every upload in the clear anyway, and the node reports its users' summed loss, examples and
metrics.
"""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase

import numpy as np

from fedrecgel_secure.deploy.errors import DeploymentError, UndeclaredField
from fedrecgel_secure.deploy.messages import ENTRY, JOINED, USER_KEY
from fedrecgel_secure.deploy.schemes import DEPLOYED
from fedrecgel_secure.privacy.secagg.errors import Reason, RejectedPayload

VECTORS = ("rows", "row_item", "row_owner", "mlp")  # the plaintext uploads, absent under secure aggregation
REPORTS = ("reports",)  # their metrics summed over them (evaluation scope "round"), in the clear only beside them
LOSS = ("bce", "examples")  # the summed loss and number of examples, only where reports_in_clear
EVALUATION = ("evaluation", "users", "sums")  # a node's HR/NDCG sums over all its users, only where reports_in_clear


def _of_schemes(part: str) -> tuple[str, ...]:
    """The field patterns the deployed schemes' rows add (:data:`.schemes.DEPLOYED`: ``shares`` or
    ``protocol_fields``), each once, in the rows' order."""
    return tuple(dict.fromkeys(p for row in DEPLOYED.values() for p in getattr(row, part)))


# Every field of every reply a node (or the key holder) sends, by what it is; ``*`` stands for a user or node id.
# What a scheme adds is declared in its row of the scheme table (:mod:`.schemes`), the rest here.
# A node refuses to send a field that is not here (:func:`check`), and tests/attacks/test_deploy_reply_fields.py
# runs each scheme and fails on any field it sees that is not declared and allowed for that policy.
FIELDS: dict[str, tuple[str, ...]] = {
    # a share of the secure sum, or (the key holder) its release: what secure aggregation and DP cover
    "secure sum": _of_schemes("shares"),
    # signed protocol messages and public keys: their contents are fixed by the protocol (fresh keys, encrypted
    # shares, signatures over what the server sent) and by the policy, not by the users' data
    "protocol": (
        f"{USER_KEY}*",  # a user's public identity key (set-up)
        ENTRY,  # a node's signature over the public keys of its keys reply (deploy/node/pinned.py)
        "signed",  # the key holder's signature over its public set-up material (deploy/node/pinned.py)
        JOINED,
        "refused",  # the key holder's refusal: a reason class
        "shard",  # hello: who the node says it is, signed over the server's nonce
        "role",
        "digest",
        "identity",
        "hello",
        *_of_schemes("protocol_fields"),
    ),
    # the users that trained: the server's own sample, echoed back (a node answers for exactly the users asked)
    "sample": ("clients",),
    # in the clear: only where no secure aggregation protects the uploads (and for the loss and the evaluation
    # sums, no DP either)
    "clear": VECTORS + REPORTS + LOSS + EVALUATION,
    # a node's acknowledgement that it wrote its users' recommendations into its own state directory: always 1
    # (deploy.node.recommendations); the lists never leave the node
    "acknowledgement": ("recommended",),
}


ACKNOWLEDGED = {"recommended": 1}

# Every reason a node's error reply may carry, and what it means. A reason is a class fixed by the message the node
# answered (and the earlier messages of the run) and by public policy, never exception text or anything computed
# from a user's data: whether a node fails, and why, must tell the server nothing it did not send. The node's own
# log keeps the details. (A user whose own computation fails, a non-finite gradient on a crafted model, does not
# fail the reply: :meth:`fedrecgel_secure.deploy.node.shard.Node.train` gives it a zero upload instead.)
REASONS: dict[str, str] = {
    "wrong_policy": "the message names another policy digest than the node's own",
    "wrong_role": "a stage this node's role does not answer (the key holder trains nothing; a node holds no keys)",
    "malformed": "a message whose fields are missing or of the wrong type",
    "bad_model": "a shared model that is not finite, not of the model's shape, or beyond deployment.max_shared_value",
    "not_a_round": "a round label outside the run (1 to federation.rounds)",
    "not_hosted": "users this node does not host",
    "round_used": "users who trained this round label already, in another set of users",
    "participation": "a user would train past the cyclic bound (privacy.dp.sampler = 'cyclic')",
    "dp_settings": "DP settings (clip norm, sample size, released counts) that disagree with the node's policy",
    "evaluation_scope": "an evaluation outside the round's sum where evaluation.scope is 'round'",
    "no_recommendations": "a recommend stage where deployment.recommend = 0",
    "failed": "anything else the node could not answer (its log says what)",
    "unreachable": "the SuperNode's relay found no node engine answering in time",
}
# and the protocol's own refusals of a payload (a signature, a key, a round: privacy.secagg.errors.Reason), which
# check what the server relayed, never a user's data
REASONS.update({str(r): f"a protocol check refused the payload ({r.name})" for r in Reason})


class Refused(DeploymentError):
    """A message the node will not answer, with its reason class (:data:`REASONS`) and, for the node's own log
    only, the details. The error reply carries the class alone (:func:`reason_of`)."""

    def __init__(self, reason: str, detail: str = ""):
        if reason not in REASONS:
            raise ValueError(f"{reason!r} is not a reason declared in deploy.replies.REASONS")
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason, self.detail = reason, detail


class NodeError(DeploymentError):
    """What the SuperNode's relay raises for an error reply: its text, which Flower sends to the server as the
    error's reason, is one of :data:`REASONS` and nothing else."""

    def __init__(self, reason: str):
        super().__init__(reason if reason in REASONS else "failed")


def reason_of(exc: BaseException) -> str:
    """The reason class an error reply carries for ``exc``: a :class:`Refused`'s own, a protocol refusal's
    :class:`~fedrecgel_secure.privacy.secagg.errors.Reason`, ``failed`` for anything else (whose text may hold
    whatever the failing code formatted into it)."""
    if isinstance(exc, Refused):
        return exc.reason
    return str(exc.reason) if isinstance(exc, RejectedPayload) else "failed"


def declared_reason(reason: str) -> bool:
    """Whether an error reply's reason, as the server receives it, is a declared class and nothing more: flwr
    formats a raised exception as ``<class '…NodeError'>:<'REASON'>``, an in-process relay ``NodeError('REASON')``."""
    import re

    found = re.fullmatch(r"<class '[\w.]+'>:<'(\w+)'>|\w+\('(\w+)'\)", reason)
    return (
        found is not None and (found.group(1) or found.group(2)) in REASONS
    )  # a node's whole reply to the recommend stage (deploy.node.recommendations)


def reports_in_clear(policy) -> bool:
    """Whether a node reports its users' summed loss, examples and evaluation sums: only where the server sees their
    uploads in the clear and no DP bounds what it learns (no secure aggregation, DP off)."""
    from fedrecgel_secure.federation.reports import protects_uploads

    return not protects_uploads(policy)


def allowed(policy) -> list[str]:
    """The field patterns a node of ``policy`` may send."""
    from fedrecgel_secure.deploy.schemes import deployed

    sealed = deployed(policy).scheme.sealed
    out = [p for kind, patterns in FIELDS.items() if kind != "clear" for p in patterns]
    out += [] if sealed else list(VECTORS + REPORTS)
    out += list(LOSS + EVALUATION) if reports_in_clear(policy) else []
    return out


def undeclared(policy, payload: dict) -> list[str]:
    """The fields of ``payload`` a node of ``policy`` may not send (empty when every field is declared and allowed)."""
    patterns = allowed(policy)
    return sorted(k for k in payload if not any(fnmatchcase(k, p) for p in patterns))


def check(policy, payload: dict) -> dict:
    """``payload``, refused (:class:`~.errors.UndeclaredField`) if it has a field a node of ``policy`` may not send."""
    bad = undeclared(policy, payload)
    if bad:
        raise UndeclaredField(f"a reply field not declared in deploy.replies.FIELDS for this policy: {bad}")
    return payload


@dataclass(frozen=True)
class TrainReply:
    """A node's answer to round R: which sampled users trained, their summed BCE and number of examples (only
    where :func:`reports_in_clear`; None otherwise) and (plaintext only) their uploads: for the ``c``-th client, the
    item rows ``rows[row_owner == c]`` at ``row_item[row_owner == c]``, its dense part ``mlp[c]`` and, under
    evaluation scope "round", the sampled users' metrics summed (``reports``: one row for the node, never one a
    user)."""

    clients: np.ndarray
    bce: float | None
    examples: int | None
    rows: np.ndarray | None = None
    row_item: np.ndarray | None = None
    row_owner: np.ndarray | None = None
    mlp: np.ndarray | None = None
    reports: np.ndarray | None = None

    def payload(self, sealed: bool = False, loss: bool = True) -> dict:
        """The message's fields; ``sealed``: without the uploads, which secure aggregation carries instead;
        ``loss``: with the summed BCE and examples (:func:`reports_in_clear`)."""
        out: dict = {"clients": np.asarray(self.clients, dtype=np.int64)}
        if loss:
            out.update(bce=float(self.bce), examples=int(self.examples))
        if not sealed:
            out.update({k: getattr(self, k) for k in VECTORS})
            if self.reports is not None:
                out["reports"] = np.asarray(self.reports, dtype=np.float64)
        return out

    @classmethod
    def of(cls, payload: dict) -> TrainReply:
        return cls(
            clients=np.asarray(payload["clients"]),
            bce=float(payload["bce"]) if "bce" in payload else None,
            examples=int(payload["examples"]) if "examples" in payload else None,
            **{k: payload.get(k) for k in VECTORS + REPORTS},
        )


@dataclass(frozen=True)
class EvaluationReply:
    """A node's evaluation: how many users it scored, and their HR/NDCG summed (``ranking_sums``)."""

    users: int
    sums: dict[str, float]

    def payload(self) -> dict:
        return {"users": int(self.users), "sums": {k: float(v) for k, v in self.sums.items()}}

    @classmethod
    def of(cls, payload: dict) -> EvaluationReply:
        return cls(users=int(payload["users"]), sums={k: float(v) for k, v in payload["sums"].items()})
