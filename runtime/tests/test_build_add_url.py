"""`berth build`'s ADD of an http URL, end to end as an unprivileged user,
against a real HTTP server on 127.0.0.1 that plays a hostile one: a
stall before any answer, a body that never ends, one that drips under
the rate floor, one shorter than its Content-Length, a 404, a busy 503.
Each failure is one line naming the file, line and URL, and leaves no
image, tree or partial file; what is fetched gets BuildKit's name, mode
and mtime, and the cache follows BuildKit's rule (asked again at each
build, the content in the key; with --checksum, not asked when cached)."""

import hashlib
import http.server
import subprocess
import threading
import time

import pytest

from test_build import build, built, left_in, write  # noqa: F401 (build: a fixture)

PAYLOAD = b"#!/bin/sh\necho fetched\n"
MODIFIED = "Tue, 03 Mar 2020 10:00:00 GMT"  # 1583229600


class Server:
    """The hostile server: each path one behaviour; `asked` counts the GETs."""

    def __init__(self):
        self.asked, self.busy_left, self.payload = [], 0, PAYLOAD
        self.stopping = threading.Event()
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):
                server.asked.append(self.path)
                getattr(server, "_" + self.path.strip("/").split("/")[0], server._missing)(self)

        self.http = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.http.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}"
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def stop(self):
        self.stopping.set()
        self.http.shutdown()
        self.http.server_close()

    def _send(self, handler, body, status=200, headers=()):
        handler.send_response(status)
        for key, value in (("Content-Length", str(len(body))), *headers):
            handler.send_header(key, value)
        handler.end_headers()
        handler.wfile.write(body)

    def _files(self, handler):
        self._send(handler, self.payload, headers=[("Last-Modified", MODIFIED)])

    def _busy(self, handler):
        if self.busy_left:
            self.busy_left -= 1
            return self._send(handler, b"", 503, [("Retry-After", "0")])
        return self._send(handler, self.payload)

    def _missing(self, handler):
        self._send(handler, b"no\n", 404)

    def _stall(self, handler):  # (the connection open, no answer)
        self.stopping.wait(60)

    def _endless(self, handler):  # (chunked, never the last chunk)
        handler.send_response(200)
        handler.send_header("Transfer-Encoding", "chunked")
        handler.end_headers()
        chunk = b"x" * 65536
        while not self.stopping.is_set():
            try:
                handler.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            except OSError:
                return

    def _drip(self, handler):  # (a byte at once, then four a second, of a large body)
        handler.send_response(200)
        handler.send_header("Content-Length", str(1 << 30))
        handler.end_headers()
        while True:  # (never a second without a byte: the stall's line is another's)
            try:
                handler.wfile.write(b"x")
                handler.wfile.flush()
            except OSError:
                return
            if self.stopping.wait(0.25):
                return

    def _short(self, handler):  # (less than its Content-Length says, then closed)
        handler.send_response(200)
        handler.send_header("Content-Length", "100")
        handler.end_headers()
        handler.wfile.write(b"x" * 4)
        handler.close_connection = True


@pytest.fixture
def server():
    found = Server()
    yield found
    found.stop()


def _listing(berth, name, path):
    return subprocess.run(["unsquashfs", "-lln", berth.base / name, path],
                          capture_output=True, text=True, check=True).stdout


def test_an_added_url_is_named_kept_and_asked_again_as_buildkit_does(berth, build, server):
    write(berth, build, f"FROM ./base.sqsh\nADD {server.url}/files/dir/tool.sh /opt/\n"
                        f"ADD --chmod=755 {server.url}/files/a%20b/ /named\n")
    assert built(berth, "-o", "out.sqsh", build)[:2] == (2, 0)
    listing = _listing(berth, "out.sqsh", "opt")
    assert "-rw------- 0/0" in listing and "2020-03-03 10:00 squashfs-root/opt/tool.sh" in listing
    assert "-rwxr-xr-x 0/0" in _listing(berth, "out.sqsh", "named")
    assert berth.ok("start", berth.base / "out.sqsh", "sh", "/opt/tool.sh") == "fetched\n"
    # asked again at each build: the same content is a cached step
    assert built(berth, "-o", "out.sqsh", build)[:2] == (0, 2) and len(server.asked) == 4
    server.payload = b"changed\n"
    assert built(berth, "-o", "out.sqsh", build)[:2] == (2, 0)


