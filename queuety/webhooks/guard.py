"""Sending a webhook only where it may go: resolve the host, check EVERY address it resolves
to (``queuety.core.addresses``), then connect to an address that was checked.

The connection is pinned to the checked addresses: ``http.client`` is handed a socket to
one of them, while the request keeps the URL's host name in its ``Host`` header and, for
https, in TLS (SNI and the certificate check). A name that resolves to a public address for
the check and to ``127.0.0.1`` a moment later (DNS rebinding) therefore cannot reach the
site's own network: nothing resolves the name a second time. No redirect is followed (a
``3xx`` is a failed attempt), so no other address is reached either.

A proxy named by the environment (``HTTPS_PROXY``, ``HTTP_PROXY``, ``NO_PROXY``, as
``urllib`` reads them) is used as before, and pinned the same way: an https delivery tunnels
(``CONNECT``) to the checked address, an http one asks the proxy for the checked address's
URL, and both keep the host name for ``Host`` (and TLS). The host must therefore resolve on
the worker even behind a proxy: the check needs its addresses.
"""

from __future__ import annotations

import http.client
import socket
import ssl
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

from queuety.core import addresses

#: ``socket.getaddrinfo``'s shape: tests pass their own to play a resolver.
Resolver = Callable[..., Sequence[tuple[Any, ...]]]

#: Bytes of an answer's body read (and dropped) before the connection is closed.
MAX_ANSWER_BYTES = 64 * 1024


class RefusedAddress(ValueError):
    """The endpoint's host is, or resolves to, an address webhooks may not be sent to."""


def resolve(host: str, port: int, *, allow_private: bool,
            resolver: Resolver = socket.getaddrinfo) -> list[tuple[int, Any]]:
    """The ``(family, socket address)`` pairs to connect to for ``host``, every one of them
    checked unless ``allow_private``.

    Raises:
        RefusedAddress: the host as written, or ANY address it resolves to, is not public
            (one bad address refuses them all: a resolver may hand out either).
        OSError: the name does not resolve.
    """
    if not allow_private:
        reason = addresses.host_refusal(host)
        if reason is not None:
            raise RefusedAddress(f"The host {host!r} is {reason}.")
    found = [(family, sockaddr) for family, _type, _proto, _name, sockaddr
             in resolver(host, port, type=socket.SOCK_STREAM)
             if family in (socket.AF_INET, socket.AF_INET6)]
    if not found:
        raise OSError(f"The host {host!r} resolves to no IPv4 or IPv6 address.")
    if not allow_private:
        for _family, sockaddr in found:
            reason = addresses.address_refusal(str(sockaddr[0]))
            if reason is not None:
                raise RefusedAddress(f"The host {host!r} resolves to {sockaddr[0]}, "
                                     f"{reason}.")
    return found


def _connect(targets: Sequence[tuple[int, Any]], timeout: float | None) -> socket.socket:
    """A socket connected to the first of ``targets`` that accepts (as
    ``socket.create_connection`` would try them, but with no lookup of its own)."""
    failure: OSError | None = None
    for family, sockaddr in targets:
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect(sockaddr)
        except OSError as error:
            sock.close()
            failure = error
        else:
            return sock
    assert failure is not None  # resolve() returns at least one target
    raise failure


def proxy_for(scheme: str, host: str) -> tuple[str, int] | None:
    """The ``(host, port)`` of the proxy the environment names for ``scheme`` URLs to
    ``host`` (``HTTPS_PROXY``/``HTTP_PROXY``, minus ``NO_PROXY``), or None."""
    proxy = urllib.request.getproxies().get(scheme)
    if not proxy or urllib.request.proxy_bypass(host):
        return None
    parts = urlsplit(proxy if "://" in proxy else f"http://{proxy}")
    if not parts.hostname:
        return None
    return parts.hostname, parts.port or 8080


