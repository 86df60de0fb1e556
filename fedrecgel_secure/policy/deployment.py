"""[deployment]: how the roles run as separate processes on Flower (fedrecgel deploy)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from fedrecgel_secure.errors import BadInputError
from fedrecgel_secure.policy.section import Section

DEPLOY = "deployment"
IdentityKey = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
"""A node's Ed25519 identity public key, 64 lowercase hex digits (``fedrecgel deploy identity`` prints it)."""


class SuperLinkPolicy(Section):
    """[deployment.superlink]: where the Flower SuperLink listens (fedrecgel deploy)."""

    host: str = Field("127.0.0.1", description="Address the SuperLink binds and the SuperNodes dial.")
    port: int = Field(
        9091,
        ge=1,
        le=65535,
        description="flwr 1.42 serves its Fleet, Runtime (ServerApp) and Control (flwr run) APIs on this one HTTP port;"
        " the Control API has no authentication in this build, so only the nodes and the operator may reach it"
        " (firewall).",
    )


class TlsPolicy(Section):
    """[deployment.tls]: certificates of the SuperLink and node authentication."""

    enabled: bool = Field(
        False, description="Serve the SuperLink over TLS; false runs with --insecure (one trusted machine only)."
    )
    ca_cert: str | None = Field(
        None,
        description="PEM file of the CA that signed the SuperLink certificate (given to every SuperNode);"
        " with none of the three files, deploy local makes a throwaway CA and certificate for 127.0.0.1.",
    )
    server_cert: str | None = Field(None, description="PEM file of the SuperLink certificate.")
    server_key: str | None = Field(None, description="PEM file of the SuperLink private key.")
    node_authentication: bool = Field(
        False,
        description="Only SuperNodes whose public keys are registered with the SuperLink may connect"
        " (flwr supernode register); each node makes its own ECDSA P-384 key.",
    )

    @model_validator(mode="after")
    def _complete(self) -> TlsPolicy:
        files = ("ca_cert", "server_cert", "server_key")
        given = [k for k in files if getattr(self, k) is not None]
        if self.enabled and given and len(given) < len(files):  # none at all: deploy local generates them
            missing = [k for k in files if k not in given]
            raise BadInputError(
                f"{DEPLOY}.tls: {', '.join(f'{DEPLOY}.tls.{k}' for k in given)} given, so it also needs "
                + ", ".join(f"{DEPLOY}.tls.{k}" for k in missing)
                + " (or none of the three, for throwaway certificates on one machine)"
            )
        if self.node_authentication and not self.enabled:
            raise BadInputError(f"{DEPLOY}.tls.node_authentication = true needs {DEPLOY}.tls.enabled = true")
        return self

    @property
    def generated(self) -> bool:
        """TLS without certificate files: ``deploy local`` makes a throwaway CA and server certificate."""
        return self.enabled and self.ca_cert is None