def test_a_checksum_is_checked_and_a_cached_step_asks_nothing(berth, build, server):
    right = "sha256:" + hashlib.sha256(PAYLOAD).hexdigest()
    write(berth, build, f"FROM ./base.sqsh\nADD --checksum={right} {server.url}/files/t /t\n")
    assert built(berth, "-o", "out.sqsh", build)[:2] == (1, 0) and len(server.asked) == 1
    assert built(berth, "-o", "out.sqsh", build)[:2] == (0, 1) and len(server.asked) == 1
    wrong = "sha256:" + "0" * 64
    write(berth, build, f"FROM ./base.sqsh\nADD --checksum={wrong} {server.url}/files/t /t\n")
    (berth.base / "out.sqsh").unlink()
    berth.fails("build", "-q", "-o", "out.sqsh", build,
                needle=f"Containerfile:2: ADD {server.url}/files/t: its sha256 is {right}, "
                       "not the --checksum given")
    assert not (berth.base / "out.sqsh").exists() and left_in(build) == []


def test_a_busy_server_is_asked_again(berth, build, server):
    server.busy_left = 2
    berth.env.update(ENROOT_TRANSFER_RETRIES="3")
    write(berth, build, f"FROM ./base.sqsh\nADD {server.url}/busy /b\n")
    ran, _, said = built(berth, "-o", "out.sqsh", build)
    assert ran == 1 and said.count("answered 503 Service Unavailable; asking again") == 2


@pytest.mark.parametrize("path, settings, needle", [
    ("missing", {}, "answered 404 Not Found"),
    ("stall", {}, "no byte within ENROOT_TRANSFER_TIMEOUT=1 s"),
    ("endless", {"BERTH_BUILD_ADD_MAX_SIZE": "1M"},
     "more than BERTH_BUILD_ADD_MAX_SIZE (1.0M) sent; refusing it"),
    ("drip", {}, "under the floor of 1 KiB/s over ENROOT_TRANSFER_TIMEOUT=1 s"),
    ("short", {}, "IncompleteRead (4 bytes read, 96 more expected)"),
    ("endless", {"BERTH_BUILD_ADD_MAX_SIZE": "lots"}, "BERTH_BUILD_ADD_MAX_SIZE=lots: expected"),
])
def test_a_hostile_server_fails_the_step_in_one_line(berth, build, server, path, settings,
                                                      needle):
    berth.env.update(ENROOT_TRANSFER_TIMEOUT="1", ENROOT_TRANSFER_RETRIES="0", **settings)
    write(berth, build, f"FROM ./base.sqsh\nRUN true\nADD {server.url}/{path} /x\n")
    began = time.monotonic()
    line = berth.fails("build", "-q", "-o", "out.sqsh", build, needle=needle)
    assert time.monotonic() - began < 30
    if "MAX_SIZE=lots" not in needle:
        assert f"Containerfile:3: ADD {server.url}/{path}: " in line
    assert not (berth.base / "out.sqsh").exists() and left_in(build) == []


@pytest.mark.parametrize("text, needle", [
    ("COPY http://127.0.0.1:9/x /x", "Containerfile:2: COPY http://127.0.0.1:9/x: a URL is a "
                                     "source of ADD only"),
    ("ADD https://example.invalid/repo.git /src", "a git repository: not supported"),
    ("ADD ftp://127.0.0.1/x /x", "only http:// and https:// URLs are fetched"),
    ("ADD --checksum=md5:00 http://127.0.0.1:9/x /x", "expected sha256:<64 hex digits>"),
    (f"ADD --checksum=sha256:{'0' * 64} a.txt /x", "takes one http(s) URL as the source"),
    ("ADD http://127.0.0.1:9/x /x", "Containerfile:2: ADD http://127.0.0.1:9/x: "),
])
def test_what_an_add_of_a_url_may_not_be_is_refused(berth, build, text, needle):
    write(berth, build, f"FROM ./base.sqsh\n{text}\n")
    berth.fails("build", "-q", "-o", "out.sqsh", build, needle=needle)
    assert not (berth.base / "out.sqsh").exists() and left_in(build) == []
