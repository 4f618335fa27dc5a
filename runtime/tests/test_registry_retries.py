"""A busy registry is waited for (issue #49): 408, 429, 500, 502, 503 and
504 answers and broken connections are asked again after growing waits or
as long as Retry-After asks, within ENROOT_TRANSFER_RETRIES and the
transfer timeout; a broken download resumes with a Range request. And a
document that drips a byte at a time ends at the transfer timeout (issue
#42, item 4). What asking again will not mend ends at once (issue #61): a
name that does not resolve, a refused connection, a 401 or a 404; `import
--resolve` asks once, and ends with porcelain.PERMANENT where the plugin
is to refuse the job.

The registries are HostileRegistry (registry_fixture.py), in this process.
The waits asserted are lower bounds (what the registry asked for); the
failures that end at once are held to a bound of their own, AT_ONCE,
against the 15 s and more that the retries' doubling waits would take.
"""

import email.utils
import fcntl
import itertools
import json
import os
import socket
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from registry_fixture import (
    OCI_MANIFEST,
    RUNTIME,
    HostileRegistry,
    berth,
    free_port,
    gzipped,
    layer_tar,
    sha256,
)

from berth import porcelain

LAYER = gzipped(layer_tar(("dir", "etc"), ("file", "etc/os-release", b"ID=busy\n")))
RETRIES = {"ENROOT_TRANSFER_RETRIES": "5"}  # what the role's enroot.conf sets
# What a failure that ends at once may take, a Python start included; with
# ENROOT_TRANSFER_RETRIES=5, retried, it would take 15 s at least.
AT_ONCE = 3.0


@pytest.fixture
def hostile():
    registry = HostileRegistry()
    yield registry
    registry.stop()


def run_import(hostile, tmp_path, env, *flags, **settings):
    return berth(["import", *flags, f"docker://{hostile.host}#test/app:v1"],
                 dict(env, **settings), tmp_path, timeout=60)


def one_line_error(result, *needles):
    assert result.returncode == 1, result.stderr
    assert result.stderr.startswith("berth: error: "), result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, result.stderr
    for needle in needles:
        assert needle in result.stderr, result.stderr


def waits(result):
    return [line for line in result.stderr.splitlines() if "asking again at" in line]


def busy(*script, headers=None):
    """Answer the requests with the statuses of `script` in turn, the last
    over and over (None: the true answer), each with `headers` (a dict, or
    a function giving one); `.times`: when each request came."""
    times = []

    def answer(hostile, handler, body):
        times.append(time.monotonic())
        status = script[min(len(times), len(script)) - 1]
        if status is None:
            kind = {"Content-Type": OCI_MANIFEST} if "/manifests/" in handler.path else {}
            return hostile.send(handler, 200, body, kind)
        hostile.send(handler, status, b"", headers() if callable(headers) else headers)
    answer.times = times
    return answer


def gaps(times):
    return [later - earlier for earlier, later in itertools.pairwise(times)]


# -- waits ----------------------------------------------------------------------------

def test_a_429_is_asked_again_after_its_retry_after(tmp_path, env, hostile):
    hostile.image("test/app", "v1", [LAYER])
    manifest = hostile.behave["v1"] = busy(429, None, headers={"Retry-After": "2"})
    result = run_import(hostile, tmp_path, env, **RETRIES)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "test+app+v1.sqsh").is_file()
    [gap] = gaps(manifest.times)
    assert gap >= 1.95, gap
    [line] = waits(result)
    assert line.startswith(f"berth: registry {hostile.host}: manifest v1 answered 429 Too Many "
                           "Requests; asking again at "), line
    assert line.endswith("(in 2.0 s, retry 1 of 5)"), line


def test_a_retry_after_date_is_waited_for(tmp_path, env, hostile):
    hostile.image("test/app", "v1", [LAYER])
    # (an HTTP date has whole seconds: 3 s from now, cut, is more than 2 s)
    manifest = hostile.behave["v1"] = busy(
        503, None, headers=lambda: {"Retry-After": email.utils.formatdate(time.time() + 3,
                                                                          usegmt=True)})
    result = run_import(hostile, tmp_path, env, **RETRIES)
    assert result.returncode == 0, result.stderr
    [gap] = gaps(manifest.times)
    assert gap >= 1.95, gap
    assert len(waits(result)) == 1, result.stderr