class DeploymentPolicy(Section):
    """[deployment]: how the roles run as separate processes on Flower (fedrecgel deploy).

    Not part of the policy digest: the same run may resume on other addresses or machines.
    """

    nodes: int = Field(
        3, ge=1, description="Client SuperNodes; each hosts a shard of the users (data, embeddings, Adam state)."
    )
    sharding: Literal["contiguous", "round-robin"] = Field(
        "contiguous",
        description="How users are spread over the nodes: contiguous blocks of ids, or user id modulo nodes.",
    )
    key_holder_dir: str = Field(
        "nodes/keyholder",
        description='Under scheme = "bfv": the state directory of the key holder, a SuperNode of its own'
        ' (--node-config role="keyholder") that keeps the secret key; never a client node\'s.'
        " Relative paths are under the deployment directory.",
    )
    stage_timeout: float = Field(
        120.0,
        gt=0,
        description="Seconds the server waits for a stage's replies; a node that misses it is dropped for the round.",
    )
    heartbeat: float = Field(
        0.5,
        gt=0,
        description="Seconds between the server's polls for replies and connected nodes"
        " (Flower 1.42 has no flag for the SuperNode heartbeat itself: a killed SuperNode is caught by stage_timeout"
        " or the SuperLink's heartbeat check, 2 × 30 s; a dead node engine at once).",
    )
    evaluate_in_train: bool = Field(
        True,
        description="Each node evaluates round R's model for its users in round R+1's train stage, which carries"
        " exactly that model, so a round costs one stage less; only the last round (or one no train stage"
        " follows) has an evaluate stage of its own. false: every evaluated round has its own evaluate stage"
        " (the plain path; the same metrics). Only under evaluation.scope = 'all': with secure aggregation or DP"
        " the round's users report their metrics inside the round's sum, and no evaluate stage exists.",
    )
    task_handover: bool = Field(
        True,
        description="Each node's SuperExec hands the node's tasks (the Runtime API's address and the task's token)"
        " to the node's resident engine over its 0600 socket, and the engine runs them in its own process: no"
        " process starts for a message, and no task token is ever on a command line. false: flwr's way, a"
        " flwr-clientapp process for each message that relays it to the engine (a process start each stage; the"
        " token still on its stdin, never its command line).",
    )
    recommend: int = Field(
        0,
        ge=0,
        description="After the last round, each node writes its own users' top-K items (K = this) into"
        " recommendations.csv in its state directory (user and item indices, as its shard names them); the server"
        " gets an acknowledgement and nothing of the lists. 0: no lists.",
    )
    max_shared_value: float = Field(
        1e4,
        gt=0,
        description="A node refuses a shared model with any value beyond this magnitude, or not finite, before"
        " its users train on it: the item embeddings and MLP of an honest run stay within a few units, while a"
        " crafted model of huge values drives some users' gradients to infinity, and only for the items they hold.",
    )
    state_dir: str = Field(
        "nodes/{shard}",
        description="Each node's state directory ({shard} is its index);"
        " relative paths are under the deployment directory.",
    )
    superlink: SuperLinkPolicy = Field(SuperLinkPolicy(), description="The SuperLink's address and ports.")
    tls: TlsPolicy = Field(TlsPolicy(), description="TLS and node authentication.")
    node_keys: dict[str, IdentityKey] = Field(
        {},
        description='Identity keys pinned ahead of time: shard index ("0", "1", ..) or "keyholder" ->'
        " the 64-hex-digit key `fedrecgel deploy identity STATE_DIR` prints on that node's machine. The server"
        " refuses a node whose signed hello is under another key; shards not listed are pinned at first contact"
        " (nodes.json in the run directory).",
    )

    @model_validator(mode="after")
    def _key_holder_apart(self) -> DeploymentPolicy:
        # the secret key must not sit with a client node's state: that node could decrypt its neighbours' uploads
        clients = {self.state_dir.format(shard=k) for k in range(self.nodes)}
        if not self.key_holder_dir.strip() or self.key_holder_dir in clients:
            raise BadInputError(
                f"{DEPLOY}.key_holder_dir = {self.key_holder_dir!r}: must be a directory of its own,"
                f" not a client node's ({DEPLOY}.state_dir = {self.state_dir!r})"
            )
        return self

    @model_validator(mode="after")
    def _node_keys_name_nodes(self) -> DeploymentPolicy:
        known = {str(k) for k in range(self.nodes)} | {"keyholder"}
        for who in self.node_keys:
            if who not in known:
                raise BadInputError(
                    f"{DEPLOY}.node_keys.{who}: no such node; the keys are shard indices 0 .. {self.nodes - 1}"
                    ' (as strings) and "keyholder"'
                )
        return self

    def shard_users(self, n_users: int, shard: int):
        """The sorted user ids node ``shard`` hosts."""
        import numpy as np

        users = np.arange(n_users)
        if self.sharding == "round-robin":
            return users[users % self.nodes == shard]
        return users[users * self.nodes // max(1, n_users) == shard]
