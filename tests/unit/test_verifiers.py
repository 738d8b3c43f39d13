"""The inbound webhooks' signature verifiers (queuety.verifiers): pure Python, no services."""

from __future__ import annotations

import hashlib
import hmac
import json

import pytest

from queuety import verifiers
from queuety.exceptions import InvalidSignature

SECRET = "whsec_test_secret_0123456789"
BODY = json.dumps({"id": "evt_1", "type": "charge.succeeded"}).encode()
NOW = 1_800_000_000


def sign(message: bytes, secret: str = SECRET) -> str:
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def stripe_header(body: bytes = BODY, t: int = NOW, secret: str = SECRET, extra: str = "") -> dict:
    return {"Stripe-Signature": f"t={t},v1={sign(f'{t}.'.encode() + body, secret)}{extra}"}


# Stripe


def test_stripe__a_valid_signature_passes_and_the_event_id_is_the_body_id():
    verifier = verifiers.stripe(SECRET)
    verifier.verify(stripe_header(), BODY, now=NOW)
    assert verifier.event_id({}, json.loads(BODY)) == "evt_1"


def test_stripe__headers_are_case_insensitive():
    verifier = verifiers.stripe(SECRET)
    verifier.verify({"stripe-signature": stripe_header()["Stripe-Signature"]}, BODY, now=NOW)


def test_stripe__a_wrong_secret_is_refused():
    with pytest.raises(InvalidSignature, match="No v1 signature"):
        verifiers.stripe("whsec_another").verify(stripe_header(), BODY, now=NOW)


def test_stripe__a_tampered_body_is_refused():
    with pytest.raises(InvalidSignature):
        verifiers.stripe(SECRET).verify(stripe_header(), BODY + b" ", now=NOW)


@pytest.mark.parametrize("offset", [-301, 301])
def test_stripe__a_timestamp_beyond_the_tolerance_is_refused_past_or_future(offset):
    with pytest.raises(InvalidSignature, match="tolerance of 300 s"):
        verifiers.stripe(SECRET).verify(stripe_header(t=NOW + offset), BODY, now=NOW)


def test_stripe__the_tolerance_is_an_option():
    header = stripe_header(t=NOW - 600)
    verifiers.stripe(SECRET, tolerance=900).verify(header, BODY, now=NOW)


def test_stripe__any_v1_may_match_while_a_secret_is_rolled():
    header = stripe_header(extra=",v1=" + "0" * 64)
    verifiers.stripe(SECRET).verify(header, BODY, now=NOW)
    t = NOW
    old_first = {"Stripe-Signature": f"t={t},v1={'f' * 64},v1={sign(f'{t}.'.encode() + BODY)},"
                                     f"v0=ignored"}
    verifiers.stripe(SECRET).verify(old_first, BODY, now=NOW)


@pytest.mark.parametrize("header", [
    {}, {"Stripe-Signature": ""}, {"Stripe-Signature": "garbage"},
    {"Stripe-Signature": f"t={NOW}"}, {"Stripe-Signature": "v1=abc"},
    {"Stripe-Signature": f"t=soon,v1={'a' * 64}"},
    {"Stripe-Signature": f"t={NOW},t={NOW},v1={'a' * 64}"},
])
def test_stripe__malformed_headers_are_refused(header):
    with pytest.raises(InvalidSignature):
        verifiers.stripe(SECRET).verify(header, BODY, now=NOW)


def test_stripe__no_event_id_without_a_string_id():
    verifier = verifiers.stripe(SECRET)
    assert verifier.event_id({}, {"id": 7}) is None and verifier.event_id({}, [1]) is None


def test_stripe__a_callable_secret_is_read_at_each_delivery():
    current = [SECRET]
    verifier = verifiers.stripe(lambda: current[0])
    verifier.verify(stripe_header(), BODY, now=NOW)
    current[0] = "rotated"
    with pytest.raises(InvalidSignature):
        verifier.verify(stripe_header(), BODY, now=NOW)


@pytest.mark.parametrize("secret", ["", None, 5])
def test_verifiers__an_empty_or_wrong_secret_is_a_declaration_error(secret):
    for make in (verifiers.stripe, verifiers.github, verifiers.hmac):
        with pytest.raises(ValueError, match="signing secret"):
            make(secret)


# GitHub


def github_headers(body: bytes = BODY, secret: str = SECRET) -> dict:
    return {"X-Hub-Signature-256": f"sha256={sign(body, secret)}",
            "X-GitHub-Delivery": "72d3162e-cc78-11e3-81ab-4c9367dc0958",
            "X-GitHub-Event": "push"}


