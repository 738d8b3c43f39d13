"""The webhook signature scheme (pure: no server)."""

import pytest

from queuety.webhooks.signing import SignatureError, sign, verify

BODY = b'{"id":"e1","type":"run.failed"}'
SECRET = "whsec-0123456789abcdef"


def test_a_signature__verifies_with_its_secret_and_body():
    header = sign(BODY, SECRET, timestamp=1_700_000_000)
    assert header.startswith("t=1700000000,v1=")
    assert verify(BODY, header, SECRET, now=1_700_000_010) == 1_700_000_000


@pytest.mark.parametrize("body, secret", [(BODY + b" ", SECRET), (BODY, SECRET + "x")])
def test_another_body_or_secret__is_refused(body, secret):
    header = sign(BODY, SECRET, timestamp=1_700_000_000)
    with pytest.raises(SignatureError, match="does not match"):
        verify(body, header, secret, now=1_700_000_000)


def test_an_old_signature__is_outside_the_replay_window():
    header = sign(BODY, SECRET, timestamp=1_700_000_000)
    with pytest.raises(SignatureError, match="outside the 300 s replay window"):
        verify(BODY, header, SECRET, now=1_700_000_301)


@pytest.mark.parametrize("header", ["", "v1=abc", "t=soon,v1=abc"])
def test_a_malformed_header__says_what_it_should_be(header):
    with pytest.raises(SignatureError, match="is not 't=<unix seconds>,v1=<hex digest>'"):
        verify(BODY, header, SECRET)
