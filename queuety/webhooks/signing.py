"""The webhook signature: HMAC-SHA256 over ``"{timestamp}.{body}"``, as Stripe signs.

A delivery carries the header ``Queuety-Signature: t=<unix seconds>,v1=<hex digest>``. A
receiver recomputes the digest with the endpoint's secret over the timestamp, a dot and the raw
body, compares in constant time, and rejects a timestamp older than its replay window
(:data:`DEFAULT_TOLERANCE`, five minutes): a captured request cannot be replayed later, and a
redelivery is signed afresh. Pure Python, so a receiver can copy :func:`verify`.
"""

from __future__ import annotations

import hashlib
import hmac
import time

#: The header that carries the signature.
HEADER = "Queuety-Signature"
#: Seconds a signature stays acceptable (the replay window a receiver should enforce).
DEFAULT_TOLERANCE = 300


class SignatureError(ValueError):
    """A signature header that is missing, malformed, wrong or too old."""


def sign(body: bytes, secret: str, timestamp: int | None = None) -> str:
    """Return the ``Queuety-Signature`` header value for ``body`` signed with ``secret``."""
    stamp = int(time.time()) if timestamp is None else timestamp
    return f"t={stamp},v1={_digest(body, secret, stamp)}"


def verify(body: bytes, header: str, secret: str, *, tolerance: int = DEFAULT_TOLERANCE,
           now: float | None = None) -> int:
    """Check ``header`` against ``body`` and ``secret``; return its timestamp.

    Raises:
        SignatureError: the header is malformed, its digest does not match, or its timestamp
            is more than ``tolerance`` seconds from ``now``.
    """
    parts = dict(part.split("=", 1) for part in header.split(",") if "=" in part)
    try:
        stamp = int(parts["t"])
        given = parts["v1"]
    except (KeyError, ValueError):
        raise SignatureError(f"The {HEADER} header {header!r} is not 't=<unix seconds>,"
                             "v1=<hex digest>'.") from None
    if not hmac.compare_digest(given, _digest(body, secret, stamp)):
        raise SignatureError(f"The {HEADER} digest does not match the body and the secret.")
    age = (time.time() if now is None else now) - stamp
    if abs(age) > tolerance:
        raise SignatureError(f"The {HEADER} timestamp {stamp} is {age:.0f} s away from now, "
                             f"outside the {tolerance} s replay window.")
    return stamp


def _digest(body: bytes, secret: str, stamp: int) -> str:
    return hmac.new(secret.encode(), f"{stamp}.".encode() + body, hashlib.sha256).hexdigest()
