"""`berth build --push docker://REGISTRY#REPO:TAG`, end to end as an
unprivileged user against the real registry of registry_fixture.py,
through a front of this file's that logs each request, asks for a token
or Basic credentials, and fails uploads on demand (an error status, an
answer that never comes). A pushed image pulled back by `berth import`
starts and holds the files of `-o OUT.sqsh`; a second push uploads no
blob; each failure is one line naming the registry and the request that
failed, leaves the tag as it was and nothing local behind."""

import base64
import http.server
import json
import os
import signal
import threading
import time

import pytest
import requests

from registry_fixture import free_port, layer_tar
from test_build import build, built, left_in, write  # noqa: F401 (build: a fixture)
from test_build_oci import _tree
from test_start_uri import registry  # noqa: F401 (a fixture: test/busybox:v1 pushed)

CONTAINERFILE = """\
FROM ./base.sqsh
RUN mkdir /made && echo pushed > /made/file && rm -f /etc/motd
ENV GREETING=hello
CMD ["cat", "/made/file"]
"""
LOGIN, PASSWORD = "alice", "secret"


class Front:
    """An HTTP front for the registry at `upstream`, on 127.0.0.1: each
    request logged as "METHOD PATH"; auth "basic" or "bearer" (a token from
    its /token for LOGIN/PASSWORD, the scopes asked for logged) or None;
    uploads (POST .../blobs/uploads/) answered `fail` (a status), or held
    (`hold`: never answered, `held` set once one is). Upload Locations are
    made relative, so that they lead back here, or absolute to the origin
    `elsewhere` (HOST:PORT). Each Authorization header that came is kept."""

    def __init__(self, upstream, auth=None, fail=None, hold=False, elsewhere=None):
        self.upstream, self.auth, self.fail, self.hold = upstream, auth, fail, hold
        self.elsewhere, self.authorizations = elsewhere, []
        self.log, self.scopes, self.held, self.stopping = [], [], threading.Event(), \
            threading.Event()
        self.basic = "Basic " + base64.b64encode(f"{LOGIN}:{PASSWORD}".encode()).decode()
        self.port = free_port()
        self.host = f"127.0.0.1:{self.port}"
        front = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_any(self):
                front.handle(self)

            do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = do_any

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        self.stopping.set()
        self.server.shutdown()
        self.server.server_close()

    def blob_uploads(self):
        return [line for line in self.log if line.startswith(("POST", "PUT")) and
                "/blobs/" in line]

    def handle(self, handler):
        body = handler.rfile.read(int(handler.headers.get("Content-Length") or 0))
        self.log.append(f"{handler.command} {handler.path}")
        if "Authorization" in handler.headers:
            self.authorizations.append(handler.headers["Authorization"])
        if handler.path.startswith("/token"):
            self.scopes.append(handler.path)
            good = handler.headers.get("Authorization") == self.basic
            return self.reply(handler, 200 if good else 401,
                              json.dumps({"token": "good"}).encode() if good else b"{}")
        if not self.authorized(handler.headers.get("Authorization", "")):
            challenge = ('Basic realm="test"' if self.auth == "basic" else
                         f'Bearer realm="http://{self.host}/token",service="test"')
            return self.reply(handler, 401, b"{}", {"WWW-Authenticate": challenge})
        if handler.command == "POST" and "/blobs/uploads/" in handler.path:
            if self.hold:
                self.held.set()
                self.stopping.wait(120)
                return None
            if self.fail:
                return self.reply(handler, self.fail, b"{}")
        sent = {k: v for k, v in handler.headers.items()
                if k.lower() in ("accept", "content-type")}
        answer = requests.request(handler.command, self.upstream + handler.path, data=body,
                                  headers=sent, timeout=30, allow_redirects=False)
        kept = {k: v for k, v in answer.headers.items()
                if k.lower() in ("content-type", "docker-content-digest", "location")}
        if "Location" in kept:
            kept["Location"] = kept["Location"].removeprefix(self.upstream)
            if self.elsewhere:
                kept["Location"] = f"http://{self.elsewhere}{kept['Location']}"
        return self.reply(handler, answer.status_code, answer.content, kept)

    def authorized(self, header):
        if self.auth == "basic":
            return header == self.basic
        if self.auth == "bearer":
            return header == "Bearer good"
        return True

    @staticmethod
    def reply(handler, status, body, headers=None):
        handler.send_response(status)
        for key, value in (headers or {}).items():
            handler.send_header(key, value)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        if handler.command != "HEAD":
            handler.wfile.write(body)


@pytest.fixture
def front(berth, registry):  # noqa: F811 (registry: a fixture)
    """Makes Fronts (Front's arguments) for the test; plain HTTP allowed."""
    berth.env.update(ENROOT_ALLOW_HTTP="yes")
    made = []

    def make(**kwargs):
        made.append(Front(registry.url, **kwargs))
        return made[-1]
    yield make
    for each in made:
        each.stop()


def _credentials(berth, password):
    path = berth.base / "cfg" / ".credentials"
    path.write_text(f"machine 127.0.0.1 login {LOGIN} password {password}\n")
    path.chmod(0o600)
    berth.chown(path)


