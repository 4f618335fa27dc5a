"""The squashfs image cache of `berth import` (a real registry, real
mksquashfs), and `berth cache` list and prune."""

import contextlib
import fcntl
import os
import pwd
import shutil
import stat
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from registry_fixture import (
    Registry,
    berth,
    berth_env,
    gzipped,
    imports_at_once,
    layer_tar,
    listing,
    unsquash,
)

from berth import cli, config
from berth.errors import BerthError
from berth.image import squash, verbs as cache_verb
from berth.image.imageconfig import read_image_config

pytestmark = pytest.mark.skipif(not shutil.which("docker-registry"),
                                reason="needs docker-registry (Debian package docker-registry)")

MKSQUASHFS = shutil.which("mksquashfs")
BASE = gzipped(layer_tar(("dir", "etc"), ("file", "etc/os-release", b"ID=berth\n")))
TOP = gzipped(layer_tar(("file", "etc/added", b"added\n")))
DAY = 86400
GZIP, ZSTD = 1, 6  # compressor ids in the squashfs superblock


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    reg = Registry(tmp_path_factory.mktemp("registry"))
    reg.app_digest = reg.push_image("test/app", "v1", [BASE, TOP])
    yield reg
    reg.stop()


def uri_of(proxy, image="test/app:v1"):
    return f"docker://{proxy.host}#{image}"


def entries(tmp_path):
    return sorted((tmp_path / "cache/images").glob("*.sqsh"))


def with_mksquashfs(tmp_path, env, script):
    """`env` with a mksquashfs of our own first on PATH: a sh script body
    (for all but `-help`, which asks the real one what it can do)."""
    directory = tmp_path / "fakebin"
    directory.mkdir(exist_ok=True)
    tool = directory / "mksquashfs"
    tool.write_text(f'#!/bin/sh\n[ "$1" = -help ] && exec {MKSQUASHFS} -help\n{script}\n')
    tool.chmod(0o755)
    return dict(env, PATH=f"{directory}:{env['PATH']}")


def failing_mksquashfs(tmp_path, env):
    return with_mksquashfs(tmp_path, env, "echo 'not to be run' >&2; exit 1")


def compressor(image):
    with open(image, "rb") as f:
        return struct.unpack("<20xH", f.read(22))[0]


def umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask


# -- import ------------------------------------------------------------------

def test_second_import_copies_the_cached_image(tmp_path, env, proxy):
    result = berth(["import", "-o", "first.sqsh", uri_of(proxy)], env, tmp_path)
    assert result.returncode == 0, result.stderr
    [summary] = result.stderr.splitlines()  # the line an import ends with, alone
    assert summary.startswith(f"berth: imported {uri_of(proxy)} to {tmp_path}/first.sqsh (")
    assert not summary.endswith("(nothing downloaded)")
    [entry] = entries(tmp_path)
    assert stat.S_IMODE(entry.stat().st_mode) == 0o644 & ~umask()
    os.utime(entry, (time.time() - 9 * DAY,) * 2)
    proxy.requests.clear()

    # Neither layers nor mksquashfs: the cached image serves alone.
    shutil.rmtree(tmp_path / "cache/blobs")
    result = berth(["import", "-o", "second.sqsh", uri_of(proxy)],
                   failing_mksquashfs(tmp_path, env), tmp_path)
    assert result.returncode == 0, result.stderr
    using, summary = result.stderr.splitlines()
    assert using == f"berth: using the cached squashfs of {proxy.host}/test/app:v1: {entry}"
    assert summary.endswith(", from the image cache (nothing downloaded)"), summary
    assert proxy.blob_requests() == []
    assert proxy.requests == ["/v2/test/app/manifests/v1"]  # a moved tag shows
    assert time.time() - entry.stat().st_mtime < 60  # used: last to be pruned

    first, second = tmp_path / "first.sqsh", tmp_path / "second.sqsh"
    assert first.read_bytes() == second.read_bytes() == entry.read_bytes()
    assert "/etc/added" in listing(second)
    for output in (first, second):  # copies, not links: writing one spares the cache
        assert output.stat().st_nlink == 1 and output.stat().st_ino != entry.stat().st_ino
        assert stat.S_IMODE(output.stat().st_mode) == 0o666 & ~umask()
    with open(second, "r+b") as f:
        f.write(b"scribble")
    assert entry.read_bytes() == first.read_bytes()

    quiet = berth(["--quiet", "import", "-o", "third.sqsh", uri_of(proxy)], env, tmp_path)
    assert quiet.returncode == 0 and quiet.stderr == ""
    assert entries(tmp_path) == [entry]
    assert sorted(p.name for p in tmp_path.glob("*.sqsh*")) == \
        ["first.sqsh", "second.sqsh", "third.sqsh"]


