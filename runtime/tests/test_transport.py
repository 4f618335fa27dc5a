"""transport.py's Direct: its TLS (what it trusts, what it loads) and its
HTTP/1.1 over http.client (framing, kept connections, broken answers in
one line, what it refuses to send)."""

import http.server
import os
import shutil
import socket
import ssl
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from berth.image import transport

needs_openssl = pytest.mark.skipif(not shutil.which("openssl"), reason="needs openssl")


def self_signed(directory, name):
    cert, key = directory / f"{name}.pem", directory / f"{name}.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", f"/CN={name}", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    return cert, key


def subject_hash(cert):
    return subprocess.run(["openssl", "x509", "-hash", "-noout", "-in", str(cert)], check=True,
                          capture_output=True, text=True).stdout.strip()


def system_store(tmp_path, monkeypatch, *certs):
    """A CA directory laid out as update-ca-certificates lays out
    /etc/ssl/certs: the bundle of `certs`, and a hash link to each."""
    store = tmp_path / "certs"
    store.mkdir()
    bundle = store / "ca-certificates.crt"
    bundle.write_text("".join(cert.read_text() for cert in certs))
    for cert in certs:
        (store / f"{subject_hash(cert)}.0").symlink_to(cert)
    monkeypatch.setattr(transport, "SYSTEM_CA_BUNDLE", str(bundle))
    return store, bundle


@needs_openssl
def test_the_system_bundle_is_read_as_its_hashed_directory(tmp_path, monkeypatch):
    cert, _ = self_signed(tmp_path, "ca")
    store, bundle = system_store(tmp_path, monkeypatch, cert)
    assert transport.lazy_ca_path(str(bundle)) == str(store)
    other = tmp_path / "other.crt"
    other.write_text(cert.read_text())
    assert transport.lazy_ca_path(str(other)) == str(other)  # not the system's: as it is
    assert transport.lazy_ca_path(None) is None
    for link in store.glob("*.0"):
        link.unlink()
    assert transport.lazy_ca_path(str(bundle)) == str(bundle)  # no hash links: the file


class _Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "5")
        self.end_headers()
        self.wfile.write(b"hello")

    def log_message(self, *args):
        pass


@pytest.fixture
def tls_server(tmp_path):
    """An HTTPS server on 127.0.0.1 with a self-signed certificate: (url, cert)."""
    cert, key = self_signed(tmp_path, "server")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hello)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"https://127.0.0.1:{server.server_address[1]}/v2/", cert
    server.shutdown()
    server.server_close()


def get(url, insecure=False):
    direct = transport.Direct((5, 5), insecure)
    with direct.get(url, {}) as answer:
        return answer.status_code, b"".join(answer.chunks(1024))


@needs_openssl
def test_direct_trusts_what_the_system_directory_holds_and_nothing_else(
        tmp_path, monkeypatch, tls_server):
    """Read through its directory, the system bundle trusts what it held:
    the server's certificate when it is there, not when another is."""
    url, cert = tls_server
    _, bundle = system_store(tmp_path, monkeypatch, cert)
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(bundle))
    assert get(url) == (200, b"hello")

    (tmp_path / "elsewhere").mkdir()
    stranger, _ = self_signed(tmp_path / "elsewhere", "stranger")
    shutil.rmtree(tmp_path / "certs")
    _, bundle = system_store(tmp_path, monkeypatch, stranger)
    with pytest.raises(transport.TLSError, match="CERTIFICATE_VERIFY_FAILED"):
        get(url)


@needs_openssl
def test_an_insecure_endpoint_loads_no_certificates(tmp_path, monkeypatch, tls_server):
    url, _ = tls_server
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(tmp_path / "missing.crt"))
    direct = transport.Direct((5, 5), True)
    with direct.get(url, {}) as answer:
        assert answer.status_code == 200
    assert direct.context.cert_store_stats() == {"crl": 0, "x509": 0, "x509_ca": 0}



