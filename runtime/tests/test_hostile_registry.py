"""`berth import` against a registry that lies, floods and stalls, and
images built to break the importer (issue #11): each is bounded and ends
in one line naming the input, never a traceback.

The registry here is HostileRegistry (registry_fixture.py), in this
process: no docker-registry needed.
"""

import base64
import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from registry_fixture import (
    OCI_MANIFEST,
    HostileRegistry,
    SilentServer,
    berth,
    drip,
    flood,
    gzipped,
    layer_tar,
    redirect,
    sha256,
    stall,
)

from berth import config
from berth.errors import BerthError
from berth.image.reference import parse
from berth.image.registry import MAX_CONFIG, MAX_MANIFEST, Registry, _CutShort, check_complete
from berth.image.transport import Direct, reason

LAYER = gzipped(layer_tar(("dir", "etc"), ("file", "etc/os-release", b"ID=hostile\n")))
BIG = 64 << 20  # what a flood sends at most: far past every limit, bounded for the old code


@pytest.fixture
def hostile():
    registry = HostileRegistry()
    yield registry
    registry.stop()


def one_line_error(result, *needles):
    assert result.returncode == 1, result.stderr
    assert result.stderr.startswith("berth: error: "), result.stderr[-3000:]
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, \
        result.stderr[-3000:]
    for needle in needles:
        assert needle in result.stderr, result.stderr


def assert_no_partial(tmp_path):
    """No temporary blob, unpack tree, image or output left behind."""
    blobs = tmp_path / "cache/blobs/sha256"
    assert not blobs.exists() or [p.name for p in blobs.iterdir() if p.name[0] == "."] == []
    assert list((tmp_path / "temp").iterdir()) == []
    assert list(tmp_path.glob("*.sqsh*")) == []


def run_import(hostile, tmp_path, env, name="test/app:v1", **settings):
    return berth(["import", f"docker://{hostile.host}#{name}"], dict(env, **settings), tmp_path)


# -- sizes ----------------------------------------------------------------------

@pytest.mark.parametrize("announce", [True, False], ids=["content-length", "until-close"])
def test_blob_larger_than_declared_is_cut_and_refused(tmp_path, env, hostile, announce):
    layer = sha256(LAYER)
    hostile.image("test/app", "v1", [LAYER], declared={layer: 100})
    hostile.behave[layer] = flood(BIG, announce)
    result = run_import(hostile, tmp_path, env)
    one_line_error(result, f"blob {layer} of test/app larger than the 100 bytes its "
                           "manifest declares")
    assert not (tmp_path / "cache/blobs/sha256" / layer[7:]).exists()
    assert_no_partial(tmp_path)
    # Cut at once: what was sent is what the sockets held, not the flood.
    assert hostile.sent[f"/v2/test/app/blobs/{layer}"] < BIG // 2


def test_config_declared_huge_is_refused_unread(tmp_path, env, hostile):
    image = hostile.image("test/app", "v1", [LAYER])
    hostile.image("test/app", "v1", [LAYER], declared={image["config"]: BIG})  # the same blobs
    hostile.behave[image["config"]] = flood(BIG)
    result = run_import(hostile, tmp_path, env)
    one_line_error(result, f"image config {image['config']}", f"{BIG} bytes",
                   f"more than the {MAX_CONFIG >> 20} MiB")
    assert f"/v2/test/app/blobs/{image['config']}" not in hostile.requests
    assert_no_partial(tmp_path)


@pytest.mark.parametrize("announce", [True, False], ids=["content-length", "until-close"])
def test_config_larger_than_declared_is_cut(tmp_path, env, hostile, announce):
    image = hostile.image("test/app", "v1", [LAYER])
    hostile.behave[image["config"]] = flood(BIG, announce)
    result = run_import(hostile, tmp_path, env)
    one_line_error(result, f"image config {image['config']}",
                   "is larger than the size its manifest declares")
    assert hostile.sent[f"/v2/test/app/blobs/{image['config']}"] < BIG // 2
    assert_no_partial(tmp_path)