def test_cache_only_prints_the_entry_and_copies_nothing(tmp_path, env, proxy, registry):
    first = berth(["--quiet", "import", "--cache-only", uri_of(proxy)], env, tmp_path)
    assert first.returncode == 0 and first.stderr == "", first.stderr
    [entry] = entries(tmp_path)
    assert first.stdout == f"{entry}\n"
    assert "/etc/added" in listing(entry)
    again = berth(["--quiet", "import", "--cache-only", uri_of(proxy)],
                  failing_mksquashfs(tmp_path, env), tmp_path)
    assert again.returncode == 0 and again.stdout == first.stdout
    assert list(tmp_path.glob("*.sqsh")) == []  # no copy anywhere

    registry.push_image("test/app", "v1", [BASE])  # the tag moves: a new entry
    moved = berth(["--quiet", "import", "--cache-only", uri_of(proxy)], env, tmp_path)
    assert moved.returncode == 0 and moved.stdout != first.stdout
    assert "/etc/added" not in listing(moved.stdout.strip())
    registry.push_image("test/app", "v1", [BASE, TOP])  # as the other tests expect it


def test_reuse_asks_the_registry_only_for_an_unknown_uri(tmp_path, env, proxy, registry):
    registry.push_image("test/reused", "v1", [BASE, TOP])
    uri = uri_of(proxy, "test/reused:v1")

    def reuse(*extra):
        result = berth(["--quiet", "import", "--cache-only", *extra, uri], env, tmp_path)
        assert result.returncode == 0, result.stderr
        return result.stdout.strip()

    first = reuse("--reuse")
    assert "/v2/test/reused/manifests/v1" in proxy.requests
    proxy.requests.clear()
    assert reuse("--reuse") == first and proxy.requests == []  # not even the manifest

    registry.push_image("test/reused", "v1", [BASE])  # the tag moves
    assert reuse("--reuse") == first and proxy.requests == []  # once per node: not seen
    moved = reuse()  # without --reuse: asked, and remembered as the URI's latest
    assert moved != first and "/etc/added" not in listing(moved)
    proxy.requests.clear()
    assert reuse("--reuse") == moved and proxy.requests == []

    pruned = berth(["cache", "prune", "--max-size", "0"], env, tmp_path)
    assert pruned.returncode == 0 and os.listdir(tmp_path / "cache/uris") == []
    assert reuse("--reuse") == moved  # built again, after asking
    assert "/v2/test/reused/manifests/v1" in proxy.requests


def test_cache_only_and_output_exclude_each_other(tmp_path, env, proxy):
    result = berth(["import", "--cache-only", "-o", "x.sqsh", uri_of(proxy)], env, tmp_path)
    assert result.returncode == 2 and "not allowed with argument" in result.stderr
    assert entries(tmp_path) == [] and not (tmp_path / "x.sqsh").exists()


def test_a_moved_tag_builds_a_new_image(tmp_path, env, proxy, registry):
    registry.push_image("test/moving", "v1", [BASE])
    uri = uri_of(proxy, "test/moving:v1")
    assert berth(["import", "-o", "old.sqsh", uri], env, tmp_path).returncode == 0
    registry.push_image("test/moving", "v1", [BASE, TOP])
    result = berth(["import", "-o", "new.sqsh", uri], env, tmp_path)
    assert result.returncode == 0, result.stderr
    assert "cached" not in result.stderr
    assert "/etc/added" not in listing(tmp_path / "old.sqsh")
    assert "/etc/added" in listing(tmp_path / "new.sqsh")
    assert len(entries(tmp_path)) == 2


def test_each_uri_records_its_own_source(tmp_path, env, proxy, registry):
    by_tag, by_digest = uri_of(proxy), uri_of(proxy, f"test/app@{registry.app_digest}")
    for name, uri in (("tag.sqsh", by_tag), ("digest.sqsh", by_digest)):
        result = berth(["import", "-o", name, uri], env, tmp_path)
        assert result.returncode == 0, result.stderr
        image = read_image_config(unsquash(tmp_path / name, tmp_path / f"{name}.root"))
        assert image["source"] == uri
    assert len(entries(tmp_path)) == 2