@needs_openssl
def test_http_allowed_still_speaks_https_to_a_registry_that_has_it(tls_server):
    """ENROOT_ALLOW_HTTP=yes lets a registry without TLS be reached over
    plain HTTP; one with TLS is still asked over HTTPS (enroot would speak
    plain HTTP to it: docs/compatibility.md's table says so)."""
    from berth import config
    from berth.image.reference import parse
    from berth.image.registry import Registry
    url, _ = tls_server
    host = url.split("/")[2]
    cfg = config.load({"HOME": "/nonexistent", "ENROOT_SYSCONF_PATH": "/nonexistent",
                       "ENROOT_ALLOW_HTTP": "yes"})
    registry = Registry(parse(f"docker://{host}#test/app"), cfg, insecure=True, direct=True)
    with registry._first_get("/v2/", {}) as answer:
        assert answer.status_code == 200
    assert registry.base == f"https://{host}"

# -- HTTP/1.1: answers scripted byte by byte ------------------------------------------

class Scripted:
    """A server on 127.0.0.1 that reads a request's head and answers each
    with the next of `answers` (bytes), on one connection until those run
    out or one is followed by None (then it hangs up). What it was asked is
    in `requests`, one head each; `connections` counts connections taken."""

    def __init__(self, *answers):
        self.answers = list(answers)
        self.requests, self.connections = [], 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while self.answers:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            with conn:
                reader = conn.makefile("rb")
                while self.answers:
                    head = b""
                    while not head.endswith(b"\r\n\r\n"):
                        line = reader.readline()
                        if not line:
                            break
                        head += line
                    if not head:
                        break
                    self.requests.append(head.decode("latin-1"))
                    conn.sendall(self.answers.pop(0))
                    if self.answers and self.answers[0] is None:
                        self.answers.pop(0)
                        break
                reader.close()  # (the socket closes with its last reference)

    def stop(self):
        self.listener.close()
        self.thread.join(5)


@pytest.fixture
def scripted():
    servers = []

    def start(*answers):
        servers.append(Scripted(*answers))
        return servers[-1]
    yield start
    for server in servers:
        server.stop()


def fetch(direct, url, size=3):
    with direct.get(url, {}) as answer:
        return answer.status_code, b"".join(answer.chunks(size)), answer.headers