@pytest.mark.parametrize("announce", [True, False], ids=["content-length", "until-close"])
def test_huge_manifest_is_refused(tmp_path, env, hostile, announce):
    hostile.image("test/app", "v1", [LAYER])
    hostile.behave["v1"] = flood(BIG, announce)
    result = run_import(hostile, tmp_path, env)
    one_line_error(result, "manifest v1 of", f"larger than the {MAX_MANIFEST >> 20} MiB")
    assert hostile.sent["/v2/test/app/manifests/v1"] < BIG // 2


# -- timeouts and signals -------------------------------------------------------------

def registry_settings(**settings):
    cfg = config.load({"HOME": "/nonexistent", "ENROOT_SYSCONF_PATH": "/nonexistent",
                       **settings})
    return Registry(parse("docker://127.0.0.1:1#test/app"), cfg).timeout


def test_transfer_timeout_is_a_stall_timeout_by_default():
    assert registry_settings() == (30, 60)
    assert registry_settings(ENROOT_TRANSFER_TIMEOUT="0") == (30, None)  # none, as in enroot
    assert registry_settings(ENROOT_TRANSFER_TIMEOUT="5", ENROOT_CONNECT_TIMEOUT="0") == \
        (None, 5)


class _Answer:
    """What check_complete reads of a transport's response: its headers and
    the body bytes taken off the wire."""

    def __init__(self, headers, received):
        self.headers = headers
        self.received = received


def test_a_body_cut_short_of_its_content_length_is_a_broken_transfer():
    """urllib3 2 raises for such a body; 1.26 (Debian 12's python3-urllib3,
    which nodes use) and http.client end it quietly. The client checks it
    either way, so a cut layer is retried as a broken transfer, not refused
    as tampered."""
    with pytest.raises(_CutShort) as cut:
        check_complete(_Answer({"Content-Length": "25"}, 10))
    assert reason(cut.value) == "Connection broken: IncompleteRead"
    check_complete(_Answer({"Content-Length": "25"}, 25))
    check_complete(_Answer({}, 10))  # chunked or until close: urllib3 checks those


@pytest.mark.parametrize("length", ["\u00b2", "9" * 5000])
def test_a_content_length_int_refuses_is_no_number(length):
    """'²' passed str.isdigit() and 5,000 digits int()'s limit: both were
    ValueError tracebacks; no number, as an absent length."""
    check_complete(_Answer({"Content-Length": length}, 10))


@pytest.mark.parametrize("what", ["manifest", "layer"])
def test_a_stalled_answer_times_out(tmp_path, env, hostile, what):
    image = hostile.image("test/app", "v1", [LAYER])
    hostile.behave["v1" if what == "manifest" else image["layers"][0]] = \
        stall(None if what == "manifest" else 10)
    started = time.monotonic()
    result = run_import(hostile, tmp_path, env, ENROOT_TRANSFER_TIMEOUT="1")
    one_line_error(result, "timed out")
    assert time.monotonic() - started < 15
    assert_no_partial(tmp_path)


def test_a_server_that_accepts_and_never_answers(tmp_path, env):
    silent = SilentServer()
    try:
        started = time.monotonic()
        result = berth(["import", f"docker://{silent.host}#test/app:v1"],
                       dict(env, ENROOT_CONNECT_TIMEOUT="1", ENROOT_TRANSFER_TIMEOUT="1"),
                       tmp_path)
        one_line_error(result, f"registry {silent.host}", "timed out")
        assert time.monotonic() - started < 15
    finally:
        silent.stop()


def test_a_slow_transfer_that_never_stalls_completes(tmp_path, env, hostile):
    layer = gzipped(layer_tar(("file", "noise", os.urandom(12 << 10))))
    image = hostile.image("test/app", "v1", [layer])
    # 2.4 s, no 1 s gap, 5 KiB/s: above the rate floor of 1 KiB/s
    hostile.behave[image["layers"][0]] = drip(pieces=6, pause=0.4)
    result = run_import(hostile, tmp_path, env, ENROOT_TRANSFER_TIMEOUT="1")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "test+app+v1.sqsh").is_file()