def test_squash_options_are_part_of_the_key(tmp_path, env, proxy):
    assert berth(["import", "-o", "gzip.sqsh", uri_of(proxy)], env, tmp_path).returncode == 0
    blobs = list((tmp_path / "cache/blobs/sha256").iterdir())
    for blob in blobs:
        os.utime(blob, (time.time() - 9 * DAY,) * 2)
    result = berth(["import", "-o", "zstd.sqsh", uri_of(proxy)],
                   dict(env, ENROOT_SQUASH_OPTIONS="-comp zstd"), tmp_path)
    assert result.returncode == 0, result.stderr
    assert compressor(tmp_path / "gzip.sqsh") == GZIP
    assert compressor(tmp_path / "zstd.sqsh") == ZSTD
    assert sorted(compressor(entry) for entry in entries(tmp_path)) == [GZIP, ZSTD]
    # The build used the cached layers, and that counts as a use.
    assert all(time.time() - blob.stat().st_mtime < 60 for blob in blobs)
    # The same options written differently are the same options.
    same = dict(failing_mksquashfs(tmp_path, env), ENROOT_SQUASH_OPTIONS=" -comp   'zstd' ")
    result = berth(["import", "-o", "again.sqsh", uri_of(proxy)], same, tmp_path)
    assert result.returncode == 0, result.stderr
    assert compressor(tmp_path / "again.sqsh") == ZSTD


@pytest.mark.parametrize("damage", ["truncated", "not squashfs"])
def test_a_damaged_entry_is_built_again_never_copied(tmp_path, env, proxy, damage):
    assert berth(["import", "-o", "good.sqsh", uri_of(proxy)], env, tmp_path).returncode == 0
    [entry] = entries(tmp_path)

    def spoil():
        if damage == "truncated":  # by one byte of what the superblock says it fills
            with open(entry, "rb") as f:
                used = struct.unpack("<40xQ", f.read(48))[0]
            os.truncate(entry, used - 1)
        else:
            with open(entry, "r+b") as f:
                f.write(b"junk")

    spoil()
    result = berth(["import", "-o", "failed.sqsh", uri_of(proxy)],
                   failing_mksquashfs(tmp_path, env), tmp_path)
    assert result.returncode == 1
    assert result.stderr.startswith(f"berth: the cached squashfs {entry} is damaged; building "
                                    "it again\nberth: error: mksquashfs failed for ")
    assert not (tmp_path / "failed.sqsh").exists() and entries(tmp_path) == []

    assert berth(["import", "-o", "other.sqsh", uri_of(proxy)], env, tmp_path).returncode == 0
    spoil()
    result = berth(["import", "-o", "rebuilt.sqsh", uri_of(proxy)], env, tmp_path)
    assert result.returncode == 0, result.stderr
    assert "is damaged; building it again" in result.stderr
    assert listing(tmp_path / "rebuilt.sqsh") == listing(tmp_path / "good.sqsh")
    assert entries(tmp_path) == [entry]
    assert entry.read_bytes() == (tmp_path / "rebuilt.sqsh").read_bytes()


def test_concurrent_imports_build_the_image_once(tmp_path, env, proxy):
    log = tmp_path / "mksquashfs.log"
    counting = with_mksquashfs(tmp_path, env, f'echo run >> {log}; sleep 2\n'
                                              f'exec {MKSQUASHFS} "$@"')
    results = imports_at_once(uri_of(proxy), counting, tmp_path, "a.sqsh", "b.sqsh")
    assert [r.returncode for r in results.values()] == [0, 0], \
        [r.stderr for r in results.values()]
    assert log.read_text() == "run\n"
    # (each ends with its summary line: the one that waited found the image made)
    waited = [r.stderr.splitlines()[:-1] for r in results.values()
              if "waiting" in r.stderr]
    assert waited == [[f"berth: waiting for another import of {proxy.host}/test/app:v1",
                       f"berth: using the cached squashfs of {proxy.host}/test/app:v1: "
                       f"{entries(tmp_path)[0]}"]]
    assert (tmp_path / "a.sqsh").read_bytes() == (tmp_path / "b.sqsh").read_bytes()


def test_sigterm_while_packing_leaves_no_entry(tmp_path, env, proxy):
    started = tmp_path / "started"
    slow = with_mksquashfs(tmp_path, env, f'printf hsqs > "$2"; touch {started}; exec sleep 60')
    process = subprocess.Popen(
        [sys.executable, "-m", "berth.cli", "import", "-o", "x.sqsh", uri_of(proxy)],
        env=slow, cwd=tmp_path, stderr=subprocess.PIPE, text=True)
    while not started.exists():
        time.sleep(0.05)
    process.terminate()
    assert process.wait(30) == 1
    assert process.stderr.read() == "berth: error: import interrupted by SIGTERM\n"
    assert list((tmp_path / "cache/images").iterdir()) == []
    assert list(tmp_path.glob("x.sqsh*")) == []
    result = berth(["import", "-o", "x.sqsh", uri_of(proxy)], env, tmp_path)
    assert result.returncode == 0, result.stderr
    assert len(entries(tmp_path)) == 1


# -- berth cache --------------------------------------------------------------

def table(stdout):
    """{kind: (files, bytes)} from `berth cache` output."""
    rows = {}
    for line in stdout.splitlines()[2:]:
        kind, files, _, size = line.split()
        rows[kind] = (int(files), int(size))
    return rows


