"""transport.py's Direct (http.client) TLS: what it trusts, and what it loads."""

import http.server
import shutil
import ssl
import subprocess
import threading

import pytest

from berth import transport

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
