"""The deployment's errors: what its server, nodes and launcher raise when a deployment cannot go on.

Each is a :class:`RuntimeError`, so a caller that catches ``RuntimeError`` (the CLI, the tests) still catches them;
a caller that needs to tell them apart catches the class below. The text of each error is its message alone:
where a node's error reaches the server, only its reason class travels (:mod:`.replies`), never this text.
"""

from __future__ import annotations


class DeploymentError(RuntimeError):
    """A deployment that cannot go on: a party or a stage misused, or an answer missing."""


class SetupError(DeploymentError):
    """The secure-aggregation session could not be set up: a node that did not report its users' keys, or did not
    join, a key holder that did not answer, a key holder node without its pinned keys."""


class ConnectError(DeploymentError):
    """No node (or no key holder) connected within the wait: the ServerApp has no one to run the federation with."""


class UndeclaredField(DeploymentError):
    """A reply field a node of the policy may not send (:data:`.replies.FIELDS`): the node refuses to send it."""


class LaunchError(DeploymentError):
    """A process of the local launcher (SuperLink, SuperNode, ``flwr`` command, the run) ended before it should."""