def test_cache_list_counts_the_files(tmp_path, env, proxy):
    assert berth(["import", uri_of(proxy)], env, tmp_path).returncode == 0
    (tmp_path / "cache/blobs/sha256/.partial-x").write_bytes(b"12345")
    blobs = list((tmp_path / "cache/blobs/sha256").glob("[0-9a-f]*"))
    [image] = entries(tmp_path)
    for command in (["cache"], ["cache", "list"]):
        result = berth(command, env, tmp_path)
        assert result.returncode == 0, result.stderr
        assert result.stdout.splitlines()[0] == f"ENROOT_CACHE_PATH {tmp_path / 'cache'}"
        layer_bytes = sum(blob.stat().st_size for blob in blobs)
        assert table(result.stdout) == {
            "layers": (2, layer_bytes), "images": (1, image.stat().st_size), "partial": (1, 5),
            "total": (4, layer_bytes + image.stat().st_size + 5), "steps": (0, 0),
            "mounts": (0, 0)}


def fake_cache(tmp_path, ages):
    """Cache files of 100 bytes, name -> age in days; names: 'layerN', 'imageN', 'partialN'."""
    cache = tmp_path / "cache"
    paths = {}
    for number, (name, age) in enumerate(ages.items()):
        hexname = f"{number:064x}"
        path = {"layer": cache / "blobs/sha256" / hexname,
                "image": cache / "images" / f"{hexname}.sqsh",
                "partial": cache / "images" / f"{hexname}.sqsh.tmp-1"}[name.rstrip("0123456789")]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x" * 100)
        os.utime(path, (time.time() - age * DAY,) * 2)
        paths[name] = path
    (cache / "locks").mkdir(exist_ok=True)
    return paths


def left(paths):
    return sorted(name for name, path in paths.items() if path.exists())


def test_prune_by_age(tmp_path, env):
    paths = fake_cache(tmp_path, {"layer1": 10, "image1": 5, "partial1": 4, "layer2": 1,
                                  "image2": 0, "partial2": 0})
    result = berth(["cache", "prune", "--older-than", "3"], env, tmp_path)
    assert result.returncode == 0, result.stderr
    assert left(paths) == ["image2", "layer2", "partial2"]
    removed = [line.split()[1] for line in result.stdout.splitlines()[:-1]]
    assert removed == [str(paths[name]) for name in ("layer1", "image1", "partial1")]
    assert result.stdout.splitlines()[-1] == \
        "freed 300B (300 bytes: layers 1, images 1, partial 1); 0 in use kept; 300B (300 " \
        "bytes) left"
    # the lock files of what went go with it (see the next test)
    assert os.listdir(tmp_path / "cache/locks") == []


@pytest.mark.parametrize("duration", ["72h", "4320m", "3d"])
def test_prune_reads_the_age_as_store_prune_does(tmp_path, env, duration):
    paths = fake_cache(tmp_path, {"layer1": 10, "image1": 2.9, "image2": 3.1})
    result = berth(["cache", "prune", "--older-than", duration], env, tmp_path)
    assert result.returncode == 0, result.stderr
    assert left(paths) == ["image1"]