def test_github__a_valid_signature_passes_and_the_delivery_header_is_the_id():
    verifier = verifiers.github(SECRET)
    verifier.verify(github_headers(), BODY)
    assert verifier.event_id(github_headers(), {}) == "72d3162e-cc78-11e3-81ab-4c9367dc0958"


def test_github__a_wrong_secret_or_a_tampered_body_is_refused():
    with pytest.raises(InvalidSignature, match="does not match"):
        verifiers.github("another-secret").verify(github_headers(), BODY)
    with pytest.raises(InvalidSignature, match="does not match"):
        verifiers.github(SECRET).verify(github_headers(), BODY.replace(b"evt_1", b"evt_2"))


@pytest.mark.parametrize("value", [None, "", "abc", f"sha1={'a' * 40}", "sha256"])
def test_github__malformed_headers_are_refused(value):
    headers = {} if value is None else {"X-Hub-Signature-256": value}
    with pytest.raises(InvalidSignature):
        verifiers.github(SECRET).verify(headers, BODY)


def test_github__the_signature_headers_are_the_ones_never_stored():
    assert "x-hub-signature-256" in verifiers.github(SECRET).signature_headers


# Generic HMAC


def test_hmac__a_bare_hex_digest_of_the_body():
    verifier = verifiers.hmac(SECRET, header="X-Signature")
    verifier.verify({"x-signature": sign(BODY)}, BODY)
    with pytest.raises(InvalidSignature):
        verifier.verify({"X-Signature": sign(BODY, "wrong")}, BODY)
    with pytest.raises(InvalidSignature):
        verifier.verify({"X-Signature": sign(BODY)}, BODY + b"x")
    assert verifier.signature_headers == ("x-signature",)


def test_hmac__a_scheme_prefix_is_required_when_named():
    verifier = verifiers.hmac(SECRET, header="X-Shop-Hmac", scheme="sha256=")
    verifier.verify({"X-Shop-Hmac": f"sha256={sign(BODY)}"}, BODY)
    with pytest.raises(InvalidSignature, match="malformed"):
        verifier.verify({"X-Shop-Hmac": sign(BODY)}, BODY)


def test_hmac__with_a_timestamp_header_the_time_is_signed_and_checked():
    verifier = verifiers.hmac(SECRET, header="X-Sig", timestamp_header="X-Timestamp",
                              tolerance=60)
    good = {"X-Sig": sign(f"{NOW}.".encode() + BODY), "X-Timestamp": str(NOW)}
    verifier.verify(good, BODY, now=NOW + 59)
    with pytest.raises(InvalidSignature, match="tolerance of 60 s"):
        verifier.verify(good, BODY, now=NOW + 61)
    with pytest.raises(InvalidSignature, match="tolerance"):
        verifier.verify(good, BODY, now=NOW - 61)
    with pytest.raises(InvalidSignature, match="no X-Timestamp"):
        verifier.verify({"X-Sig": good["X-Sig"]}, BODY, now=NOW)
    with pytest.raises(InvalidSignature, match="not a whole number"):
        verifier.verify({**good, "X-Timestamp": "yesterday"}, BODY, now=NOW)
    # The body signed without the timestamp does not pass.
    with pytest.raises(InvalidSignature, match="does not match"):
        verifier.verify({**good, "X-Sig": sign(BODY)}, BODY, now=NOW)


def test_hmac__the_id_header_names_the_delivery():
    verifier = verifiers.hmac(SECRET, id_header="X-Delivery-Id")
    assert verifier.event_id({"x-delivery-id": "d-1"}, {}) == "d-1"
    assert verifiers.hmac(SECRET).event_id({"x-delivery-id": "d-1"}, {}) is None


def test_hmac__a_missing_header_is_refused():
    with pytest.raises(InvalidSignature, match="no X-Signature header"):
        verifiers.hmac(SECRET).verify({}, BODY)


@pytest.mark.parametrize("tolerance", [0, -5, float("nan"), float("inf"), True, "300"])
def test_verifiers__a_tolerance_that_is_not_a_positive_number_is_a_declaration_error(tolerance):
    with pytest.raises(ValueError, match="tolerance"):
        verifiers.stripe(SECRET, tolerance=tolerance)
    with pytest.raises(ValueError, match="tolerance"):
        verifiers.hmac(SECRET, timestamp_header="X-T", tolerance=tolerance)


@pytest.mark.parametrize("returned", ["", b"", None, 42])
def test_verifiers__a_secret_function_returning_no_secret_is_refused_not_used(returned):
    verifier = verifiers.github(lambda: returned)
    headers = {"X-Hub-Signature-256": "sha256=" + hmac.new(b"", BODY, hashlib.sha256).hexdigest()}
    with pytest.raises(verifiers.SecretUnavailable, match="secret function returned"):
        verifier.verify(headers, BODY)