def drip_bytes(pause):
    """Announce the whole blob, then send it a byte every `pause` seconds
    (never a stall, for a stall timeout longer than that) until released."""
    def answer(hostile, handler, body):
        hostile.send(handler, 200, b"", length=len(body))
        for at in range(len(body)):
            if hostile.release.wait(pause):
                return
            hostile.write(handler, body[at:at + 1])
    return answer


def test_a_blob_under_the_rate_floor_fails_within_its_retries(tmp_path, env, hostile):
    """A byte every 0.75 s never trips a stall timeout of 2 s, and held the
    import (and, through the shared store, every import waiting on it) for
    as long as the blob lasted: each try now ends at its first window of 2 s
    under 1 KiB/s, and is retried as a stalled one is."""
    image = hostile.image("test/app", "v1", [LAYER])
    [layer] = image["layers"]
    hostile.behave[layer] = drip_bytes(0.75)
    result = berth(["--quiet", "import", f"docker://{hostile.host}#test/app:v1"],
                   dict(env, ENROOT_TRANSFER_TIMEOUT="2", ENROOT_TRANSFER_RETRIES="1"),
                   tmp_path, timeout=20)
    one_line_error(result, f"download of {layer} from {hostile.host} failed: moved ",
                   " bytes in ", " s, under the floor of 1 KiB/s over ENROOT_TRANSFER_TIMEOUT=2 s "
                   "(tried 2 times in ", "; ENROOT_TRANSFER_RETRIES=1)")
    assert hostile.requests.count(f"/v2/test/app/blobs/{layer}") == 2
    assert_no_partial(tmp_path)


