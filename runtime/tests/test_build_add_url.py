"""`berth build`'s ADD of an http URL, end to end as an unprivileged user,
against a real HTTP server on 127.0.0.1 that plays a hostile one: a
stall before any answer, a body that never ends, one that drips under
the rate floor, one shorter than its Content-Length, a 404, a busy 503.
Each failure is one line naming the file, line and URL, and leaves no
image, tree or partial file; what is fetched gets BuildKit's name, mode
and mtime, and the cache follows BuildKit's rule (asked again at each
build, revalidated by its ETag, the content in the key; with --checksum,
not asked when cached)."""

import hashlib
import http.server
import json
import os
import subprocess
import threading
import time

import pytest

from test_build import build, built, left_in, write  # noqa: F401 (build: a fixture)

PAYLOAD = b"#!/bin/sh\necho fetched\n"
MODIFIED = "Tue, 03 Mar 2020 10:00:00 GMT"  # 1583229600


class Server:
    """The hostile server: each path one behaviour; `asked` counts the GETs.
    /files/ sends `etag` (None: none) and answers its If-None-Match with a
    304; `conditions` holds each GET's If-None-Match, `bodies` counts the
    bodies sent."""

    def __init__(self):
        self.asked, self.busy_left, self.payload = [], 0, PAYLOAD
        self.etag, self.conditions, self.bodies = None, [], 0
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
        asked = handler.headers.get("If-None-Match")
        self.conditions.append(asked)
        if self.etag is not None and asked == self.etag:
            return self._not_modified(handler)
        self.bodies += 1
        tagged = [("ETag", self.etag)] if self.etag is not None else []
        self._send(handler, self.payload, headers=[("Last-Modified", MODIFIED), *tagged])

    def _not_modified(self, handler):  # (no body, whatever was asked: /lying/ alone)
        handler.send_response(304)
        handler.send_header("ETag", self.etag or '"any"')
        handler.end_headers()

    def _lying(self, handler):
        self._not_modified(handler)

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


def test_a_rebuild_revalidates_the_file_by_its_etag(berth, build, server):
    """As BuildKit does: the next build asks with the ETag it kept, and a
    304 (no body sent) reuses the kept file, so the step is cached; a step
    before it changed runs the ADD from the kept file; a new ETag is a
    download, and the step runs again."""
    server.etag = 'W/"v1"'
    text = (f"FROM ./base.sqsh\nRUN echo {{}} > /before\nADD {server.url}/files/tool.sh /opt/\n"
            "RUN cp /opt/tool.sh /copied\n")
    write(berth, build, text.format("one"))
    assert built(berth, "-o", "out.sqsh", build)[:2] == (3, 0)
    assert (server.conditions, server.bodies) == ([None], 1)
    assert built(berth, "-o", "out.sqsh", build)[:2] == (0, 3)
    assert (server.conditions, server.bodies) == ([None, 'W/"v1"'], 1)
    write(berth, build, text.format("two"))
    assert built(berth, "-o", "out.sqsh", build)[:2] == (3, 0)
    assert (server.conditions[-1], server.bodies) == ('W/"v1"', 1)
    out = berth.base / "out.sqsh"
    assert berth.ok("start", out, "sh", "/copied") == "fetched\n"
    assert "2020-03-03 10:00 squashfs-root/opt/tool.sh" in _listing(berth, "out.sqsh", "opt")
    server.payload, server.etag = b"echo changed\n", '"v2"'
    assert built(berth, "-o", "out.sqsh", build)[:2] == (2, 1)
    assert (server.conditions[-1], server.bodies) == ('W/"v1"', 2)
    assert berth.ok("start", out, "sh", "/copied") == "changed\n"
    assert built(berth, "-o", "out.sqsh", build)[:2] == (0, 3)
    assert (server.conditions[-1], server.bodies) == ('"v2"', 2)
    # pruned with the kept file: asked for whole
    assert "and 1 ADD URL records" in berth.ok("cache", "prune", "--max-size", "0")
    assert os.listdir(berth.base / "cache/build-urls") == []
    assert built(berth, "-o", "out.sqsh", build)[:2] == (3, 0)
    assert (server.conditions[-1], server.bodies) == (None, 3)


@pytest.mark.parametrize("etag", ['"a\x01b"', '"' + "x" * 5000 + '"', "unquoted", '"a"b"'],
                         ids=["control", "huge", "unquoted", "quote-inside"])
def test_an_etag_that_is_none_is_not_sent_back(berth, build, server, etag):
    """An ETag with a control character, a huge one or one not quoted as
    RFC 9110 writes it is not kept: the next build asks for the whole file,
    and the step is cached by its content as without an ETag."""
    server.etag = etag
    write(berth, build, f"FROM ./base.sqsh\nADD {server.url}/files/t /t\n")
    assert built(berth, "-o", "out.sqsh", build)[:2] == (1, 0)
    assert built(berth, "-o", "out.sqsh", build)[:2] == (0, 1)
    assert (server.conditions, server.bodies) == ([None, None], 2)


def test_a_kept_file_changed_in_the_cache_is_fetched_whole(berth, build, server):
    """The kept file is checked against its digest as it is reused: one
    changed in the cache is asked for again without the ETag, never used."""
    server.etag = '"v1"'
    write(berth, build, f"FROM ./base.sqsh\nADD {server.url}/files/t /t\n")
    built(berth, "-o", "out.sqsh", build)
    blob = berth.base / "cache/blobs/sha256" / hashlib.sha256(PAYLOAD).hexdigest()
    blob.write_bytes(b"#!/bin/sh\necho altered\n")
    assert built(berth, "-o", "out.sqsh", build)[:2] == (0, 1)
    assert (server.conditions, server.bodies) == ([None, '"v1"', None], 2)
    assert berth.ok("start", berth.base / "out.sqsh", "sh", "/t") == "fetched\n"


@pytest.mark.parametrize("field, value", [
    ("digest", "sha256:../../../../etc/passwd"), ("mtime", "Infinity"), ("size", '"24"'),
    ("url", '"http://127.0.0.1:9/other"'), ("etag", '"\\"v1\\"\\r\\nX-Smuggled: 1"'),
    (None, "[" * 100000),
], ids=["digest-path", "mtime-infinite", "size-text", "other-url", "etag-header", "deep"])
def test_a_hostile_record_of_a_url_is_no_record(berth, build, server, field, value):
    """A record in build-urls/ that is not what a build wrote (a digest
    that is a path, an mtime JSON allows but no clock, another URL, a
    header to smuggle, JSON nested past Python's depth): the URL is
    asked for whole, as never fetched, and the step gets what came."""
    server.etag = '"v1"'
    write(berth, build, f"FROM ./base.sqsh\nADD {server.url}/files/t /t\n")
    built(berth, "-o", "out.sqsh", build)
    (record,) = (berth.base / "cache/build-urls").iterdir()
    kept = json.loads(record.read_text())
    text = value if field is None else json.dumps(kept)[:-1] + f', "{field}": {value}}}'
    record.write_text(text)
    assert built(berth, "-o", "out.sqsh", build)[:2] == (0, 1)
    assert (server.conditions, server.bodies) == ([None, None], 2)
    assert json.loads(record.read_text()) == kept  # (written anew)


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
    ("lying", {}, "answered 304 Not Modified"),  # (to a GET that asked for no 304)
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