def test_an_import_waiting_on_a_lock_prune_removed_takes_the_new_one(tmp_path, env, proxy):
    """Prune removes an entry's lock file with the entry, the lock held. An
    import that waited on that file gets it once prune lets go: it must then
    wait for the import that made the file anew meanwhile, not build the
    same image beside it on the old file."""
    uri = uri_of(proxy)
    assert berth(["-q", "import", "-o", "a.sqsh", uri], env, tmp_path).returncode == 0
    [lock] = (tmp_path / "cache/locks").glob("image-*")
    removed = open(lock)  # (prune's hold, let go below)
    fcntl.flock(removed, fcntl.LOCK_EX)
    waiting = subprocess.Popen([sys.executable, "-m", "berth.cli", "import", "-o", "b.sqsh", uri],
                               env=env, cwd=tmp_path, stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while str(lock) not in _open_files(waiting.pid):
            assert time.monotonic() < deadline, "the import never opened the lock file"
            time.sleep(0.05)
        lock.unlink()  # as prune does, holding it
        with open(lock, "w") as made_anew:  # by a later import, which now builds
            fcntl.flock(made_anew, fcntl.LOCK_EX)
            removed.close()  # prune lets go: the waiting import gets the removed file
            with pytest.raises(subprocess.TimeoutExpired):
                waiting.wait(3)  # ... and waits on the new one
        _, stderr = waiting.communicate(timeout=60)
    finally:
        removed.close()
        if waiting.poll() is None:
            waiting.kill()
            waiting.wait()
    assert waiting.returncode == 0, stderr
    assert stderr.count("berth: waiting for another import of ") == 1, stderr


def _open_files(pid):
    """The paths a process has open."""
    paths = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            paths.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
    return paths


def test_prune_by_size_removes_the_least_recently_used(tmp_path, env):
    paths = fake_cache(tmp_path, {"image1": 9, "layer1": 8, "partial1": 7, "image2": 6,
                                  "layer2": 5, "image3": 4, "partial2": 0})
    result = berth(["cache", "prune", "--max-size", "400"], env, tmp_path)
    assert result.returncode == 0, result.stderr
    # 700 bytes: the three oldest entries go; partial files only by age.
    assert left(paths) == ["image3", "layer2", "partial1", "partial2"]


def test_prune_skips_what_an_import_holds(tmp_path, env):
    paths = fake_cache(tmp_path, {"layer1": 9, "image1": 8, "layer2": 1})
    held = {}
    for name, lock in (("layer1", f"sha256-{paths['layer1'].name}"),
                       ("image1", f"image-{paths['image1'].name[:-5]}")):
        held[name] = open(tmp_path / "cache/locks" / lock, "w")
        fcntl.flock(held[name], fcntl.LOCK_EX)
    try:
        result = berth(["cache", "prune", "--max-size", "0"], env, tmp_path)
    finally:
        for lock in held.values():
            lock.close()
    assert result.returncode == 0, result.stderr
    assert left(paths) == ["image1", "layer1"]
    assert "; 2 in use kept; 200B (200 bytes) left" in result.stdout
    assert result.stdout.count("removed ") == 1


def test_prune_after_import_empties_the_cache(tmp_path, env, proxy):
    assert berth(["import", "-o", "a.sqsh", uri_of(proxy)], env, tmp_path).returncode == 0
    result = berth(["cache", "prune", "--max-size", "0"], env, tmp_path)
    assert result.returncode == 0, result.stderr
    assert "bytes: layers 2, images 1, partial 0); 0 in use kept; 0B (0 bytes) left" \
        in result.stdout
    for directory in ("blobs/sha256", "images", "uris"):
        assert os.listdir(tmp_path / "cache" / directory) == []
    assert os.listdir(tmp_path / "cache/locks") == []  # (gone with their entries)
    assert table(berth(["cache"], env, tmp_path).stdout)["total"] == (0, 0)
    result = berth(["import", "-o", "b.sqsh", uri_of(proxy)], env, tmp_path)
    assert result.returncode == 0 and "cached" not in result.stderr


@pytest.mark.parametrize("args, message", [
    (["--max-size", "abc"], "--max-size: expected bytes or a size such as 500M or 20G, got 'abc'"),
    (["--older-than", "1", "--max-size=-5G"],
     "--max-size: expected bytes or a size such as 500M or 20G, got '-5G'"),
    (["--older-than=-1"], "--older-than: expected a duration such as 30d or 12h (s, m, h, d, "
                          "w; a number alone is days), got '-1'"),
    (["--older-than", "nan", "--max-size", "0"],
     "--older-than: expected a duration such as 30d or 12h (s, m, h, d, w; a number alone is "
     "days), got 'nan'"),
    ([], "cache prune: give --older-than DURATION, --max-size SIZE or both (--max-size 0 "
         "empties the cache)"),
])
def test_bad_prune_arguments_change_nothing(tmp_path, env, args, message):
    paths = fake_cache(tmp_path, {"layer1": 9, "image1": 9})
    result = berth(["cache", "prune", *args], env, tmp_path)
    assert result.returncode == 1
    assert result.stderr == f"berth: error: {message}\n"
    assert result.stdout == ""
    assert left(paths) == ["image1", "layer1"]


@pytest.mark.parametrize("size, removed", [("250", 1), ("0.1K", 2), ("1k", 0), ("1KiB", 0),
                                           ("1M", 0), ("2G", 0), ("200B", 1)])
def test_max_size_units(tmp_path, env, size, removed):
    paths = fake_cache(tmp_path, {"layer1": 3, "layer2": 2, "image1": 1})
    result = berth(["cache", "prune", "--max-size", size], env, tmp_path)
    assert result.returncode == 0, result.stderr
    assert 3 - len(left(paths)) == removed


def test_prune_names_a_file_it_cannot_handle(tmp_path, env):
    paths = fake_cache(tmp_path, {"layer1": 9})
    locks = tmp_path / "cache/locks"
    locks.rmdir()
    locks.write_text("")  # not a directory
    result = berth(["cache", "prune", "--max-size", "0"], env, tmp_path)
    assert result.returncode == 1
    assert result.stderr == f"berth: error: {locks}: Not a directory\n"
    assert left(paths) == ["layer1"]


# -- prune run by root (the daily berth-cache-prune; issue #11) ---------------

PRUNER = "bdep-prune"
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="prunes as root")