def test_503s_are_asked_again_after_growing_waits(tmp_path, env, hostile):
    image = hostile.image("test/app", "v1", [LAYER])
    blob = hostile.behave[image["layers"][0]] = busy(503, 503, 503, None)
    result = run_import(hostile, tmp_path, env, **RETRIES)
    assert result.returncode == 0, result.stderr
    first, second, third = gaps(blob.times)
    # 0.5-1 s, 1-2 s, 2-4 s: each at least the one before
    assert first >= 0.45 and second >= 0.95 and third >= 1.95, (first, second, third)
    assert third > first
    lines = waits(result)
    assert len(lines) == 3 and lines[2].endswith("retry 3 of 5)"), result.stderr
    assert "blob sha256:" in lines[0] and "answered 503 Service Unavailable" in lines[0]


def test_a_registry_that_stays_busy_ends_at_the_bound_in_one_line(tmp_path, env, hostile):
    hostile.image("test/app", "v1", [LAYER])
    manifest = hostile.behave["v1"] = busy(429, headers={"Retry-After": "1"})
    # --quiet: no line while it waits, the one at the bound all the same
    result = berth(["--quiet", "import", f"docker://{hostile.host}#test/app:v1"],
                   dict(env, ENROOT_TRANSFER_TIMEOUT="3", **RETRIES), tmp_path, timeout=60)
    tries = len(manifest.times)
    assert 2 <= tries <= 3  # a try after 1 s and 2 s; one after 3 s would pass the bound
    one_line_error(result, f"berth: error: registry {hostile.host}: manifest v1 answered 429 "
                           f"Too Many Requests (tried {tries} times in ",
                   " would pass ENROOT_TRANSFER_TIMEOUT=3)")


def test_a_retry_after_past_the_bound_is_not_waited_for(tmp_path, env, hostile):
    hostile.image("test/app", "v1", [LAYER])
    manifest = hostile.behave["v1"] = busy(503, headers={"Retry-After": "86400"})
    result = run_import(hostile, tmp_path, env, **RETRIES)
    one_line_error(result, f"registry {hostile.host}: manifest v1 answered 503 Service "
                           "Unavailable (tried 1 time in 0 s; its Retry-After of 86400 s "
                           "would pass ENROOT_TRANSFER_TIMEOUT=60)")
    assert len(manifest.times) == 1


def test_without_retries_a_busy_answer_ends_the_import_as_before(tmp_path, env, hostile):
    hostile.image("test/app", "v1", [LAYER])
    manifest = hostile.behave["v1"] = busy(429, None, headers={"Retry-After": "1"})
    result = run_import(hostile, tmp_path, env)  # the runtime's default: enroot's 0
    one_line_error(result, f"registry {hostile.host}: manifest v1 answered 429 Too Many "
                           "Requests\n")
    assert len(manifest.times) == 1


def test_a_busy_mirror_is_not_waited_for_when_another_place_follows(tmp_path, env, hostile):
    origin = HostileRegistry()
    try:
        origin.image("test/app", "v1", [LAYER])
        hostile.image("test/app", "v1", [LAYER])
        mirror = hostile.behave["v1"] = busy(503)
        (tmp_path / "sysconf").mkdir()
        (tmp_path / "sysconf/registries.conf").write_text(
            f'[[registry]]\nlocation = "{origin.host}"\n'
            f'  [[registry.mirror]]\n  location = "{hostile.host}"\n')
        result = berth(["import", f"docker://{origin.host}#test/app:v1"], dict(env, **RETRIES),
                       tmp_path, timeout=60)
    finally:
        origin.stop()
    assert result.returncode == 0, result.stderr
    assert len(mirror.times) == 1
    assert waits(result) == [] and "trying the next" in result.stderr


# -- a broken download resumes ----------------------------------------------------------------

def reset(handler):
    """Reset the connection (RST, not an orderly close) once the client's
    kernel has taken every byte written."""
    sock = handler.connection
    give_up = time.monotonic() + 10
    while struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0" * 4))[0] and \
            time.monotonic() < give_up:
        time.sleep(0.01)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()
    handler.close_connection = True


