"""Signature verifiers for inbound webhooks (``queuety.inbound(name, verify=...)``).

Each verifier checks that a delivery was signed by the provider with the shared secret, and
knows where the provider puts the delivery's id (what deduplicates its retries)::

    queuety.inbound("stripe", verify=queuety.verifiers.stripe(STRIPE_SECRET), start="payment")

- :func:`stripe`: ``Stripe-Signature: t=<unix time>,v1=<hex>[,v1=<hex>...]``, the HMAC-SHA256
  of ``f"{t}.{body}"``; any ``v1`` may match (Stripe sends two while a secret is rolled); the
  event id is the JSON body's ``id``.
- :func:`github`: ``X-Hub-Signature-256: sha256=<hex>`` of the body; the delivery id is the
  ``X-GitHub-Delivery`` header.
- :func:`hmac`: any provider that sends the HMAC-SHA256 hex of the body in one header, with an
  optional timestamp header (then the signed message is ``f"{timestamp}.{body}"``).

Pure Python: no Django. Every comparison of a digest is constant-time
(:func:`hmac.compare_digest`), so timing tells an attacker nothing about the expected value.
"""

from __future__ import annotations

import hashlib
import hmac as _hmac
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from queuety.exceptions import InvalidSignature

#: A secret, or a function returning it (read at each delivery, so a rotated secret in the
#: environment or the settings is picked up without a restart).
Secret = str | bytes | Callable[[], str | bytes]

DEFAULT_TOLERANCE = 300.0

#: A timestamp header's value: whole seconds since the epoch, ASCII digits only. Twelve digits
#: reach the year 33658; a longer number would overflow the clock arithmetic.
_STAMP = re.compile(r"[0-9]{1,12}")


class SecretUnavailable(ValueError):
    """A hook's secret function returned no usable secret: the site is misconfigured."""


def _lower(headers: Mapping[str, str]) -> dict[str, str]:
    return {str(key).lower(): str(value) for key, value in headers.items()}


def _digest(secret: Secret, message: bytes) -> bytes:
    value = secret() if callable(secret) else secret
    if not isinstance(value, str | bytes) or not value:
        # An empty key would make every signature computable by anyone: refuse to verify.
        raise SecretUnavailable(
            "The hook's secret function returned "
            f"{'an empty secret' if isinstance(value, str | bytes) else type(value).__name__}"
            "; it must return the provider's signing secret (a non-empty string or bytes). "
            "Check the setting or environment variable it reads.")
    key = value.encode() if isinstance(value, str) else value
    return _hmac.new(key, message, hashlib.sha256).hexdigest().encode("ascii")


def _matches(expected: bytes, candidate: str) -> bool:
    """Constant-time comparison of a digest with a header's text, whatever that text holds
    (``compare_digest`` refuses a non-ASCII ``str``; as bytes it simply differs)."""
    return _hmac.compare_digest(expected, candidate.strip().encode("utf-8", "replace"))


def _check_secret(verifier: str, secret: Secret) -> None:
    if not callable(secret) and not (isinstance(secret, str | bytes) and secret):
        raise ValueError(f"queuety.verifiers.{verifier}() needs the provider's signing secret "
                         "(a non-empty string, bytes, or a function returning one); got "
                         f"{type(secret).__name__}.")


def _check_tolerance(verifier: str, tolerance: float) -> None:
    if isinstance(tolerance, bool) or not isinstance(tolerance, int | float) \
            or not 0 < tolerance < 86400 * 366:
        raise ValueError(f"queuety.verifiers.{verifier}(tolerance=...) must be a positive number "
                         f"of seconds under a year (got {tolerance!r:.40}); the providers' own "
                         "libraries use 300.")


def _check_time(header: str, raw: str, tolerance: float, now: float | None) -> str:
    """``raw`` as a whole number of seconds within ``tolerance`` of now, or raise."""
    if not _STAMP.fullmatch(raw.strip()):
        raise InvalidSignature(f"The {header} timestamp {raw[:40]!r} is not a whole number of "
                               "seconds since the epoch.")
    stamp = int(raw.strip())
    current = time.time() if now is None else now
    if abs(current - stamp) > tolerance:
        raise InvalidSignature(
            f"The {header} timestamp {stamp} is {abs(current - stamp):.0f} s from this "
            f"server's clock, beyond the tolerance of {tolerance:.0f} s: the delivery is "
            "replayed or a clock is wrong (check NTP on this server).")
    return str(stamp)


@dataclass(frozen=True)
class Verifier:
    """Base of the verifiers: :meth:`verify` raises :class:`InvalidSignature` or returns."""

    #: Headers that carry the signature: never stored with a delivery.
    signature_headers: tuple[str, ...] = ()

    def verify(self, headers: Mapping[str, str], body: bytes,
               now: float | None = None) -> None:
        """Check the signature of ``body`` in ``headers``.

        Raises:
            InvalidSignature: it is missing, malformed, does not match or is too old.
        """
        raise NotImplementedError

    def event_id(self, headers: Mapping[str, str], event: Any) -> str | None:
        """The provider's id of this delivery (what its retries share), or None."""
        return None