@pytest.fixture(scope="module")
def cache_user():
    """A throw-away user owning the caches that root prunes."""
    subprocess.run(["useradd", "--no-create-home", "--home-dir", "/nonexistent", "--shell",
                    "/usr/sbin/nologin", PRUNER], check=True, capture_output=True)
    try:
        yield pwd.getpwnam(PRUNER)
    finally:
        subprocess.run(["userdel", PRUNER], check=False, capture_output=True)


@pytest.fixture
def node(tmp_path):
    """A root-owned 0755 cache root every user can traverse (tmp_path is 0700),
    and a root-only directory standing for /etc, /var/lib and the like."""
    top = Path(tempfile.mkdtemp(prefix="bdep-prune-", dir="/tmp"))
    top.chmod(0o755)
    (top / "cache").mkdir(mode=0o755)
    (top / "secret").mkdir(mode=0o700)
    yield top
    shutil.rmtree(top)


def user_cache(node, user, ages):
    """fake_cache's files in node/<uid>/cache, all of them the user's."""
    base = node / str(user.pw_uid)
    base.mkdir(mode=0o755)
    paths = fake_cache(base, ages)
    cache = base / "cache"
    for path in [cache, *cache.rglob("*")]:
        os.lchown(path, user.pw_uid, user.pw_gid)
    return cache, paths


def old_files(directory, names):
    """Files a day-counting prune would take: 10 days unused, root's, 0600."""
    directory.mkdir(parents=True, exist_ok=True)
    for name in names:
        path = directory / name
        path.write_text("precious\n")
        path.chmod(0o600)
        os.utime(path, (time.time() - 10 * DAY,) * 2)
    return sorted(os.listdir(directory))


def prune_as_root(tmp_path, cache, *args):
    env = berth_env(tmp_path, ENROOT_CACHE_PATH=str(cache))
    return berth(["cache", "prune", *(args or ("--older-than", "1"))], env, tmp_path)


@needs_root
@pytest.mark.parametrize("place", ["images", "blobs/sha256", "blobs", "locks", "uris"])
def test_root_prune_follows_no_link_of_the_user(tmp_path, node, cache_user, place):
    cache, paths = user_cache(node, cache_user, {"layer1": 10, "image1": 10})
    secret = node / "secret"
    # Names of layers, of images and of neither (pruned as partial files).
    names = old_files(secret, ["passwd", "shadow.sqsh", f"{7:064x}", f"{8:064x}.sqsh"])
    link = cache / place
    if link.exists():
        shutil.rmtree(link)
    link.symlink_to(secret if place != "blobs" else node)
    (node / "sha256").symlink_to(secret)  # blobs -> node: node/sha256 -> secret
    os.lchown(link, cache_user.pw_uid, cache_user.pw_gid)
    result = prune_as_root(tmp_path, cache, "--max-size", "0")
    assert sorted(os.listdir(secret)) == names
    assert all(os.stat(secret / name).st_uid == 0 for name in names)
    assert result.returncode == 1
    assert result.stderr == f"berth: error: {link}: a symbolic link; berth cache prune " \
                            "follows none in the cache\n"
    assert result.stdout == ""
    assert len(left(paths)) == 2 - (place in ("images", "blobs/sha256", "blobs"))


@needs_root
def test_root_prune_makes_no_file_through_a_lock_link(tmp_path, node, cache_user):
    cache, paths = user_cache(node, cache_user, {"layer1": 10, "image1": 10, "layer2": 0})
    target = node / "secret" / "nologin"
    for name in ("layer1", "image1"):
        lock = (f"sha256-{paths[name].name}" if name.startswith("layer")
                else f"image-{paths[name].name[:-5]}")
        (cache / "locks" / lock).symlink_to(target)
        os.lchown(cache / "locks" / lock, cache_user.pw_uid, cache_user.pw_gid)
    result = prune_as_root(tmp_path, cache)
    assert not os.path.lexists(target)
    assert result.returncode == 0, result.stderr
    # An entry whose lock is not a lock file stays: the user's own doing.
    assert left(paths) == ["image1", "layer1", "layer2"]
    assert "; 2 in use kept;" in result.stdout


@needs_root
def test_root_prunes_a_users_cache_as_the_user(tmp_path, node, cache_user):
    cache, paths = user_cache(node, cache_user, {"layer1": 10, "image1": 5, "partial1": 4,
                                                 "layer2": 4, "image2": 0})
    # Held by an import of the user: prune locks it and leaves it, as the user.
    lock = cache / "locks" / f"sha256-{paths['layer2'].name}"
    lock.write_text("")
    os.lchown(lock, cache_user.pw_uid, cache_user.pw_gid)
    with open(lock) as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        result = prune_as_root(tmp_path, cache, "--older-than", "3")
    assert result.returncode == 0, result.stderr
    assert left(paths) == ["image2", "layer2"]
    assert "; 1 in use kept;" in result.stdout
    owners = {path.stat(follow_symlinks=False).st_uid for path in [cache, *cache.rglob("*")]}
    assert owners == {cache_user.pw_uid}