def _tag(registry, repo, tag):  # noqa: F811 (registry: a fixture's value)
    """The digest the registry gives for repo:tag now (None: no such tag)."""
    answer = requests.head(f"{registry.url}/v2/{repo}/manifests/{tag}", timeout=10, headers={
        "Accept": "application/vnd.oci.image.manifest.v1+json"})
    return answer.headers.get("Docker-Content-Digest") if answer.status_code == 200 else None


def test_a_pushed_image_imports_as_the_squashfs_and_a_second_push_uploads_none(
        berth, build, registry, front, tmp_path):  # noqa: F811 (fixtures)
    at = front(auth="bearer")
    _credentials(berth, PASSWORD)
    write(berth, build, CONTAINERFILE)
    uri = f"docker://{at.host}#test/pushed:v1"
    ran, cached, said = built(berth, "-o", "out.sqsh", "--push", uri, build)
    assert (ran, cached) == (1, 0) and "4 blobs uploaded, 0 there already" in said
    assert all("scope=repository%3Atest%2Fpushed%3Apull%2Cpush" in s for s in at.scopes)
    assert len([line for line in at.blob_uploads() if line.startswith("POST")]) == 4
    assert at.log[-1] == "PUT /v2/test/pushed/manifests/v1"  # the tag last
    berth.ok("import", "-o", "pulled.sqsh", f"docker://{registry.host}#test/pushed:v1")
    pulled = berth.base / "pulled.sqsh"
    assert _tree(pulled, tmp_path / "pulled") == _tree(berth.base / "out.sqsh", tmp_path / "out")
    assert berth.ok("start", pulled) == "pushed\n"
    assert berth.ok("start", pulled, "sh", "-c", "echo $GREETING") == "hello\n"

    at.log.clear()
    ran, cached, said = built(berth, "--push", uri, build)  # nothing local: no image.sqsh
    assert (ran, cached) == (0, 1) and "0 blobs uploaded, 4 there already" in said
    assert at.blob_uploads() == [] and not (berth.base / "image.sqsh").exists()
    asked = [line for line in at.log if "/blobs/" in line]  # (the first twice: its 401)
    assert {line.split()[0] for line in asked} == {"HEAD"} and len(set(asked)) == 4
    assert left_in(build) == []


@pytest.mark.parametrize("auth, password, fail, hold, needle", [
    ("basic", None, None, False, "refused access to test/kept (401 Unauthorized) with no "
                                 "credentials for"),
    ("bearer", "wrong", None, False, "refused access to test/kept (401 Unauthorized) with "
                                     "the credentials in"),
    (None, None, 500, False, "upload of blob sha256:"),
    (None, None, None, True, "timed out (upload of blob sha256:"),
], ids=["no-credentials", "wrong-credentials", "upload-500", "upload-hangs"])
def test_a_failed_push_is_one_line_and_leaves_the_tag(
        berth, build, registry, front, auth, password, fail, hold, needle):  # noqa: F811
    kept = registry.push_image("test/kept", "v1", [layer_tar(("file", "kept", b"old\n"))])
    at = front(auth=auth, fail=fail, hold=hold)
    if password:
        _credentials(berth, password)
    write(berth, build, CONTAINERFILE)
    began = time.monotonic()
    line = berth.fails("build", "-q", "--push", f"docker://{at.host}#test/kept:v1", build,
                       needle=needle, env={"ENROOT_TRANSFER_TIMEOUT": "2",
                                           "ENROOT_TRANSFER_RETRIES": "0"}, timeout=120)
    assert f"registry {at.host}" in line
    if fail:
        assert "answered 500 Internal Server Error" in line
    if hold:
        assert time.monotonic() - began < 60  # the build's few seconds and the 2 s timeout
    assert _tag(registry, "test/kept", "v1") == kept
    assert not any(line.startswith("PUT") and "/manifests/" in line for line in at.log)
    assert left_in(build) == [] and not (berth.base / "image.sqsh").exists()


def test_sigint_mid_upload_leaves_nothing_local_and_the_tag(
        berth, build, registry, front):  # noqa: F811 (fixtures)
    kept = registry.push_image("test/kept", "v2", [layer_tar(("file", "kept", b"old\n"))])
    at = front(hold=True)
    write(berth, build, CONTAINERFILE)
    process = berth.interruptible("build", "-q", "--push", f"docker://{at.host}#test/kept:v2",
                                  build)
    assert at.held.wait(120), process.stderr.read() if process.poll() is not None else ""
    os.killpg(process.pid, signal.SIGINT)
    assert process.wait(timeout=30) == 130, process.stderr.read()
    assert _tag(registry, "test/kept", "v2") == kept
    assert left_in(build) == [] and [name for name in os.listdir(berth.base)
                                     if name.startswith(".") or name.endswith(".sqsh")] == []
    assert berth.leftovers() == []


def test_an_upload_location_elsewhere_gets_no_credentials(berth, build, registry, front):  # noqa: F811
    """A Location on another origin (a hostile registry's, or a storage
    service's) is followed without the registry's credentials."""
    other = front()
    at = front(auth="basic", elsewhere=other.host)
    _credentials(berth, PASSWORD)
    write(berth, build, CONTAINERFILE)
    berth.ok("build", "-q", "--push", f"docker://{at.host}#test/elsewhere:v1", build,
             timeout=120)
    assert [line.split()[0] for line in other.log] == ["PUT"] * 4 and other.authorizations == []
    assert at.authorizations and _tag(registry, "test/elsewhere", "v1")
