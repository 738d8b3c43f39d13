"""Stands in for ``requests.exceptions``: its ConnectionError shares the builtin's NAME only."""


class RequestException(OSError):
    pass


class ConnectionError(RequestException):  # noqa: A001 - the point of this module
    pass