@needs_root
def test_root_waits_for_a_stopped_users_prune_no_longer_than_its_bound(
        tmp_path, node, cache_user, monkeypatch, capsys):
    """The timer prunes every user's cache in turn: one user stopping the
    child that prunes hers (SIGSTOP, a FUSE mount that never answers) must
    not hold the others up for ever."""
    cache, paths = user_cache(node, cache_user, {"layer1": 10})
    for key, value in berth_env(tmp_path, ENROOT_CACHE_PATH=str(cache)).items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(cache_verb, "PRUNE_AS_OWNER_SECONDS", 1)
    monkeypatch.setattr(cache_verb, "_prune", lambda *args: time.sleep(600))  # never ends
    started = time.monotonic()
    assert cli.main(["cache", "prune", "--older-than", "1"]) == 1
    assert time.monotonic() - started < 10
    assert capsys.readouterr().err == (
        f"berth: error: cache prune of {cache}: the process pruning it as uid "
        f"{cache_user.pw_uid} did not end within 1 s; killed it\n")
    assert left(paths) == ["layer1"]


@needs_root
def test_root_prune_runs_as_the_owner_with_the_owners_groups(tmp_path, node, cache_user):
    """The prune child holds the owner's uid, gid and groups only: a root-only
    directory inside the cache stays out of its reach."""
    cache, paths = user_cache(node, cache_user, {"layer1": 10, "layer2": 10})
    os.chown(cache / "blobs" / "sha256", 0, 0)
    result = prune_as_root(tmp_path, cache)
    assert result.returncode == 1
    assert result.stderr == f"berth: error: {cache}/blobs/sha256: owned by uid 0, not uid " \
                            f"{cache_user.pw_uid}; berth cache prune leaves it alone\n"
    assert left(paths) == ["layer1", "layer2"]


@needs_root
def test_root_prune_refuses_a_cache_path_through_a_link(tmp_path, node, cache_user):
    secret = node / "secret"
    names = old_files(secret / "images", ["passwd", f"{8:064x}.sqsh"])
    (node / "cache" / "linked").symlink_to(secret)
    result = prune_as_root(tmp_path, node / "cache" / "linked")
    assert result.returncode == 1
    assert result.stderr.startswith(f"berth: error: ENROOT_CACHE_PATH={node}/cache/linked: "
                                    f"{node}/cache/linked is a symbolic link; as root")
    assert sorted(os.listdir(secret / "images")) == names


def test_prune_by_the_user_refuses_a_linked_directory(tmp_path, env):
    paths = fake_cache(tmp_path, {"layer1": 9, "image1": 9})
    elsewhere = tmp_path / "elsewhere"
    (tmp_path / "cache/images").rename(elsewhere)
    (tmp_path / "cache/images").symlink_to(elsewhere)
    result = berth(["cache", "prune", "--max-size", "0"], env, tmp_path)
    assert result.returncode == 1
    assert result.stderr == f"berth: error: {tmp_path}/cache/images: a symbolic link; berth " \
                            "cache prune follows none in the cache\n"
    assert left(paths) == ["image1", "layer1"]


@needs_root
def test_root_prunes_the_cache_of_a_uid_gone_from_passwd(tmp_path, node):
    gone = 54321
    assert not any(entry.pw_uid == gone for entry in pwd.getpwall())
    base = node / "gone"
    base.mkdir(mode=0o755)
    paths = fake_cache(base, {"layer1": 10, "image1": 0})
    for path in [base / "cache", *(base / "cache").rglob("*")]:
        os.lchown(path, gone, gone)
    result = prune_as_root(tmp_path, base / "cache")
    assert result.returncode == 0, result.stderr
    assert left(paths) == ["image1"]
    assert {path.lstat().st_uid for path in (base / "cache").rglob("*")} == {gone}