def test_a_download_reset_midway_resumes_with_a_range(tmp_path, env, hostile):
    # 3 MiB that gzip cannot shrink: the client keeps at least the first 1 MiB read
    layer = gzipped(layer_tar(("file", "noise", os.urandom(3 << 20))))
    image = hostile.image("test/app", "v1", [layer])
    ranges = []

    def answer(hostile, handler, body):
        asked = handler.headers.get("Range")
        ranges.append(asked)
        if asked is None:  # half the blob, then a reset
            hostile.send(handler, 200, b"", length=len(body))
            hostile.write(handler, body[:len(body) // 2])
            return reset(handler)
        start = int(asked.removeprefix("bytes=").removesuffix("-"))
        hostile.send(handler, 206, b"",
                     {"Content-Range": f"bytes {start}-{len(body) - 1}/{len(body)}"},
                     length=len(body) - start)
        hostile.write(handler, body[start:])
    hostile.behave[image["layers"][0]] = answer

    result = run_import(hostile, tmp_path, env, **RETRIES)
    assert result.returncode == 0, result.stderr
    assert len(ranges) == 2 and ranges[0] is None, ranges
    start = int(ranges[1].removeprefix("bytes=").removesuffix("-"))
    assert 0 < start <= len(layer) // 2
    blob = tmp_path / "cache/blobs/sha256" / image["layers"][0][7:]
    assert sha256(blob.read_bytes()) == image["layers"][0]
    [line] = waits(result)
    assert f"after {start} of {len(layer)} bytes" in line, line


def cut_every(piece, how, ranges, ranged=True):
    """Answer a blob from the Range asked for (the whole, without one or
    where not `ranged`), its Content-Length saying all that is left, but
    send `piece` bytes of it at most, then end the connection (`how`:
    "close", an orderly close, or "reset"); `ranges` records the Range of
    each request."""
    def answer(hostile, handler, body):
        asked = handler.headers.get("Range")
        ranges.append(asked)
        start = int(asked.removeprefix("bytes=").removesuffix("-")) if asked and ranged else 0
        status, headers = (206, {"Content-Range": f"bytes {start}-{len(body) - 1}/{len(body)}"}) \
            if start else (200, {})
        hostile.send(handler, status, b"", headers, length=len(body) - start)
        hostile.write(handler, body[start:start + piece])
        if how == "reset":
            return reset(handler)
        handler.close_connection = True
    return answer


@pytest.mark.parametrize("how", ["close", "reset"])
def test_a_download_cut_short_of_a_mib_keeps_every_byte_it_got(tmp_path, env, hostile, how):
    """Each try resumes where the last one's bytes ended: a read of 1 MiB
    that a cut broke lost all it had taken, so a registry that cut more
    often than every MiB never got a download past its first byte."""
    layer = gzipped(layer_tar(("file", "noise", os.urandom(1 << 20))))
    image = hostile.image("test/app", "v1", [layer])
    ranges, piece = [], 400_000  # (not a power of two: no read size ends where it does)
    hostile.behave[image["layers"][0]] = cut_every(piece, how, ranges)
    result = run_import(hostile, tmp_path, env, ENROOT_TRANSFER_RETRIES="2")
    assert result.returncode == 0, result.stderr
    assert ranges == [None, f"bytes={piece}-", f"bytes={2 * piece}-"]
    blob = tmp_path / "cache/blobs/sha256" / image["layers"][0][7:]
    assert sha256(blob.read_bytes()) == image["layers"][0]
    first, second = waits(result)
    assert f"after {piece} of {len(layer)} bytes" in first, first
    assert f"after {2 * piece} of {len(layer)} bytes" in second, second


def test_a_try_that_moved_a_download_on_starts_its_retries_over(tmp_path, env, hostile):
    """Three cuts, two retries, a bound of 2 s: counted as tries that moved
    nothing, the third cut was one retry too many, and the doubling wait
    (0.5-1, 1-2, 2-4 s) passed the bound before it. Each try that moved the
    download on by a window's worth of the floor (2 KiB here) starts both over."""
    layer = gzipped(layer_tar(("file", "noise", os.urandom(768 << 10))))
    image = hostile.image("test/app", "v1", [layer])
    ranges, piece = [], 250_000
    hostile.behave[image["layers"][0]] = cut_every(piece, "close", ranges)
    result = run_import(hostile, tmp_path, env, ENROOT_TRANSFER_RETRIES="2",
                        ENROOT_TRANSFER_TIMEOUT="2")
    assert result.returncode == 0, result.stderr
    assert ranges == [None] + [f"bytes={n * piece}-" for n in (1, 2, 3)]
    lines = waits(result)
    assert len(lines) == 3 and all(line.endswith("retry 1 of 2)") for line in lines), lines
    delays = [float(line.rsplit("(in ", 1)[1].split(" s,")[0]) for line in lines]
    assert max(delays) <= 1.0, delays  # the first wait's 0.5-1 s, each time


@pytest.mark.parametrize("piece, ranged", [(20, True), (250_000, False)],
                         ids=["a-few-bytes-a-connection", "the-range-ignored"])
def test_tries_that_barely_move_a_download_use_up_its_retries(tmp_path, env, hostile, piece,
                                                              ranged):
    """Tries that move the download on by less than the floor asks of a
    window (10 KiB here), or only as far as it had got (the whole blob
    again for each Range, cut at the same place), count: the download ends
    at ENROOT_TRANSFER_RETRIES, not for ever or at the blob's end."""
    layer = gzipped(layer_tar(("file", "noise", os.urandom(768 << 10))))
    image = hostile.image("test/app", "v1", [layer])
    [digest] = image["layers"]
    ranges = []
    hostile.behave[digest] = cut_every(piece, "close", ranges, ranged)
    result = berth(["--quiet", "import", f"docker://{hostile.host}#test/app:v1"],
                   dict(env, ENROOT_TRANSFER_RETRIES="2", ENROOT_TRANSFER_TIMEOUT="10"),
                   tmp_path, timeout=60)
    one_line_error(result, f"download of {digest} from {hostile.host} failed: ",
                   f"(tried {len(ranges)} times in ", "; ENROOT_TRANSFER_RETRIES=2)")
    assert ranges == [None, f"bytes={piece}-", f"bytes={2 * piece if ranged else piece}-"]


# -- a document that drips (issue #42, item 4) --------------------------------------------------

def drip_forever(length):
    """Announce `length` bytes, then send one every 0.5 s: never a stall."""
    def answer(hostile, handler, body):
        hostile.send(handler, 200, b"", {"Content-Type": OCI_MANIFEST}, length=length)
        while not hostile.release.wait(0.5):
            hostile.write(handler, b" ")
    return answer


@pytest.mark.parametrize("what", ["manifest", "resolve", "config"])
def test_a_document_that_drips_ends_at_the_transfer_timeout(tmp_path, env, hostile, what):
    config = json.dumps({"architecture": "amd64", "os": "linux", "config": {}}).encode()
    hostile.image("test/app", "v1", [LAYER], raw_config=config,
                  declared={sha256(config): 1 << 20})
    if what == "config":
        hostile.behave[sha256(config)] = drip_forever(1 << 20)
        needle = f"reading image config {sha256(config)} of"
    else:
        hostile.behave["v1"] = drip_forever((4 << 20) - 1)  # under the 4 MiB cap
        needle = "reading manifest v1 of"
    flags = ["--resolve"] if what == "resolve" else []  # (over http.client, not requests)
    result = run_import(hostile, tmp_path, env, *flags, ENROOT_TRANSFER_TIMEOUT="2")
    one_line_error(result, needle, "failed: not whole within 2 s (ENROOT_TRANSFER_TIMEOUT)")


def drip_head():
    """A status line, then a header a byte every 0.5 s: never a stall, never a whole head."""
    def answer(hostile, handler, body):
        hostile.write(handler, b"HTTP/1.1 200 OK\r\nX-Slow: ")
        while not hostile.release.wait(0.5):
            hostile.write(handler, b"x")
    return answer


@pytest.mark.parametrize("what", ["pull", "resolve"])
def test_an_answer_whose_headers_drip_ends_at_the_transfer_timeout(tmp_path, env, hostile, what):
    """The store's service imports for every user: a registry that sends its
    headers a byte at a time must not hold it (or anyone) for as long as it likes."""
    hostile.image("test/app", "v1", [LAYER])
    hostile.behave["v1"] = drip_head()
    flags = ["--resolve"] if what == "resolve" else []  # (over http.client, not requests)
    result, took = timed(lambda: run_import(hostile, tmp_path, env, *flags,
                                            ENROOT_TRANSFER_TIMEOUT="2"))
    one_line_error(result,
                   "the answer's headers not whole within 4 s (twice ENROOT_TRANSFER_TIMEOUT)")
    assert took < 12, took  # the head's 4 s, and no wait that would pass the bound


# -- what asking again will not mend ends at once (issue #61) -----------------------------

NO_SUCH_HOST = "nosuchhost.invalid"  # RFC 2606: a name that never resolves


def timed(run):
    """(what run() returns, the seconds it took)"""
    began = time.monotonic()
    result = run()
    return result, time.monotonic() - began


def berth_hosts_only(args, env, tmp_path):
    """`berth ARGS` where names resolve from /etc/hosts alone (a mount
    namespace of its own, its nsswitch.conf "hosts: files"): the resolver
    answers NO_SUCH_HOST at once, with no DNS server asked, offline or not."""
    nsswitch = tmp_path / "nsswitch.conf"
    nsswitch.write_text("hosts: files\n")
    command = ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c",
               'mount --bind "$0" /etc/nsswitch.conf && exec "$@"', str(nsswitch),
               sys.executable, "-m", "berth.cli", *args]
    return subprocess.run(command, env=dict(env, PYTHONPATH=str(RUNTIME)), cwd=tmp_path,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=60, check=False)


@pytest.mark.namespaces
def test_a_name_that_does_not_resolve_ends_at_once(tmp_path, env):
    result, took = timed(lambda: berth_hosts_only(
        ["import", "--cache-only", f"docker://{NO_SUCH_HOST}#x/y:1"], dict(env, **RETRIES),
        tmp_path))
    one_line_error(result, f"berth: error: registry {NO_SUCH_HOST}: Name or service not known\n")
    assert took < AT_ONCE, took


def test_a_refused_connection_ends_at_once(tmp_path, env):
    closed = f"127.0.0.1:{free_port()}"  # nothing listens there
    result, took = timed(lambda: berth(["import", "--cache-only", f"docker://{closed}#x/y:1"],
                                       dict(env, **RETRIES), tmp_path, timeout=60))
    one_line_error(result, f"berth: error: registry {closed}: Connection refused\n")
    assert took < AT_ONCE, took


@pytest.mark.parametrize("basic", [None, "Basic eDp5"], ids=["404", "401"])
def test_no_such_image_or_no_access_ends_at_once(tmp_path, env, basic):
    hostile = HostileRegistry(basic=basic)
    try:
        result, took = timed(lambda: run_import(hostile, tmp_path, env, "--cache-only",
                                                **RETRIES))
        asked = len(hostile.requests)
    finally:
        hostile.stop()
    needle = "image not found: " if basic is None else "refused access to test/app (401"
    one_line_error(result, needle)
    assert waits(result) == [] and asked <= 2, hostile.requests  # (a 401, then its login)
    assert took < AT_ONCE, took


@pytest.mark.parametrize("status", [408, 500, 503])
def test_a_busy_answer_then_the_image_is_waited_for(tmp_path, env, hostile, status):
    hostile.image("test/app", "v1", [LAYER])
    manifest = hostile.behave["v1"] = busy(status, None)
    result, took = timed(lambda: run_import(hostile, tmp_path, env, "--cache-only", **RETRIES))
    assert result.returncode == 0, result.stderr
    assert Path(result.stdout.strip()).is_file(), result.stdout
    assert len(manifest.times) == 2
    assert took < 1.0 + AT_ONCE, took  # the first retry's wait is 1 s at most
    [line] = waits(result)
    assert f"manifest v1 answered {status} " in line and line.endswith("retry 1 of 5)"), line


@pytest.mark.parametrize("what", ["no-such-host", "404", "401"])
def test_a_resolve_that_will_not_pass_ends_with_its_status(tmp_path, env, what):
    """The plugin refuses the job on porcelain.PERMANENT (its answer_status.h)."""
    if what == "no-such-host":
        result = berth_hosts_only(["import", "--resolve", f"docker://{NO_SUCH_HOST}#x/y:1"],
                                  dict(env, **RETRIES), tmp_path)
    else:
        hostile = HostileRegistry(basic="Basic eDp5" if what == "401" else None)
        try:
            result = run_import(hostile, tmp_path, env, "--resolve", **RETRIES)
        finally:
            hostile.stop()
    assert result.returncode == porcelain.PERMANENT, result.stderr
    assert result.stderr.startswith("berth: error: ") and result.stderr.count("\n") == 1, \
        result.stderr


@pytest.mark.parametrize("answer", ["refused", "503"])
def test_a_resolve_that_may_pass_asks_once_and_leaves_it_to_the_nodes(tmp_path, env, hostile,
                                                                       answer):
    """A failure that may pass ends with 1 (the nodes try again, with
    their retries), after one request: retried at submission as well, a
    busy registry would hold the job twice as long."""
    hostile.image("test/app", "v1", [LAYER])
    manifest = hostile.behave["v1"] = busy(503)
    uri = f"docker://127.0.0.1:{free_port()}#test/app:v1" if answer == "refused" else \
        f"docker://{hostile.host}#test/app:v1"
    result, took = timed(lambda: berth(["import", "--resolve", uri], dict(env, **RETRIES),
                                       tmp_path, timeout=60))
    one_line_error(result, "Connection refused" if answer == "refused" else "answered 503")
    assert len(manifest.times) == (0 if answer == "refused" else 1)
    assert took < AT_ONCE, took