@dataclass(frozen=True)
class StripeVerifier(Verifier):
    """Stripe's scheme (see :func:`stripe`)."""

    secret: Secret = ""
    tolerance: float = DEFAULT_TOLERANCE
    signature_headers: tuple[str, ...] = ("stripe-signature",)

    def verify(self, headers: Mapping[str, str], body: bytes,
               now: float | None = None) -> None:
        raw = _lower(headers).get("stripe-signature")
        if not raw:
            raise InvalidSignature("The delivery has no Stripe-Signature header.")
        stamps, signatures = [], []
        for item in raw.split(","):
            key, sep, value = item.strip().partition("=")
            if not sep:
                raise InvalidSignature(f"The Stripe-Signature header is malformed: {item[:40]!r}"
                                       " is not a key=value pair.")
            if key == "t":
                stamps.append(value)
            elif key == "v1":
                signatures.append(value)
        if len(stamps) != 1 or not signatures:
            raise InvalidSignature("The Stripe-Signature header needs one t=<timestamp> and at "
                                   "least one v1=<signature>.")
        stamp = _check_time("Stripe-Signature", stamps[0], self.tolerance, now)
        expected = _digest(self.secret, stamp.encode() + b"." + body)
        # Every candidate is compared, matched or not, so the time taken does not say which.
        matched = [_matches(expected, candidate) for candidate in signatures]
        if not any(matched):
            raise InvalidSignature("No v1 signature in the Stripe-Signature header matches this "
                                   "body and the hook's secret (is it the endpoint's signing "
                                   "secret, whsec_...?).")

    def event_id(self, headers: Mapping[str, str], event: Any) -> str | None:
        found = event.get("id") if isinstance(event, dict) else None
        return found if isinstance(found, str) and found else None


@dataclass(frozen=True)
class GitHubVerifier(Verifier):
    """GitHub's scheme (see :func:`github`)."""

    secret: Secret = ""
    signature_headers: tuple[str, ...] = ("x-hub-signature-256", "x-hub-signature")

    def verify(self, headers: Mapping[str, str], body: bytes,
               now: float | None = None) -> None:
        raw = _lower(headers).get("x-hub-signature-256")
        if not raw:
            raise InvalidSignature("The delivery has no X-Hub-Signature-256 header (GitHub "
                                   "sends it when the webhook has a secret).")
        scheme, sep, signature = raw.strip().partition("=")
        if not sep or scheme != "sha256":
            raise InvalidSignature("The X-Hub-Signature-256 header is malformed: it must read "
                                   "sha256=<hex digest>.")
        if not _matches(_digest(self.secret, body), signature):
            raise InvalidSignature("The X-Hub-Signature-256 signature does not match this body "
                                   "and the hook's secret.")

    def event_id(self, headers: Mapping[str, str], event: Any) -> str | None:
        return _lower(headers).get("x-github-delivery") or None


@dataclass(frozen=True)
class HmacVerifier(Verifier):
    """A generic HMAC-SHA256 scheme (see :func:`hmac`)."""

    secret: Secret = ""
    header: str = "X-Signature"
    scheme: str = ""
    timestamp_header: str | None = None
    tolerance: float = DEFAULT_TOLERANCE
    id_header: str | None = None

    def verify(self, headers: Mapping[str, str], body: bytes,
               now: float | None = None) -> None:
        found = _lower(headers)
        raw = found.get(self.header.lower())
        if not raw:
            raise InvalidSignature(f"The delivery has no {self.header} header.")
        raw = raw.strip()
        if not raw.startswith(self.scheme):
            raise InvalidSignature(f"The {self.header} header is malformed: it must read "
                                   f"{self.scheme}<hex digest>.")
        message = body
        if self.timestamp_header is not None:
            stamp = found.get(self.timestamp_header.lower())
            if not stamp:
                raise InvalidSignature(f"The delivery has no {self.timestamp_header} header.")
            stamp = _check_time(self.timestamp_header, stamp, self.tolerance, now)
            message = stamp.encode() + b"." + body
        if not _matches(_digest(self.secret, message), raw[len(self.scheme):]):
            raise InvalidSignature(f"The {self.header} signature does not match this body and "
                                   "the hook's secret.")

    def event_id(self, headers: Mapping[str, str], event: Any) -> str | None:
        if self.id_header is None:
            return None
        return _lower(headers).get(self.id_header.lower()) or None


def stripe(secret: Secret, *, tolerance: float = DEFAULT_TOLERANCE) -> StripeVerifier:
    """Verify Stripe's ``Stripe-Signature`` with the endpoint's signing secret (``whsec_...``).

    A delivery whose ``t=`` is more than ``tolerance`` seconds from this server's clock (past
    or future) is refused: a captured delivery cannot be replayed later.
    """
    _check_secret("stripe", secret)
    _check_tolerance("stripe", tolerance)
    return StripeVerifier(secret=secret, tolerance=tolerance)


def github(secret: Secret) -> GitHubVerifier:
    """Verify GitHub's ``X-Hub-Signature-256`` with the webhook's secret; deliveries are
    deduplicated by ``X-GitHub-Delivery`` (the same on GitHub's "Redeliver")."""
    _check_secret("github", secret)
    return GitHubVerifier(secret=secret)


def hmac(secret: Secret, *, header: str = "X-Signature", scheme: str = "",
         timestamp_header: str | None = None, tolerance: float = DEFAULT_TOLERANCE,
         id_header: str | None = None) -> HmacVerifier:
    """Verify the HMAC-SHA256 hex digest of the raw body in ``header``.

    ``scheme`` is the text before the digest in the header (``"sha256="`` for
    ``X-Signature: sha256=<hex>``; empty for a bare digest). With ``timestamp_header``, the
    signed message is ``f"{timestamp}.{body}"`` and a timestamp more than ``tolerance``
    seconds from now is refused. ``id_header`` names the header carrying the delivery's id,
    if the provider sends one (else pass ``key=`` to ``queuety.inbound``).
    """
    _check_secret("hmac", secret)
    _check_tolerance("hmac", tolerance)
    if not header:
        raise ValueError("queuety.verifiers.hmac() needs the name of the signature header, "
                         "such as header='X-Signature'.")
    return HmacVerifier(secret=secret, header=header, scheme=scheme,
                        timestamp_header=timestamp_header, tolerance=tolerance,
                        id_header=id_header, signature_headers=(header.lower(),))