def test_cache_only_digest_names_what_the_image_was_pulled_by(tmp_path, env, proxy, registry):
    by_tag = berth(["--quiet", "import", "--cache-only", "--digest", uri_of(proxy)], env, tmp_path)
    assert by_tag.returncode == 0, by_tag.stderr
    [entry] = entries(tmp_path)
    assert by_tag.stdout == f"{entry}\n{registry.app_digest}\n"
    reused = berth(["--quiet", "import", "--cache-only", "--reuse", "--digest", uri_of(proxy)],
                   env, tmp_path)
    assert reused.stdout == by_tag.stdout

    plain = berth(["import", "--digest", "-o", "x.sqsh", uri_of(proxy)], env, tmp_path)
    assert plain.returncode == 1 and "--digest: only with --cache-only" in plain.stderr
    assert not (tmp_path / "x.sqsh").exists()

    # a URI pinned to a digest names it: its cached entry is not opened to
    # read it (no unsquashfs on a cached step's way)
    pinned = f"docker://{proxy.host}#test/app@{registry.app_digest}"
    first = berth(["--quiet", "import", "--cache-only", "--digest", pinned], env, tmp_path)
    assert first.returncode == 0, first.stderr
    no_unsquashfs = dict(failing_mksquashfs(tmp_path, env))
    (tmp_path / "fakebin" / "unsquashfs").symlink_to(tmp_path / "fakebin" / "mksquashfs")
    again = berth(["--quiet", "import", "--cache-only", "--reuse", "--digest", pinned],
                  no_unsquashfs, tmp_path)
    assert again.returncode == 0 and again.stdout == first.stdout, again.stderr
    assert again.stdout.endswith(f"\n{registry.app_digest}\n")



def test_a_squashfs_without_image_json_has_no_digest(tmp_path):
    from berth.image import squash
    (tmp_path / "root/etc").mkdir(parents=True)
    image = tmp_path / "plain.sqsh"
    subprocess.run(["mksquashfs", tmp_path / "root", image, "-quiet", "-no-progress"], check=True)
    with pytest.raises(BerthError, match="plain.sqsh: no digest in its etc/berth/image.json"):
        squash.recorded_digest(str(image))


def test_a_killed_builds_partial_file_goes_with_the_next_build(tmp_path, env, proxy):
    first = berth(["--quiet", "import", "--cache-only", uri_of(proxy)], env, tmp_path)
    assert first.returncode == 0, first.stderr
    [entry] = entries(tmp_path)
    entry.unlink()  # as if the build had been killed before its rename
    partial = entry.with_name(entry.name + ".tmp-4242")  # mksquashfs's name, a pid of a node
    partial.write_bytes(b"hsqs half")
    other = entry.with_name("f" * 64 + ".sqsh.tmp-4242")  # another image's build: not ours
    other.write_bytes(b"hsqs half")
    again = berth(["--quiet", "import", "--cache-only", uri_of(proxy)], env, tmp_path)
    assert again.returncode == 0, again.stderr
    assert again.stdout == first.stdout and entry.exists()
    assert not partial.exists()
    assert other.exists()


@pytest.fixture
def small_filesystem(tmp_path):
    """A 512 KiB tmpfs of the test's own."""
    mount_point = tmp_path / "small"
    mount_point.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(mount_point)],
                   check=True)
    yield mount_point
    subprocess.run(["umount", str(mount_point)], check=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a tmpfs")
def test_a_full_file_system_is_named_not_mksquashfs_last_line(tmp_path, small_filesystem):
    """The error quoted mksquashfs's last line, `Creating 4.0 filesystem`
    (its stdout, flushed after its error)."""
    root = tmp_path / "root"
    root.mkdir()
    (root / "noise").write_bytes(os.urandom(2 << 20))  # (random: it does not compress)
    output = small_filesystem / "image.sqsh"
    with pytest.raises(BerthError) as error:
        squash.make_squashfs(str(root), str(output), config.load({}), show_progress=False)
    assert str(error.value).startswith(f"mksquashfs failed for {output}: the file system "
                                       f"mounted at {small_filesystem} is full (")
    assert os.listdir(small_filesystem) == []


def test_mksquashfs_is_given_a_memory_bound_unless_the_site_gives_one(tmp_path, monkeypatch):
    """mksquashfs takes a quarter of the node's memory by default (a resident
    set of 1.8 GB packing a 2 GiB image, bench/import.py); Berth bounds it,
    and a site's own -mem in ENROOT_SQUASH_OPTIONS stands."""
    real, seen = shutil.which("mksquashfs"), tmp_path / "arguments"
    wrapper = tmp_path / "bin" / "mksquashfs"
    wrapper.parent.mkdir()
    wrapper.write_text(f'#!/bin/sh\necho "$@" >> {seen}\nexec {real} "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("PATH", f"{wrapper.parent}:{os.environ['PATH']}")
    root = tmp_path / "root"
    root.mkdir()
    (root / "file").write_text("data\n")
    squash.make_squashfs(str(root), str(tmp_path / "a.sqsh"), config.load({}),
                         show_progress=False)
    squash.make_squashfs(str(root), str(tmp_path / "b.sqsh"),
                         config.load({"ENROOT_SQUASH_OPTIONS": "-comp gzip -mem 1G"}),
                         show_progress=False)
    default, site = seen.read_text().splitlines()
    assert default.split().count("-mem") == 1
    assert site.split().count("-mem") == 1 and " -mem 1G " in f" {site} "
    assert (tmp_path / "a.sqsh").exists() and (tmp_path / "b.sqsh").exists()
