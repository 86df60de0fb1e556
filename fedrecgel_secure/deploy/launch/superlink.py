"""The deployment's SuperLink: flwr's own ``flower-superlink``, its Control API open to the deployment's token only.

Why: flwr 1.42 serves the Control API (``flwr run``: start a run with any app) on the same HTTP port as
the Fleet API the nodes dial, and its open-source build authenticates nobody there
(``NoOpControlAuthnPlugin``: every request is the one account). Whoever reaches the port, e.g. any other
account on the machine for ``deploy local``'s 127.0.0.1, could start a run of its own app: its ServerApp
then runs under the SuperLink's SuperExec and its ClientApp inside every SuperNode, as the deployment's
user, next to the nodes' keys, secrets, embeddings and checkpoints.

What: run flwr's ``flower-superlink`` unchanged, except that the Control API's authentication plugin (flwr's
own :class:`~flwr.superlink.auth_plugin.ControlAuthnPlugin` interface) is :class:`ControlToken`: a request
is served only if its bearer token is the deployment's control token (32 random bytes, made by ``deploy
local`` for each start, 0600 in the deployment's FLWR_HOME, never on a command line). The deployment's own
``flwr`` commands send it from FLWR_HOME's credential store (:func:`store_control_token`); anyone else is
answered 401 before any handler runs. The Fleet API (the nodes) and the Runtime API (the SuperExec) are
not touched.

Usage: ``python -m fedrecgel_secure.deploy.launch.superlink --control-token-file FILE [flower-superlink arguments]``;
on the operator's machine ``... --control-token-file FILE --store-for HOST:PORT`` stores the token for ``flwr``.
"""

from __future__ import annotations

import argparse
import hmac
import importlib
import os
import secrets
import sys
from collections.abc import Sequence
from pathlib import Path

from flwr.common.constant import ACCESS_TOKEN_KEY, NOOP_ACCOUNT_NAME, NOOP_FLWR_AID, AuthnType
from flwr.supercore.auth.typing import AccountAuthCredentials, AccountAuthLoginDetails, AccountInfo
from flwr.superlink.auth_plugin import ControlAuthnPlugin

from fedrecgel_secure.deploy.launch.tls import write_private

CREDENTIALS = "credentials.yaml"  # flwr's FileCredentialStore file in FLWR_HOME
_UNUSED_REFRESH = "none"  # flwr's CLI wants a refresh token stored; ours refreshes nothing (a wrong token stays 401)


class ControlToken(ControlAuthnPlugin):
    """Control API authentication: the deployment's token as the bearer token, or nothing is served.

    The one account it admits is flwr's no-op account, so runs, federations and node registrations work as
    without authentication, for the token holder alone. There is no login and no refresh.
    """

    def __init__(self, token: str) -> None:
        if len(token) < 32:
            raise ValueError("the control token is too short")
        self._token = token.encode()

    def get_login_details(self) -> AccountAuthLoginDetails | None:
        return None  # `flwr login` has nothing to offer: the token comes with the deployment

    def validate_tokens_in_metadata(
        self, metadata: Sequence[tuple[str, str | bytes]]
    ) -> tuple[bool, AccountInfo | None]:
        for key, value in metadata:
            given = value.encode() if isinstance(value, str) else value
            if key == ACCESS_TOKEN_KEY and hmac.compare_digest(given, self._token):
                return True, AccountInfo(flwr_aid=NOOP_FLWR_AID, account_name=NOOP_ACCOUNT_NAME)
        return False, None

    def get_auth_tokens(self, device_code: str) -> AccountAuthCredentials | None:
        return None

    def refresh_tokens(
        self, metadata: Sequence[tuple[str, str | bytes]]
    ) -> tuple[Sequence[tuple[str, str | bytes]] | None, AccountInfo | None]:
        return None, None


def new_control_token(path: Path) -> None:
    """A fresh control token at ``path``, 0600 from creation, in a directory made 0700 (FLWR_HOME: the token
    and the credential store live there)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.parent.chmod(0o700)
    write_private(path, secrets.token_urlsafe(32).encode())


def store_control_token(flwr_home: Path, address: str, token_file: Path) -> None:
    """Let the ``flwr`` commands run with ``FLWR_HOME=flwr_home`` send the token to the SuperLink at ``address``.

    flwr's CLI sends the access token of its credential store's OIDC entry for that address as the bearer
    token (flwr's own store and keys; the file is written 0600).
    """
    from flwr.cli.constant import ACCESS_TOKEN_STORE_KEY, AUTHN_TYPE_STORE_KEY, REFRESH_TOKEN_STORE_KEY
    from flwr.supercore.credential_store import FileCredentialStore

    store = FileCredentialStore(flwr_home / CREDENTIALS)
    store.set(AUTHN_TYPE_STORE_KEY % address, AuthnType.OIDC.encode())
    store.set(ACCESS_TOKEN_STORE_KEY % address, token_file.read_bytes().strip())
    store.set(REFRESH_TOKEN_STORE_KEY % address, _UNUSED_REFRESH.encode())
    (flwr_home / CREDENTIALS).chmod(0o600)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m fedrecgel_secure.deploy.launch.superlink", add_help=False)
    parser.add_argument("--control-token-file", type=Path, required=True)
    parser.add_argument("--store-for", metavar="ADDRESS", help="only store the token for the flwr CLI (operator)")
    args, rest = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    if args.store_for:
        from flwr.supercore.utils import get_flwr_home

        store_control_token(get_flwr_home(), args.store_for, args.control_token_file)
        return
    token = args.control_token_file.read_text().strip()

    # the module (the package `flwr.superlink.cli` exports a function of the same name)
    flower_superlink = importlib.import_module("flwr.superlink.cli.flower_superlink")
    # the one change: flwr's CLI looks this loader up at start (its open-source build knows only NoOp and OIDC)
    flower_superlink.load_control_authn_plugin = lambda: ControlToken(token)
    # the legacy gRPC Control API would also listen (on 0.0.0.0:9093); nothing of the deployment uses it
    os.environ.pop("FLWR_INTERNAL_GRPC_CONTROL_API", None)
    sys.argv = ["flower-superlink", *rest]
    flower_superlink.flower_superlink()


if __name__ == "__main__":
    main()
