"""Webhook endpoints on loopback, private or link-local addresses are refused (SSRF) unless
QUEUETY["WEBHOOK_ALLOW_PRIVATE"]: at creation (the model's validation, the admin form) and at
delivery, after DNS resolution, where the connection goes to the address that was checked.

The suite's settings allow private addresses (its receivers listen on 127.0.0.1); these tests
turn that off where they check refusals.
"""

from __future__ import annotations

import socket
import socketserver
import ssl
import subprocess
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.core.exceptions import ValidationError
from django.test import override_settings
from django.utils import timezone

from queuety.models import WebhookDelivery, WebhookEndpoint
from queuety.webhooks import delivery, guard
from tests.settings import QUEUETY as TEST_QUEUETY

STRICT = {**TEST_QUEUETY, "WEBHOOK_ALLOW_PRIVATE": False}
SECRET = "ssrf-secret-" + uuid.uuid4().hex
ENDPOINTS = "/admin/queuety/webhookendpoint/"
LOCAL_URLS = ["http://127.0.0.1:8000/hook", "http://localhost/hook", "http://[::1]/hook",
              "http://169.254.169.254/latest/meta-data/", "http://10.0.0.7/hook",
              "http://[::ffff:127.0.0.1]/hook", "http://2130706433/hook"]


class Receiver(BaseHTTPRequestHandler):
    """Records each POST's Host header and answers 204."""

    hosts: list[str] = []

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        Receiver.hosts.append(self.headers["Host"])
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def receiver():
    Receiver.hosts = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("url", LOCAL_URLS)
def test_creation__a_local_url_is_refused_by_the_model_and_the_admin_form(url, admin_client):
    with override_settings(QUEUETY=STRICT):
        endpoint = WebhookEndpoint(url=url, secret=SECRET, events=["run.failed"])
        with pytest.raises(ValidationError, match="webhooks are sent to public addresses"):
            endpoint.full_clean()
        before = WebhookEndpoint.objects.count()
        response = admin_client.post(ENDPOINTS + "add/", {
            "url": url, "events": ["run.failed"], "secret": SECRET, "active": "on"})
        assert response.status_code == 200
        assert "WEBHOOK_ALLOW_PRIVATE" in response.content.decode()
        assert WebhookEndpoint.objects.count() == before


def test_creation__a_local_url_is_accepted_when_private_addresses_are_allowed(admin_client):
    response = admin_client.post(ENDPOINTS + "add/", {
        "url": "http://127.0.0.1:9/hook", "events": ["run.failed"], "secret": SECRET,
        "active": "on", "description": f"allowed-{SECRET}"})
    assert response.status_code == 302
    WebhookEndpoint.objects.filter(description=f"allowed-{SECRET}").delete()


def _pending(url: str) -> WebhookDelivery:
    endpoint = WebhookEndpoint.objects.create(url=url, secret=SECRET, events=["run.failed"])
    return WebhookDelivery.objects.create(
        endpoint=endpoint, event="run.failed", event_id=uuid.uuid4(), payload={"t": SECRET},
        next_attempt_at=timezone.now())


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
def test_delivery__to_a_local_address_fails_at_once_with_the_reason(receiver, host):
    # Created while private addresses were allowed; the setting was turned off since.
    row = _pending(f"http://{host}:{receiver}/hook")
    try:
        with override_settings(QUEUETY=STRICT):
            assert delivery.deliver(row.pk) == WebhookDelivery.FAILED
        row.refresh_from_db()
        assert (row.status, row.attempts, row.last_status_code) == (WebhookDelivery.FAILED, 1,
                                                                   None)
        assert row.last_error.startswith("Refused (SSRF guard): The host ")
        assert "WEBHOOK_ALLOW_PRIVATE" in row.last_error
        assert Receiver.hosts == []  # nothing was sent
    finally:
        row.endpoint.delete()


def test_delivery__with_private_addresses_allowed_is_sent(receiver):
    row = _pending(f"http://localhost:{receiver}/hook")
    try:
        assert delivery.deliver(row.pk) == WebhookDelivery.DELIVERED
        assert Receiver.hosts == [f"localhost:{receiver}"]
    finally:
        row.endpoint.delete()


