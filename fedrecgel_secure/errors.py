"""The one error type for input a user can fix."""


class BadInputError(ValueError):
    """A file, field or value given by the user is wrong.

    The message must name what is wrong and where: the file and the line or
    column, or the policy file and the dotted field path. The CLI prints the
    message without a traceback and exits with code 2.
    """