def import_then_sigterm(hostile, tmp_path, env, under_way):
    """Start an import, SIGTERM it once under_way() holds; (exit status, stderr,
    seconds from the signal to its exit)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "berth.cli", "import", f"docker://{hostile.host}#test/app:v1"],
        env=env, cwd=tmp_path, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while not under_way():
            assert time.monotonic() < deadline and process.poll() is None
            time.sleep(0.05)
        time.sleep(0.2)
        signalled = time.monotonic()
        process.terminate()
        status = process.wait(5)
        took = time.monotonic() - signalled
    finally:
        process.kill()
        process.wait()
    return status, process.stderr.read(), took


def test_sigterm_ends_a_stalled_download_at_once(tmp_path, env, hostile):
    image = hostile.image("test/app", "v1", [LAYER, gzipped(layer_tar(("file", "b", b"b")))])
    for layer in image["layers"]:
        hostile.behave[layer] = stall(10)  # and the default stall timeout (60 s) applies
    blobs = tmp_path / "cache/blobs/sha256"

    def both_downloads_stalled():  # each has sent its first bytes into a partial file
        sent = sum(hostile.sent.get(f"/v2/test/app/blobs/{d}", 0) for d in image["layers"])
        return sent >= 20 and len(list(blobs.glob(".partial-*"))) == 2
    status, stderr, took = import_then_sigterm(hostile, tmp_path, env, both_downloads_stalled)
    assert status == 1
    assert stderr == "berth: error: import interrupted by SIGTERM\n"
    assert took < 1.0, took
    assert list(blobs.iterdir()) == []
    assert_no_partial(tmp_path)


def test_what_a_sigkilled_download_left_goes_with_the_next_import_or_a_prune(tmp_path, env,
                                                                              hostile):
    image = hostile.image("test/app", "v1", [LAYER])
    [layer] = image["layers"]
    blobs = tmp_path / "cache/blobs/sha256"

    def left_behind():
        """SIGKILL the import once its download has a partial file (no cleanup runs)."""
        hostile.behave[layer] = stall(10)
        process = subprocess.Popen(
            [sys.executable, "-m", "berth.cli", "import", f"docker://{hostile.host}#test/app:v1"],
            env=env, cwd=tmp_path, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 30
            while not list(blobs.glob(".partial-*")):
                assert time.monotonic() < deadline and process.poll() is None
                time.sleep(0.05)
        finally:
            process.kill()
            process.wait()
        hostile.behave.pop(layer)
        [partial] = blobs.glob(".partial-*")
        return partial

    partial = left_behind()
    result = run_import(hostile, tmp_path, env)
    assert result.returncode == 0, result.stderr
    assert not partial.exists()
    assert sorted(p.name for p in blobs.iterdir()) == [layer[7:]]

    for image_file in tmp_path.glob("*.sqsh"):  # the import's output
        image_file.unlink()
    shutil.rmtree(tmp_path / "cache")
    partial = left_behind()
    result = berth(["cache", "prune", "--max-size", "0"], env, tmp_path)
    assert result.returncode == 0, result.stderr
    assert not partial.exists(), result.stdout


def test_sigterm_ends_a_wait_for_a_stalled_manifest_at_once(tmp_path, env, hostile):
    hostile.image("test/app", "v1", [LAYER])
    hostile.behave["v1"] = stall(None)
    status, stderr, took = import_then_sigterm(
        hostile, tmp_path, env, lambda: "/v2/test/app/manifests/v1" in hostile.requests)
    assert status == 1
    assert stderr == "berth: error: import interrupted by SIGTERM\n"
    assert took < 1.0, took


def slow_gzip(tmp_path):
    """An ENROOT_GZIP_PROGRAM that says its pid in gzip.pid and then hangs."""
    slow = tmp_path / "slow-gzip"
    slow.write_text(f"#!/bin/sh\necho $$ > {tmp_path}/gzip.pid\nexec sleep 60\n")
    slow.chmod(0o755)
    return slow


def test_sigterm_ends_a_stalled_unpack_at_once(tmp_path, env, hostile):
    hostile.image("test/app", "v1", [LAYER])
    env = dict(env, ENROOT_GZIP_PROGRAM=str(slow_gzip(tmp_path)))
    try:
        status, stderr, took = import_then_sigterm(
            hostile, tmp_path, env, (tmp_path / "gzip.pid").exists)
    finally:
        with contextlib.suppress(ProcessLookupError, ValueError, FileNotFoundError):
            os.kill(int((tmp_path / "gzip.pid").read_text()), signal.SIGKILL)
    assert status == 1
    assert stderr == "berth: error: import interrupted by SIGTERM\n"
    assert took < 1.0, took
    assert_no_partial(tmp_path)  # the unpack tree included


# -- settings that make no sense -----------------------------------------------------------

@pytest.mark.parametrize("key", ["ENROOT_CONNECT_TIMEOUT", "ENROOT_TRANSFER_TIMEOUT",
                                 "ENROOT_TRANSFER_RETRIES"])
def test_negative_settings_are_named(tmp_path, env, hostile, key):
    hostile.image("test/app", "v1", [LAYER])
    result = run_import(hostile, tmp_path, env, **{key: "-1"})
    one_line_error(result, f"{key}: expected 0 or more, got '-1'")


# A timeout past what a socket takes (OverflowError at the first request), a
# pool size that filled a queue for ever at 100 % CPU: refused before any
# request, in one line naming the setting.
@pytest.mark.parametrize("key, value, bound", [
    ("ENROOT_CONNECT_TIMEOUT", "10000000000", "at most 86400"),
    ("ENROOT_TRANSFER_TIMEOUT", "99999999999999999999", "at most 86400"),
    ("ENROOT_TRANSFER_RETRIES", "1000000", "at most 100"),
    ("ENROOT_MAX_CONNECTIONS", "99999999999999999999", "at most 256"),
    ("ENROOT_MAX_CONNECTIONS", "0", "1 or more"),
])
def test_huge_settings_are_named_before_any_request(tmp_path, env, hostile, key, value, bound):
    hostile.image("test/app", "v1", [LAYER])
    result = run_import(hostile, tmp_path, env, **{key: value})
    one_line_error(result, f"{key}: expected {bound}, got '{value}'")
    assert hostile.requests == []


def test_a_setting_with_a_newline_is_quoted_on_one_line(tmp_path, env, hostile):
    result = run_import(hostile, tmp_path, env, ENROOT_MAX_CONNECTIONS="4\nfive")
    one_line_error(result, "ENROOT_MAX_CONNECTIONS: expected a number, got '4\\nfive'")


# -- images built to break the importer ---------------------------------------------------

def test_layer_paths_1500_directories_deep(tmp_path, env, hostile):
    deep = "/".join(["d"] * 1500)
    hostile.image("test/app", "v1", [gzipped(layer_tar(("file", f"{deep}/f", b"x")))])
    result = run_import(hostile, tmp_path, env)
    one_line_error(result, "lies more than 512 directories deep; refusing the layer")
    assert_no_partial(tmp_path)


@pytest.mark.parametrize("settings, needle", [
    ({"Entrypoint": "/bin/app --serve"}, "config.Entrypoint is a string, not a list of strings"),
    ({"Cmd": ["ok", 1]}, "config.Cmd is a list holding a non-string, not a list of strings"),
    ({"WorkingDir": 7}, "config.WorkingDir is a number, not a string"),
    ({"User": ["root"]}, "config.User is a list, not a string"),
    ({"Env": ["A=1", {"B": "2"}]}, "config.Env is a list holding a non-string"),
    ({"Env": "A=1"}, "config.Env is a string, not a list of strings"),
    ({"Env": ["A=1\nB=2"]}, "config.Env holds a NUL or newline character"),
    (["not", "an", "object"], "'config' is a list, not an object"),
])
def test_image_config_of_the_wrong_shape(tmp_path, env, hostile, settings, needle):
    hostile.image("test/app", "v1", [LAYER], {"architecture": "amd64", "os": "linux",
                                              "config": settings})
    result = run_import(hostile, tmp_path, env)
    one_line_error(result, f"the image config of docker://{hostile.host}#test/app:v1: {needle}")
    assert_no_partial(tmp_path)


# Named ids: Debian 13's pytest (8.3) names a case by its bytes, and the
# 200 kB one then reaches every child's environment in PYTEST_CURRENT_TEST
# (E2BIG: one environment string is at most 128 kB).
@pytest.mark.parametrize("raw", [b"[" * 100_000 + b"]" * 100_000, b"\xff\xfe", b"[1, 2]"],
                         ids=["deeply-nested", "not-utf8", "a-list"])
def test_image_config_not_a_json_object(tmp_path, env, hostile, raw):
    hostile.image("test/app", "v1", [LAYER], raw_config=raw)
    result = run_import(hostile, tmp_path, env)
    one_line_error(result, "image config")


@pytest.mark.parametrize("field, value", [
    ("size", -1), ("size", "100"), ("size", 1.5), ("digest", "sha256:../../v2"),
    ("digest", 5)])
def test_manifest_descriptor_of_the_wrong_shape(tmp_path, env, hostile, field, value):
    hostile.image("test/app", "v1", [LAYER])
    manifest = json.loads(hostile.manifests[("test/app", "v1")])
    manifest["layers"][0][field] = value
    hostile.manifests[("test/app", "v1")] = json.dumps(manifest).encode()
    result = run_import(hostile, tmp_path, env)
    one_line_error(result, "the manifest or image config of", "is malformed")


# -- what an import leaves, and what it needs --------------------------------------------

def dead_pid():
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def unpack_tree(temp, pid, suffix):
    tree = temp / f"berth-import-{pid}-{suffix}"
    (tree / "rootfs/etc").mkdir(parents=True)
    (tree / "rootfs/etc/file").write_text("x")
    return tree


def test_trees_of_killed_imports_are_removed_by_the_next_import_and_prune(
        tmp_path, env, hostile):
    hostile.image("test/app", "v1", [LAYER])
    temp = tmp_path / "temp"
    # An import killed (SIGKILL) while it unpacks: its gzip program waits.
    slow = slow_gzip(tmp_path)
    process = subprocess.Popen(
        [sys.executable, "-m", "berth.cli", "import", f"docker://{hostile.host}#test/app:v1"],
        env=dict(env, ENROOT_GZIP_PROGRAM=str(slow)), cwd=tmp_path,
        stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "gzip.pid").exists():
            assert time.monotonic() < deadline and process.poll() is None
            time.sleep(0.05)
    finally:
        process.kill()
        process.wait()
    os.kill(int((tmp_path / "gzip.pid").read_text()), signal.SIGKILL)
    killed = [p.name for p in temp.iterdir()]
    assert len(killed) == 1 and killed[0].startswith(f"berth-import-{process.pid}-")

    # Trees never to touch: a live owner (this process), a dead pid whose
    # lock is held (an import in another pid namespace), another user's.
    mine_alive = unpack_tree(temp, os.getpid(), "aaaaaaaa")
    locked = unpack_tree(temp, dead_pid(), "bbbbbbbb")
    lock = os.open(locked, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(lock, fcntl.LOCK_EX)
    others = None
    if os.getuid() == 0:
        others = unpack_tree(temp, dead_pid(), "cccccccc")
        for path in (others, others / "rootfs", others / "rootfs/etc"):
            shutil.chown(path, "nobody")
    unrelated = temp / "berth-import-notapid"
    unrelated.mkdir()
    try:
        result = run_import(hostile, tmp_path, env)
        assert result.returncode == 0, result.stderr
        kept = sorted(p.name for p in temp.iterdir())
        assert killed[0] not in kept
        assert kept == sorted(p.name for p in (mine_alive, locked, others, unrelated) if p)

        # And `berth cache prune` does the same.
        stale = unpack_tree(temp, dead_pid(), "dddddddd")
        prune = berth(["cache", "prune", "--older-than", "30"], env, tmp_path)
        assert prune.returncode == 0, prune.stderr
        assert prune.stdout.count(f"removed {stale} (left by a killed import)\n") == 1
        assert not stale.exists() and locked.exists() and mine_alive.exists()
    finally:
        os.close(lock)


def test_a_read_only_cache_holding_the_image_serves_a_plain_import(tmp_path, env, hostile):
    hostile.image("test/app", "v1", [LAYER])
    first = run_import(hostile, tmp_path, env)
    assert first.returncode == 0, first.stderr
    (tmp_path / "test+app+v1.sqsh").unlink()
    cache = tmp_path / "cache"
    if os.getuid() == 0:  # root writes through modes: a read-only bind mount instead
        mounted = subprocess.run(["mount", "--bind", str(cache), str(cache)], check=False)
        if mounted.returncode != 0:
            pytest.skip("cannot bind-mount the cache read-only")
        subprocess.run(["mount", "-o", "remount,bind,ro", str(cache)], check=True)
    else:
        subprocess.run(["chmod", "-R", "a-w", str(cache)], check=True)
    try:
        for args in ([], ["--reuse"]):
            result = berth(["import", *args, f"docker://{hostile.host}#test/app:v1"], env,
                           tmp_path)
            assert result.returncode == 0, result.stderr
            assert (tmp_path / "test+app+v1.sqsh").is_file()
            (tmp_path / "test+app+v1.sqsh").unlink()
    finally:
        if os.getuid() == 0:
            subprocess.run(["umount", str(cache)], check=True)
        else:
            subprocess.run(["chmod", "-R", "u+w", str(cache)], check=True)


# -- a resolve: the same answers over http.client --------------------------------------

def run_resolve(hostile, tmp_path, env, name="test/app:v1", **settings):
    return berth(["import", "--resolve", f"docker://{hostile.host}#{name}"],
                 dict(env, **settings), tmp_path)


def assert_nothing_written(tmp_path):
    assert not (tmp_path / "cache").exists() and list((tmp_path / "temp").iterdir()) == []


def test_a_resolve_loads_neither_requests_nor_urllib3(tmp_path, env, hostile):
    image = hostile.image("test/app", "v1", [LAYER])
    script = ("import sys\nfrom berth import cli\nstatus = cli.main(sys.argv[1:])\n"
              "heavy = sorted(m for m in sys.modules if m.split('.')[0] in "
              "('requests', 'urllib3', 'tqdm', 'tarfile', 'berth.image.pull'))\n"
              "print('loaded:', heavy)\nsys.exit(status)\n")
    result = subprocess.run(
        [sys.executable, "-c", script, "import", "--resolve",
         f"docker://{hostile.host}#test/app:v1"], env=env, cwd=tmp_path,
        capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout == (f"docker://{hostile.host}#test/app@{image['manifest']}\n"
                             "loaded: []\n")


@pytest.mark.parametrize("announce", [True, False], ids=["content-length", "until-close"])
def test_a_resolve_refuses_a_huge_manifest(tmp_path, env, hostile, announce):
    hostile.image("test/app", "v1", [LAYER])
    hostile.behave["v1"] = flood(BIG, announce)
    result = run_resolve(hostile, tmp_path, env)
    one_line_error(result, "manifest v1 of", f"larger than the {MAX_MANIFEST >> 20} MiB")
    assert result.stdout == "" and hostile.sent["/v2/test/app/manifests/v1"] < BIG // 2
    assert_nothing_written(tmp_path)


def answer_with(body, content_type, length=None):
    def answer(hostile, handler, _):
        hostile.send(handler, 200, body, {"Content-Type": content_type},
                     length=True if length is None else length)
        if length is not None:
            handler.close_connection = True
    return answer


@pytest.mark.parametrize("behave, needle", [
    (answer_with(b'{"schemaVersion": 2}', "text/html"),
     "unsupported manifest type 'text/html'"),
    (answer_with(b"<html>not found</html>", OCI_MANIFEST), "is not JSON"),
    (answer_with(b"[1, 2]", OCI_MANIFEST), "is not a JSON object"),
    (answer_with(b'{"schemaVersion": 2}', OCI_MANIFEST, length=500),
     "registry {host}: reading manifest v1 of {host}/test/app:v1 failed: Connection broken: "
     "IncompleteRead"),
], ids=["wrong-content-type", "not-json", "not-an-object", "cut-short"])
def test_a_resolve_refuses_a_bad_manifest(tmp_path, env, hostile, behave, needle):
    hostile.image("test/app", "v1", [LAYER])
    hostile.behave["v1"] = behave
    result = run_resolve(hostile, tmp_path, env)
    one_line_error(result, needle.format(host=hostile.host))
    assert result.stdout == ""


@pytest.mark.parametrize("verb", ["resolve", "import"])
def test_credentials_stay_with_their_own_host_across_a_redirect(tmp_path, env, verb):
    """A registry that redirects its manifest elsewhere: followed, but its
    Basic credentials are not sent there (over http.client for a resolve,
    requests for an import: the one redirect rule of registry.py)."""
    login = "Basic " + base64.b64encode(b"alice:secret").decode()
    guarded, elsewhere = HostileRegistry(basic=login), HostileRegistry()
    try:
        image = guarded.image("test/app", "v1", [LAYER])
        elsewhere.image("test/app", "v1", [LAYER])
        guarded.behave["v1"] = redirect(f"http://{elsewhere.host}{{path}}")
        credentials = Path(env["ENROOT_CONFIG_PATH"]) / ".credentials"
        credentials.parent.mkdir(parents=True, exist_ok=True)
        credentials.write_text(f"machine {guarded.host} login alice password secret\n")
        credentials.chmod(0o600)
        args = ["--resolve"] if verb == "resolve" else ["--cache-only"]
        result = berth(["-q", "import", *args, f"docker://{guarded.host}#test/app:v1"], env,
                       tmp_path)
        assert result.returncode == 0, result.stderr
        if verb == "resolve":
            assert result.stdout == f"docker://{guarded.host}#test/app@{image['manifest']}\n"
        assert elsewhere.requests == ["/v2/test/app/manifests/v1"]
        assert elsewhere.authorizations == [None]
        assert guarded.authorizations[-1] == login  # (the last: a blob, for an import)
    finally:
        guarded.stop()
        elsewhere.stop()


@pytest.mark.parametrize("location, needle", [
    ("{path}", "more than 10 redirects from http://{host}/v2/test/app/manifests/v1"),
    ("file:///etc/passwd", "redirect from http://{host}/v2/test/app/manifests/v1 to "
                           "'file:///etc/passwd', no HTTP(S) URL"),
    ("http://[::1", "to 'http://[::1', no HTTP(S) URL"),
    ("http://127.0.0.1:notaport/x", "no HTTP(S) URL"),
], ids=["loop", "file", "bad-host", "bad-port"])
@pytest.mark.parametrize("verb", ["resolve", "import"])
def test_a_bad_redirect_is_one_line(tmp_path, env, hostile, location, needle, verb):
    hostile.image("test/app", "v1", [LAYER])
    hostile.behave["v1"] = redirect(location)
    result = berth(["import", "--resolve" if verb == "resolve" else "--cache-only",
                    f"docker://{hostile.host}#test/app:v1"], env, tmp_path)
    one_line_error(result, f"registry {hostile.host}: ", needle.format(host=hostile.host))
    assert len(hostile.requests) <= 12


def test_a_redirect_to_plain_http_needs_http_allowed():
    cfg = config.load({"HOME": "/nonexistent", "ENROOT_SYSCONF_PATH": "/nonexistent",
                       "ENROOT_ALLOW_HTTP": "no"})
    registry = Registry(parse("docker://registry.example#test/app"), cfg)
    with pytest.raises(BerthError) as refused:
        registry._redirect("registry registry.example", "https://registry.example/v2/x",
                           "http://cdn.example/blob")
    assert str(refused.value) == (
        "registry registry.example: redirect from https://registry.example/v2/x to plain "
        "HTTP http://cdn.example/blob; set ENROOT_ALLOW_HTTP=yes to allow it")
    assert registry._redirect("r", "https://registry.example/v2/x", "/v2/y") == \
        "https://registry.example/v2/y"
    insecure = Registry(parse("docker://registry.example#test/app"), cfg, insecure=True)
    assert insecure._redirect("r", "https://registry.example/v2/x", "http://cdn.example/b") \
        == "http://cdn.example/b"


def test_a_resolve_times_out_on_a_stalled_manifest(tmp_path, env, hostile):
    hostile.image("test/app", "v1", [LAYER])
    hostile.behave["v1"] = stall(None)
    started = time.monotonic()
    result = run_resolve(hostile, tmp_path, env, ENROOT_TRANSFER_TIMEOUT="1")
    one_line_error(result, f"registry {hostile.host}: timed out")
    assert time.monotonic() - started < 15


def test_a_resolve_against_a_server_that_never_answers(tmp_path, env):
    silent = SilentServer()
    try:
        started = time.monotonic()
        result = berth(["import", "--resolve", f"docker://{silent.host}#test/app:v1"],
                       dict(env, ENROOT_CONNECT_TIMEOUT="1", ENROOT_TRANSFER_TIMEOUT="1"),
                       tmp_path)
        one_line_error(result, f"registry {silent.host}: timed out")
        assert time.monotonic() - started < 15
    finally:
        silent.stop()


def test_too_many_headers_are_a_broken_answer(tmp_path, env, hostile):
    hostile.image("test/app", "v1", [LAYER])
    headers = {f"X-Junk-{i}": "x" for i in range(200)}
    hostile.behave["v1"] = lambda h, handler, body: h.send(handler, 200, body, headers)
    result = run_resolve(hostile, tmp_path, env)
    one_line_error(result, f"registry {hostile.host}: got more than 100 headers")


def test_one_connection_kept_and_a_dropped_one_replaced(hostile):
    """Direct keeps the connection of an answer read whole (a small body
    unread is read for that), and asks again on a new one when the server
    dropped the kept one meanwhile."""
    transport = Direct((5, 5), insecure=False)
    url = f"http://{hostile.host}/v2/"
    for _ in range(3):
        with transport.get(url, {}) as answer:  # closed unread
            assert answer.status_code == 200
    assert hostile.connections == 1
    hostile.hang_up = True  # from now on each connection serves one answer
    for _ in range(3):
        with transport.get(url, {}) as answer:
            assert answer.status_code == 200 and b"".join(answer.chunks(10)) == b"{}"
    assert hostile.connections == 3  # the kept one, then two new ones
