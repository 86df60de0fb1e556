"""The one error type for input a user can fix."""


class BadInputError(ValueError):
    """A file, field or value given by the user is wrong.

    The message must name what is wrong and where: the file and the line or
    column, or the policy file and the dotted field path. The CLI prints the
    message without a traceback and exits with code 2.
    """


class ProtocolStateError(RuntimeError):
    """A protocol role was used out of order, e.g. a method called before the round began.

    This is a programming error in the caller, not bad input: nothing a user or
    a peer sends can cause it, so it is not caught as :class:`BadInputError`
    and surfaces with a traceback (exit code 1).
    """