@pytest.mark.parametrize("first, body, connections", [
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
     b"5;ext=1\r\nhello\r\n7\r\n, world\r\n0\r\nX-Trailer: t\r\n\r\n", b"hello, world", 1),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello", b"hello", 1),
    (b"HTTP/1.0 200 OK\r\n\r\nuntil the end", b"until the end", 2),
    (b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok", b"ok", 2),
], ids=["chunked", "length", "until-close", "connection-close"])
def test_a_body_is_read_whole_and_its_connection_kept_where_it_may_be(
        scripted, first, body, connections):
    """A second request goes on the first's connection, unless that one
    ends with its body or says it closes."""
    answers = [first] if connections == 1 else [first, None]
    server = scripted(*answers, b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
    direct = transport.Direct((5, 5), False)
    assert fetch(direct, f"{server.url}/a")[:2] == (200, body)
    assert fetch(direct, f"{server.url}/b")[:2] == (200, b"ok")
    assert server.connections == connections


def test_informational_answers_are_skipped_and_header_names_ignore_case(scripted):
    server = scripted(b"HTTP/1.1 100 Continue\r\n\r\n"
                      b"HTTP/1.1 401 Unauthorized\r\nwww-authenticate: Bearer realm=\"a\"\r\n"
                      b"WWW-Authenticate: Basic\r\nContent-Length: 0\r\n\r\n")
    status, body, headers = fetch(transport.Direct((5, 5), False), f"{server.url}/v2/")
    assert (status, body) == (401, b"")
    assert headers.get("WWW-Authenticate") == 'Bearer realm="a"'  # the first, as before
    assert headers.get("Location") is None


def test_the_request_names_its_host_and_port(scripted):
    server = scripted(b"HTTP/1.1 204 No Content\r\n\r\n")
    direct = transport.Direct((5, 5), False)
    with direct.get(f"{server.url}/v2/x/manifests/1?n=1", {"Accept": "a, b"}) as answer:
        assert answer.status_code == 204 and b"".join(answer.chunks(9)) == b""
    port = server.url.rsplit(":", 1)[1]
    assert server.requests[0].split("\r\n")[:4] == [
        "GET /v2/x/manifests/1?n=1 HTTP/1.1", f"Host: 127.0.0.1:{port}",
        "Accept-Encoding: identity", "Accept: a, b"]


@pytest.mark.parametrize("url, headers, needle", [
    ("/v2/a b", {}, "bad URL"),
    ("/v2/a\r\nX-Injected: 1", {}, "bad URL"),
    ("/v2/", {"Authorization": "Bearer x\r\nX-Injected: 1"},
     "header 'Authorization' holds a line break"),
], ids=["space", "crlf-in-path", "crlf-in-header"])
def test_a_request_that_would_smuggle_a_line_is_refused_unsent(scripted, url, headers, needle):
    """A token or a redirect comes from the registry, which is not trusted:
    what it says never becomes a header line of its own."""
    server = scripted(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
    with pytest.raises(transport.TransferError, match=needle):
        transport.Direct((5, 5), False).get(f"{server.url}{url}", headers)
    assert server.requests == []


@pytest.mark.parametrize("answer, needle", [
    (b"SSH-2.0-OpenSSH\r\n\r\n", "bad status line"),
    (b"HTTP/2 200 OK\r\n\r\n", "bad status line: unknown protocol 'HTTP/2'"),
    (b"HTTP/1.1 200 OK\r\nX: " + b"y" * 70000 + b"\r\n\r\n", "more than 65536 bytes"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "IncompleteRead"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n9\r\nabc", "IncompleteRead"),
], ids=["not-http", "http-2", "long-header", "bad-chunk-size", "chunk-cut-short"])
def test_a_broken_answer_is_a_transfer_error(scripted, answer, needle):
    server = scripted(answer, None)
    with pytest.raises(transport.TransferError, match=needle):
        fetch(transport.Direct((5, 5), False), f"{server.url}/v2/")


def test_a_length_cut_short_ends_quietly_for_the_registry_to_tell(scripted):
    """As http.client did: the body ends; registry.py compares what came
    (`received`) with the Content-Length and calls it a broken transfer."""
    server = scripted(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", None)
    direct = transport.Direct((5, 5), False)
    with direct.get(f"{server.url}/v2/", {}) as answer:
        assert b"".join(answer.chunks(4)) == b"abc" and answer.received == 3
    assert direct.idle == {}


def test_a_resolve_loads_neither_requests_nor_urllib3(scripted):
    """What the transport is for: a GET without requests and urllib3, whose
    import alone cost a resolve more than its requests; and the answer read
    by http.client, the one parser of every registry answer."""
    server = scripted(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
    runtime = Path(transport.__file__).resolve().parents[2]
    code = ("import sys; from berth.image import transport\n"
            f"with transport.Direct((5, 5), False).get('{server.url}/v2/', {{}}) as a:\n"
            "    assert b''.join(a.chunks(9)) == b'{}'\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('requests', 'urllib3')), 'http.client' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env=dict(os.environ, PYTHONPATH=str(runtime)), check=True)
    assert result.stdout.strip() == "[] True"


def test_a_request_ends_with_no_timer_thread_left(scripted):
    """The head's and the body's timers are ended with the request, not only
    cancelled: a thread of theirs still waking when berth exits (a ^C mid-
    push) can end that exit in SIGSEGV, not status 130."""
    server = scripted(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello")
    direct = transport.Direct((5, 5), False)
    with direct.get(f"{server.url}/a", {}) as answer, transport.deadline(answer, 30):
        assert b"".join(answer.chunks(5)) == b"hello"
    assert [thread for thread in threading.enumerate()
            if isinstance(thread, threading.Timer)] == []