def _literal(sockaddr: Any) -> str:
    """An address as it is written in a URL's authority (IPv6 in brackets)."""
    address = str(sockaddr[0])
    return f"[{address}]" if ":" in address else address


def _tunnel(proxy: tuple[str, int], sockaddr: Any, timeout: float | None) -> socket.socket:
    """A socket through ``proxy`` to ``sockaddr`` (``CONNECT``), ready for TLS."""
    sock = socket.create_connection(proxy, timeout=timeout)
    target = f"{_literal(sockaddr)}:{sockaddr[1]}"
    sock.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode("ascii"))
    answer = http.client.HTTPResponse(sock, method="CONNECT")
    answer.begin()
    if answer.status != 200:
        sock.close()
        raise OSError(f"The proxy {proxy[0]}:{proxy[1]} refused to tunnel to {target}: "
                      f"{answer.status} {answer.reason}.")
    return sock


class _PinnedHTTP(http.client.HTTPConnection):
    """An HTTP connection to checked addresses, whatever the host name resolves to now
    (through ``proxy``, when given: the request then names the checked address)."""

    def __init__(self, host: str, port: int, targets: Sequence[tuple[int, Any]],
                 timeout: float, proxy: tuple[str, int] | None = None) -> None:
        super().__init__(host, port, timeout=timeout)
        self.targets = targets
        self.proxy = proxy

    def connect(self) -> None:
        if self.proxy is None:
            self.sock = _connect(self.targets, self.timeout)
        else:
            self.sock = socket.create_connection(self.proxy, timeout=self.timeout)

    def target(self, path: str) -> str:
        """The request target: ``path``, or through a proxy the checked address's URL."""
        if self.proxy is None:
            return path
        sockaddr = self.targets[0][1]
        return f"http://{_literal(sockaddr)}:{sockaddr[1]}{path}"


class _PinnedHTTPS(_PinnedHTTP, http.client.HTTPSConnection):
    """As :class:`_PinnedHTTP`, with TLS for the URL's host name (SNI, certificate), through
    a ``CONNECT`` tunnel to the checked address when there is a proxy."""

    def __init__(self, host: str, port: int, targets: Sequence[tuple[int, Any]],
                 timeout: float, proxy: tuple[str, int] | None = None) -> None:
        self.tls = ssl.create_default_context()
        http.client.HTTPSConnection.__init__(self, host, port, timeout=timeout,
                                             context=self.tls)
        self.targets = targets
        self.proxy = proxy

    def connect(self) -> None:
        raw = (_connect(self.targets, self.timeout) if self.proxy is None
               else _tunnel(self.proxy, self.targets[0][1], self.timeout))
        self.sock = self.tls.wrap_socket(raw, server_hostname=self.host)

    def target(self, path: str) -> str:
        return path


def post(url: str, body: bytes, headers: Mapping[str, str], *, timeout: float,
         allow_private: bool, resolver: Resolver = socket.getaddrinfo) -> int:
    """POST ``body`` to ``url`` through a connection pinned to checked addresses; return
    the answer's status code (redirects are not followed).

    Raises:
        RefusedAddress: see :func:`resolve`; nothing was sent.
        ValueError: ``url`` is not an http(s) URL with a host.
        OSError, http.client.HTTPException: the connection or the answer failed.
    """
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"The URL {url!r} is not an http(s) URL with a host.")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    targets = resolve(parts.hostname, port, allow_private=allow_private, resolver=resolver)
    kind = _PinnedHTTPS if parts.scheme == "https" else _PinnedHTTP
    connection = kind(parts.hostname, port, targets, timeout,
                      proxy_for(parts.scheme, parts.hostname))
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    # The URL's host name, as written: the proxy's request line names the checked address.
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    host = host if parts.port is None else f"{host}:{parts.port}"
    try:
        connection.request("POST", connection.target(path), body=body,
                           headers={"Host": host, **headers})
        answer = connection.getresponse()
        answer.read(MAX_ANSWER_BYTES)
        return answer.status
    finally:
        connection.close()
