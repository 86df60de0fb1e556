"""A node's side of Flower's Runtime API for one task: the client that answers it, and the error reply it sends.

Two parts of a node answer a ClientApp task in place of flwr's ``flwr-clientapp``: the resident engine, which
runs the task (:meth:`~fedrecgel_secure.deploy.node.engine.Engine.run_task`), and the SuperExec, which answers
for an engine that died holding it (:func:`~fedrecgel_secure.deploy.launch.superexec.answer_unreachable`). Both
reach the node's own Runtime API as ``flwr-clientapp`` would, and reply to a raised reason class as flwr's
``run_clientapp`` formats it (what :func:`~fedrecgel_secure.deploy.replies.declared_reason` reads on the server).
"""

from __future__ import annotations


def task_client(address: str, token: str, retry: bool = False):
    """A ``RuntimeHttpClient`` of the node's Runtime API at ``address`` (its loopback address, as its SuperExec
    reaches it), holding the task's ``token``; with ``retry``, flwr's simple retry on transient errors."""
    from flwr.supercore.interceptors import RuntimeTokenHttpInterceptor, RuntimeVersionHttpInterceptor
    from flwr.supercore.retry import make_simple_http_retry_invoker
    from flwr.supercore.runtime import RuntimeHttpClient

    return RuntimeHttpClient.from_server_address(
        server_address=address,
        insecure=True,
        root_certificates=None,
        interceptors=[RuntimeVersionHttpInterceptor(component_name="flwr-clientapp"),
                      RuntimeTokenHttpInterceptor(token)],
        **({"retry_invoker": make_simple_http_retry_invoker()} if retry else {}),
    )  # fmt: skip


def error_reply(exc: Exception, msg):
    """The error reply to ``msg`` for ``exc`` raised by a ClientApp, in flwr's ``run_clientapp`` format."""
    from flwr.app import Error, Message
    from flwr.common.constant import ErrorCode

    reason = str(type(exc)) + ":<'" + str(exc) + "'>"
    return Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=reason), reply_to=msg)
