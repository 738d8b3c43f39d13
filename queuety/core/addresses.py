"""Which network addresses a webhook may be sent to: public ones only, unless the site allows
private ones (``QUEUETY["WEBHOOK_ALLOW_PRIVATE"]``).

Pure: it classifies an IP address or a host name as written and does no DNS lookup. The
lookup, and the check of every address it returns, happen at delivery
(``queuety.webhooks.guard``), which then connects to the address it checked.
"""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import urlsplit

#: Host names that name this machine or its network whatever DNS says (RFC 6761, and the
#: names cloud metadata services answer to).
LOCAL_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback",
               "metadata.google.internal")
#: Suffixes of names that never leave the site's network (RFC 6761, 6762, 8375).
LOCAL_SUFFIXES = (".localhost", ".local", ".internal", ".home.arpa", ".localdomain")
#: A label resolvers read as a number (decimal, octal, hexadecimal): 127.1, 0x7f.0.0.1.
NUMERIC_LABEL = re.compile(r"0x[0-9a-f]*|[0-9]+")


def address_refusal(address: str) -> str | None:
    """Why IP ``address`` is not a public address (e.g. ``"a loopback address"``), or None
    when it is one. An IPv4 address mapped or embedded in IPv6 (``::ffff:127.0.0.1``,
    6to4, Teredo) is judged as the IPv4 address it carries.

    Raises:
        ValueError: ``address`` is not an IP address.
    """
    ip = ipaddress.ip_address(address.split("%", 1)[0])  # a zone id (fe80::1%eth0) aside
    if isinstance(ip, ipaddress.IPv6Address):
        carried = ip.ipv4_mapped or ip.sixtofour or (ip.teredo[1] if ip.teredo else None)
        if carried is not None:
            reason = address_refusal(str(carried))
            return None if reason is None else f"{reason} (carried in IPv6 {ip})"
        if ip.is_site_local:  # fec0::/10: deprecated, yet routed inside some networks
            return "a site-local address"
    checks = (("is_unspecified", "an unspecified address"), ("is_loopback", "a loopback address"),
              ("is_link_local", "a link-local address"), ("is_multicast", "a multicast address"),
              ("is_private", "a private address"), ("is_reserved", "a reserved address"))
    for attribute, reason in checks:
        if getattr(ip, attribute):
            return reason
    if not ip.is_global:  # shared address space (100.64/10) and the like
        return "a non-public address"
    return None


def host_refusal(host: str) -> str | None:
    """Why host ``host`` (a name or an IP literal, as a URL writes it) is not public, or
    None when nothing written in it says so (a name is judged again after DNS resolution,
    at delivery)."""
    name = host.strip().strip("[]").rstrip(".").lower()
    if not name:
        return "an empty host"
    try:
        return address_refusal(name)
    except ValueError:
        pass
    if name in LOCAL_NAMES or name.endswith(LOCAL_SUFFIXES):
        return "a local host name"
    if all(NUMERIC_LABEL.fullmatch(label) for label in name.split(".")):
        # 2130706433, 0x7f.1, 127.1, 127.0x0.0.1: resolvers read these as IPv4 addresses.
        return "a numeric host that resolvers read as an IPv4 address"
    return None


def url_refusal(url: str) -> str | None:
    """Why a webhook may not be sent to ``url`` as written (its host names a local or
    non-public place), as a sentence naming the fix; None when the URL alone says nothing
    against it (its name is resolved and judged again at delivery)."""
    try:
        host = urlsplit(url).hostname or ""
    except ValueError:
        return None  # not a URL at all: the URL field's own validation says so
    reason = host_refusal(host)
    if reason is None:
        return None
    return (f"The URL {url!r} points at {reason} ({host or 'no host'}); webhooks are sent "
            "to public addresses only. Use a public address, or set "
            "QUEUETY['WEBHOOK_ALLOW_PRIVATE'] = True for endpoints inside your own network.")