def test_post__connects_to_the_checked_address_keeping_the_host_name(receiver):
    # A name no DNS knows, resolved once by the test's resolver to the receiver: the request
    # arrives there with its own Host header, and nothing resolved the name a second time
    # (a rebinding resolver gets no second chance between the check and the connection).
    calls = []

    def resolver(host, port, type=0):
        calls.append(host)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port))]

    status = guard.post(f"http://hooks.invalid:{receiver}/x?y=1", b"{}", {"A": "b"},
                        timeout=2.0, allow_private=True, resolver=resolver)
    assert status == 204
    assert calls == ["hooks.invalid"]
    assert Receiver.hosts == [f"hooks.invalid:{receiver}"]


def _resolver_to_loopback(host, port, type=0):
    return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port))]


def test_post__a_name_that_resolves_to_a_local_address_is_refused_with_nothing_sent(receiver):
    # No rule about names catches hooks.invalid: only its resolved address can.
    with pytest.raises(guard.RefusedAddress, match=r"'hooks.invalid' resolves to 127.0.0.1"):
        guard.post(f"http://hooks.invalid:{receiver}/x", b"{}", {}, timeout=2.0,
                   allow_private=False, resolver=_resolver_to_loopback)
    assert Receiver.hosts == []


class Proxy(socketserver.BaseRequestHandler):
    """A forward proxy: tunnels CONNECT to the address it names; answers a plain request
    itself (204), recording its request line and Host header."""

    seen: list[tuple[str, str]] = []

    def handle(self):
        reader = self.request.makefile("rb")
        line = reader.readline().decode().strip()
        headers = {}
        while (header := reader.readline().decode().strip()):
            name, _, value = header.partition(":")
            headers[name.lower()] = value.strip()
        Proxy.seen.append((line, headers.get("host", "")))
        method, target, _ = line.split(" ")
        if method != "CONNECT":
            self.request.sendall(b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n")
            return
        host, _, port = target.rpartition(":")
        upstream = socket.create_connection((host.strip("[]"), int(port)))
        self.request.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
        pipes = [threading.Thread(target=_pipe, args=pair, daemon=True)
                 for pair in ((self.request, upstream), (upstream, self.request))]
        for pipe in pipes:
            pipe.start()
        for pipe in pipes:
            pipe.join(timeout=5)
        upstream.close()


def _pipe(source, sink):
    try:
        while (data := source.recv(65536)):
            sink.sendall(data)
        sink.shutdown(socket.SHUT_WR)
    except OSError:
        pass


@pytest.fixture
def proxy(monkeypatch):
    Proxy.seen = []
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Proxy)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    address = f"http://127.0.0.1:{server.server_address[1]}"
    monkeypatch.setenv("HTTP_PROXY", address)
    monkeypatch.setenv("HTTPS_PROXY", address)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


@pytest.fixture
def tls_receiver(tmp_path, monkeypatch):
    """An https receiver whose certificate is for hooks.invalid, trusted by the client."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=hooks.invalid", "-addext", "subjectAltName=DNS:hooks.invalid",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    Receiver.hosts = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def test_post__https_checks_the_certificate_for_the_host_name_at_the_checked_address(
        tls_receiver):
    status = guard.post(f"https://hooks.invalid:{tls_receiver}/x", b"{}", {}, timeout=5.0,
                        allow_private=True, resolver=_resolver_to_loopback)
    assert status == 204 and Receiver.hosts == [f"hooks.invalid:{tls_receiver}"]
    # The same address under another name: its certificate does not match, nothing is sent.
    with pytest.raises(ssl.SSLCertVerificationError):
        guard.post(f"https://other.invalid:{tls_receiver}/x", b"{}", {}, timeout=5.0,
                   allow_private=True, resolver=_resolver_to_loopback)
    assert len(Receiver.hosts) == 1


def test_post__through_the_environments_proxy_to_the_checked_address(tls_receiver, proxy):
    # https: a CONNECT tunnel to the checked address, TLS for the host name inside it.
    status = guard.post(f"https://hooks.invalid:{tls_receiver}/x", b"{}", {}, timeout=5.0,
                        allow_private=True, resolver=_resolver_to_loopback)
    assert status == 204 and Receiver.hosts == [f"hooks.invalid:{tls_receiver}"]
    assert Proxy.seen[0][0] == f"CONNECT 127.0.0.1:{tls_receiver} HTTP/1.1"
    # http: the proxy is asked for the checked address's URL, with the host name kept.
    assert guard.post("http://hooks.invalid:8081/y?z=1", b"{}", {}, timeout=5.0,
                      allow_private=True, resolver=_resolver_to_loopback) == 204
    assert Proxy.seen[1] == ("POST http://127.0.0.1:8081/y?z=1 HTTP/1.1", "hooks.invalid:8081")
