"""Where webhooks may go (SSRF): the address classification and the resolver step (pure: the
resolver is a function the test plays; no network)."""

from __future__ import annotations

import socket

import pytest

from queuety.core.addresses import address_refusal, host_refusal, url_refusal
from queuety.webhooks.guard import RefusedAddress, resolve


@pytest.mark.parametrize("address, reason", [
    ("127.0.0.1", "loopback"), ("127.255.0.9", "loopback"), ("::1", "loopback"),
    ("10.0.0.8", "private"), ("172.16.3.4", "private"), ("192.168.1.1", "private"),
    ("fc00::1", "private"), ("fd12:3456::1", "private"),
    ("169.254.169.254", "link-local"), ("fe80::1", "link-local"),
    ("fe80::1%eth0", "link-local"),
    ("0.0.0.0", "unspecified"), ("::", "unspecified"),
    ("224.0.0.251", "multicast"), ("ff02::1", "multicast"),
    ("100.64.0.1", "non-public"),  # carrier-grade NAT (shared address space)
    ("::ffff:127.0.0.1", "loopback"), ("::ffff:10.1.2.3", "private"),  # IPv4-mapped
    ("::ffff:169.254.169.254", "link-local"),
    ("2002:7f00:1::1", "loopback"),  # 6to4 of 127.0.0.1
    ("fec0::1", "site-local"),  # deprecated, still routed inside some networks
])
def test_a_non_public_address__is_refused_saying_what_it_is(address, reason):
    assert reason in (address_refusal(address) or "")


@pytest.mark.parametrize("address", ["93.184.216.34", "8.8.8.8", "2606:4700:4700::1111",
                                     "::ffff:93.184.216.34"])
def test_a_public_address__passes(address):
    assert address_refusal(address) is None


@pytest.mark.parametrize("host", ["localhost", "LOCALHOST.", "api.localhost", "printer.local",
                                  "metadata.google.internal", "db.internal", "[::1]",
                                  "127.0.0.1", "2130706433", "0x7f000001", "127.1", "127.0x0.0.1",
                                  "0177.0.0.1", ""])
def test_a_local_host_as_written__is_refused(host):
    assert host_refusal(host) is not None


@pytest.mark.parametrize("host", ["hooks.example.com", "example.org", "93.184.216.34",
                                  "0x.example.com", "1password.com"])
def test_a_public_host_as_written__passes(host):
    assert host_refusal(host) is None


def test_a_refused_url__says_why_and_how_to_allow_it():
    message = url_refusal("http://169.254.169.254/latest/meta-data/")
    assert message is not None
    assert "a link-local address" in message and "WEBHOOK_ALLOW_PRIVATE" in message
    assert url_refusal("https://hooks.example.com/x") is None


def resolver(*answers: str):
    """A getaddrinfo that answers these addresses, counting its calls."""
    calls = []

    def getaddrinfo(host, port, type=0):
        calls.append(host)
        return [(socket.AF_INET6 if ":" in a else socket.AF_INET, socket.SOCK_STREAM, 6, "",
                 (a, port)) for a in answers]

    getaddrinfo.calls = calls
    return getaddrinfo


def test_resolve__checks_every_address_a_name_resolves_to():
    # One public answer and one private: a resolver may hand out either, so both are refused.
    with pytest.raises(RefusedAddress, match="resolves to 10.0.0.5, a private address"):
        resolve("hooks.example.com", 443, allow_private=False,
                resolver=resolver("93.184.216.34", "10.0.0.5"))


def test_resolve__returns_the_checked_addresses_to_connect_to():
    lookup = resolver("93.184.216.34", "2606:4700:4700::1111")
    found = resolve("hooks.example.com", 443, allow_private=False, resolver=lookup)
    assert [sockaddr[0] for _family, sockaddr in found] == ["93.184.216.34",
                                                            "2606:4700:4700::1111"]
    assert lookup.calls == ["hooks.example.com"]


def test_resolve__refuses_a_local_name_before_any_lookup():
    lookup = resolver("93.184.216.34")
    with pytest.raises(RefusedAddress, match="'localhost' is a local host name"):
        resolve("localhost", 80, allow_private=False, resolver=lookup)
    assert lookup.calls == []


def test_resolve__with_private_addresses_allowed_keeps_them():
    found = resolve("localhost", 80, allow_private=True, resolver=resolver("127.0.0.1"))
    assert found[0][1][0] == "127.0.0.1"
