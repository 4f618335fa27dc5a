"""Node-local copies of the shared store's entries (BERTH_IMAGE_STORE_LOCAL,
storelocal.py): `berth store serve` copies an entry once per node and
answers the copy; `import --cache-only --reuse` takes the copy without the
socket; a copy nobody but the store's account made is refused; a copy whose
entry left the store goes at the next serve; a killed copy shows nothing.

The store's service, registry and users are test_store.py's.
"""

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_store import (  # noqa: F401 (fixtures)
    ALICE,
    BASE,
    BOB,
    KEY,
    STORE_USER,
    FakeService,
    _owned_dir,
    _squashfs,
    age_store,
    private,
    registry,
    service,
    site,
    uri_of,
    users,
)

from berth import config
from berth.errors import BerthError
from berth.store import paths as store
from berth.units import human_size

pytestmark = [
    pytest.mark.skipif(not shutil.which("docker-registry"),
                       reason="needs docker-registry (Debian package docker-registry)"),
    pytest.mark.skipif(os.geteuid() != 0, reason="plays the store's account and two users"),
]


@pytest.fixture
def local(site):
    """LOCAL as the role makes it: the store account's, 0755, on node-local disk."""
    path = _owned_dir(site.top / "local", site.users[STORE_USER])
    _set_local(site, path)
    return path


def _set_local(site, path):
    _set(site, "BERTH_IMAGE_STORE_LOCAL", path)


def _set(site, key, value):
    conf = site.sysconf / "enroot.conf"
    lines = [line for line in conf.read_text().splitlines(True) if not line.startswith(f"{key} ")]
    conf.write_text("".join(lines) + f"{key} {value}\n")


def _copies(service):
    return sum(err.count("berth: copied ") for _, err in service.results)


def _copy_names(local):
    return sorted(p.name for p in local.iterdir() if p.name != "locks")


def test_a_node_copies_an_entry_once_and_its_next_steps_take_the_copy(site, service, proxy,
                                                                       registry, local):
    uri = uri_of(proxy)
    first = site.run(ALICE, "import", "--cache-only", "--reuse", "--digest", uri)
    assert first.returncode == 0, first.stderr
    assert first.stderr == ""
    [entry] = site.store_images()
    copy = local / entry.name
    assert first.stdout == f"{copy}\n{registry.app_digest}\n"
    service.join()
    assert [code for code, _ in service.results] == [0] and _copies(service) == 1
    assert copy.read_bytes() == entry.read_bytes()
    st = copy.stat()
    assert (st.st_uid, oct(st.st_mode & 0o7777)) == (site.users[STORE_USER].pw_uid, "0o644")
    assert _copy_names(local) == [entry.name]

    # bob on the same node: the copy, no socket, no registry; the store's
    # entry is read (its atime: a use prune counts), not written
    days_ago = time.time() - 3 * 86400
    os.utime(entry, (days_ago, days_ago))
    proxy.requests.clear()
    again = site.run(BOB, "import", "--cache-only", "--reuse", "--digest", uri)
    assert again.returncode == 0, again.stderr
    assert again.stdout == first.stdout and again.stderr == ""
    assert proxy.requests == [] and len(service.results) == 1
    assert entry.stat().st_atime > days_ago + 86400 and entry.stat().st_mtime == days_ago

    # without --reuse the socket is asked; it answers the copy it has
    asked = site.run(BOB, "--quiet", "import", "--cache-only", uri)
    assert asked.returncode == 0, asked.stderr
    assert asked.stdout == f"{copy}\n"
    service.join()
    assert len(service.results) == 2 and _copies(service) == 1


def test_steps_asking_at_once_make_one_copy(site, service, proxy, local):
    uri = uri_of(proxy)
    results = []

    def run(name):
        results.append(site.run(name, "--quiet", "import", "--cache-only", uri))

    threads = [threading.Thread(target=run, args=(name,)) for name in (ALICE, BOB) * 3]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    [entry] = site.store_images()
    for result in results:
        assert result.returncode == 0, result.stderr
        assert result.stdout == f"{local / entry.name}\n"
    service.join()
    assert len(service.results) == 6 and _copies(service) == 1, service.results
    assert _copy_names(local) == [entry.name]  # no temporary file left


def test_serve_makes_a_missing_local_directory(site, service, proxy):
    path = site.top / "made-by-serve"
    _set_local(site, path)
    result = site.run(ALICE, "--quiet", "import", "--cache-only", uri_of(proxy))
    assert result.returncode == 1  # in a directory of root's: the admin's to make
    assert result.stderr == (f"berth: error: the image store: BERTH_IMAGE_STORE_LOCAL={path}: "
                             f"cannot create {path}: Permission denied\n")
    path = _owned_dir(site.top / "node", site.users[STORE_USER]) / "local"
    _set_local(site, path)
    result = site.run(ALICE, "--quiet", "import", "--cache-only", uri_of(proxy))
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"{path}/")
    st = path.stat()
    assert (st.st_uid, oct(st.st_mode & 0o7777)) == (site.users[STORE_USER].pw_uid, "0o755")


def test_a_copy_the_store_account_did_not_make_is_refused(site, service, proxy, local):
    uri = uri_of(proxy)
    first = site.run(ALICE, "--quiet", "import", "--cache-only", uri)
    assert first.returncode == 0, first.stderr
    copy = Path(first.stdout.strip())
    alice, store_user = site.users[ALICE], site.users[STORE_USER]
    elsewhere = _squashfs(site.top / "alices" / copy.name, alice)

    def planted(why):
        """bob's --reuse refuses the copy naming why, asks the socket, whose
        serve replaces it with its own."""
        result = site.run(BOB, "import", "--cache-only", "--reuse", uri)
        assert result.returncode == 0, result.stderr
        assert result.stderr.startswith(
            f"berth: not reusing the image store's entry of {uri}: the image store's answer "
            f"{copy}: {why}"), result.stderr
        assert result.stdout == f"{copy}\n"
        st = copy.lstat()
        assert (st.st_uid, st.st_mode & 0o022, copy.is_symlink()) == (store_user.pw_uid, 0,
                                                                       False)

    os.chown(copy, alice.pw_uid, alice.pw_gid)
    planted(f"owned by uid {alice.pw_uid}, not by BERTH_IMAGE_STORE_OWNER")
    copy.chmod(0o666)
    planted("writable by others (mode 0666)")
    copy.unlink()
    copy.symlink_to(elsewhere)
    planted("not an image of BERTH_IMAGE_STORE")
    os.truncate(copy, 100)
    planted("not a whole squashfs")

    # a LOCAL others may write: what is in it is nobody's to trust, and
    # serve refuses it too, naming the key
    local.chmod(0o1777)
    os.chown(elsewhere, store_user.pw_uid, store_user.pw_gid)
    result = site.run(BOB, "import", "--cache-only", "--reuse", uri)
    assert result.returncode == 1
    assert f"{local} is not the store account's alone (owner uid {store_user.pw_uid}, " \
        "mode 1777)" in result.stderr.splitlines()[0]
    assert result.stderr.splitlines()[1].startswith(
        f"berth: error: the image store: BERTH_IMAGE_STORE_LOCAL={local}: {local} is not the "
        "store account's alone")
    local.chmod(0o755)

    # LOCAL named through a symbolic link: refused by the client and serve
    link = site.top / "local-link"
    link.symlink_to(local)
    _set_local(site, link)
    result = site.run(BOB, "import", "--cache-only", "--reuse", uri)
    assert result.returncode == 1
    assert f"{link} is a symbolic link (give the resolved path)" in result.stderr


def test_the_client_refuses_an_answer_of_a_foreign_copy(site, proxy, local):
    store_user, alice = site.users[STORE_USER], site.users[ALICE]
    good = _squashfs(local / f"{KEY}.sqsh", store_user)
    alices = _squashfs(local / f"{'cd' * 32}.sqsh", alice)
    fake = FakeService(site.socket)
    uri = uri_of(proxy)

    def answered(line):
        fake.line = line.encode()
        return site.run(ALICE, "import", "--cache-only", uri)

    accepted = answered(f"ok {good}\n")
    assert accepted.returncode == 0, accepted.stderr
    assert accepted.stdout == f"{good}\n"
    refused = answered(f"ok {alices}\n")
    assert refused.returncode == 1
    assert refused.stderr == (f"berth: error: the image store's answer {alices}: owned by uid "
                              f"{alice.pw_uid}, not by BERTH_IMAGE_STORE_OWNER {STORE_USER} "
                              f"(uid {store_user.pw_uid}); refusing it\n")
    other = answered(f"ok {site.top}/{KEY}.sqsh\n")
    assert other.returncode == 1
    assert (f"not an image of BERTH_IMAGE_STORE={site.store} nor of BERTH_IMAGE_STORE_LOCAL="
            f"{local}; refusing it") in other.stderr
    # a directory above LOCAL alice may replace
    os.chown(site.top, alice.pw_uid, alice.pw_gid)
    replaceable = answered(f"ok {good}\n")
    assert replaceable.returncode == 1
    assert (f"{site.top} lets others replace what is in it (owner uid {alice.pw_uid}, "
            "mode 0755); refusing it") in replaceable.stderr
    os.chown(site.top, 0, 0)


def test_a_pruned_entrys_copy_goes_at_the_next_serve(site, service, proxy, registry, local):
    uri = uri_of(proxy)
    first = site.run(ALICE, "--quiet", "import", "--cache-only", uri)
    assert first.returncode == 0, first.stderr
    copy = Path(first.stdout.strip())
    # a killed copy's file of another key, and its lock file
    store_user = site.users[STORE_USER]
    partial = _squashfs(local / f"{KEY}.sqsh.tmp-99", store_user)
    age_store(site.store, hours=2)
    pruned = site.run(STORE_USER, "store", "prune", "--older-than", "1h")
    assert pruned.returncode == 0, pruned.stderr
    assert site.store_images() == [] and copy.exists()  # prune leaves the nodes' copies

    # the next serve on this node, of another image, sweeps after answering
    registry.push_image("test/other", "v1", [BASE])
    other = site.run(BOB, "--quiet", "import", "--cache-only", uri_of(proxy, "test/other:v1"))
    assert other.returncode == 0, other.stderr
    service.join()
    assert not copy.exists() and not partial.exists()
    assert _copy_names(local) == [Path(other.stdout.strip()).name]
    assert os.listdir(local / "locks") == [Path(other.stdout.strip()).name[:-5]]
    swept = service.results[-1][1]
    assert f"berth: removed {copy} (no longer in the store)\n" in swept
    assert f"berth: removed {partial} (left by a killed copy)\n" in swept

    # the first image again: imported into the store and copied anew
    again = site.run(ALICE, "--quiet", "import", "--cache-only", "--reuse", uri)
    assert again.returncode == 0, again.stderr
    assert again.stdout == first.stdout and copy.exists()


def test_a_copy_whose_entry_is_gone_is_not_taken(site, service, proxy, local):
    uri = uri_of(proxy)
    first = site.run(ALICE, "--quiet", "import", "--cache-only", uri)
    assert first.returncode == 0, first.stderr
    [entry] = site.store_images()
    entry.unlink()  # (uris/ still names it)
    service.join()
    served = len(service.results)
    again = site.run(BOB, "--quiet", "import", "--cache-only", "--reuse", uri)
    assert again.returncode == 0, again.stderr
    assert again.stdout == first.stdout
    service.join()
    assert len(service.results) == served + 1 and entry.exists()  # imported again


_SLOW_COPY = """
import os, sys, time
from berth import config
from berth.store import local as storelocal
real = os.write
def write(fd, data):
    done = real(fd, data)
    time.sleep(600)
    return done
os.write = write
storelocal.copied(config.load(), sys.argv[1])
"""


def test_a_killed_copy_leaves_no_copy_and_the_next_serve_makes_it(site, service, proxy, local):
    uri = uri_of(proxy)
    first = site.run(ALICE, "--quiet", "import", "--cache-only", uri)
    assert first.returncode == 0, first.stderr
    [entry] = site.store_images()
    copy = Path(first.stdout.strip())
    copy.unlink()
    store_user = site.users[STORE_USER]
    slow = subprocess.Popen(
        ["setpriv", f"--reuid={store_user.pw_uid}", f"--regid={store_user.pw_gid}",
         "--init-groups", "--", sys.executable, "-c", _SLOW_COPY, str(entry)],
        env=site.env(STORE_USER), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not any(".tmp-" in name for name in _copy_names(local)):
            assert time.monotonic() < deadline and slow.poll() is None
            time.sleep(0.05)
    finally:
        slow.send_signal(signal.SIGKILL)
        slow.wait()
    [partial] = _copy_names(local)
    assert partial.startswith(f"{copy.name}.tmp-") and not copy.exists()

    # no step takes it; the next serve removes it and copies again
    again = site.run(BOB, "import", "--cache-only", "--reuse", uri)
    assert again.returncode == 0, again.stderr
    assert again.stdout == f"{copy}\n" and again.stderr == ""
    assert _copy_names(local) == [copy.name]
    assert copy.read_bytes() == entry.read_bytes()


# A copy on a filesystem of `capacity` bytes, of which the copies are all
# that is used: what the store's service does on a node whose disk is that full.
_SMALL_DISK = """
import os, sys, types
from berth import config
from berth.store import local as storelocal
capacity = int(sys.argv[2])
def fstatvfs(fd):
    used = sum(os.stat(n, dir_fd=fd).st_size for n in os.listdir(fd) if n.endswith(".sqsh"))
    return types.SimpleNamespace(f_frsize=1, f_blocks=capacity, f_bavail=capacity - used)
os.fstatvfs = fstatvfs
print(storelocal.copied(config.load(), sys.argv[1]))
"""


def _copy_on_a_disk_of(site, entry, capacity):
    store_user = site.users[STORE_USER]
    return subprocess.run(
        ["setpriv", f"--reuid={store_user.pw_uid}", f"--regid={store_user.pw_gid}",
         "--init-groups", "--", sys.executable, "-c", _SMALL_DISK, str(entry), str(capacity)],
        env=site.env(STORE_USER), capture_output=True, text=True, timeout=120)


def test_copies_keep_a_floor_free_and_make_room_by_least_recent_use(site, service, proxy,
                                                                     local):
    """Any user can ask the store for every entry it holds: the copies must
    not fill the node's disk."""
    first = site.run(ALICE, "--quiet", "import", "--cache-only", uri_of(proxy))
    assert first.returncode == 0, first.stderr
    [entry] = site.store_images()
    Path(first.stdout.strip()).unlink()
    size, floor = entry.stat().st_size, 1 << 30

    # no room, none to make: the store's entry is answered, nothing copied
    full = _copy_on_a_disk_of(site, entry, floor + size - 1)
    assert full.returncode == 0, full.stderr
    assert full.stdout == f"{entry}\n"
    assert full.stderr == (f"berth: not copying {entry} to {local}: it would leave less than "
                           "1.0G free there; answering the store's entry\n")
    assert _copy_names(local) == []

    # an older copy of another entry goes for it
    older = local / f"{'a' * 64}.sqsh"
    older.write_bytes(entry.read_bytes())
    os.chown(older, site.users[STORE_USER].pw_uid, site.users[STORE_USER].pw_gid)
    os.utime(older, (time.time() - 86400, time.time() - 86400))
    made = _copy_on_a_disk_of(site, entry, floor + 2 * size - 1)
    assert made.returncode == 0, made.stderr
    assert made.stdout == f"{local / entry.name}\n"
    assert f"berth: removed {older} (least recently used, for a new copy)\n" in made.stderr
    assert _copy_names(local) == [entry.name]


def test_copies_stay_under_their_cap_and_an_entry_over_it_alone_takes_nothing(site, service,
                                                                             proxy, local):
    """BERTH_IMAGE_STORE_LOCAL_MAX_SIZE: the copies together stay under it
    however much disk is free; an entry larger than the cap is not copied,
    and costs the others nothing."""
    first = site.run(ALICE, "--quiet", "import", "--cache-only", uri_of(proxy))
    assert first.returncode == 0, first.stderr
    [entry] = site.store_images()
    Path(first.stdout.strip()).unlink()
    size, roomy = entry.stat().st_size, 1 << 40
    older = local / f"{'a' * 64}.sqsh"
    older.write_bytes(entry.read_bytes())
    os.chown(older, site.users[STORE_USER].pw_uid, site.users[STORE_USER].pw_gid)
    os.utime(older, (time.time() - 86400, time.time() - 86400))

    # over the cap by itself: the store's entry, the older copy kept
    _set(site, "BERTH_IMAGE_STORE_LOCAL_MAX_SIZE", size - 1)
    alone = _copy_on_a_disk_of(site, entry, roomy)
    assert alone.returncode == 0, alone.stderr
    assert alone.stdout == f"{entry}\n"
    assert alone.stderr == (f"berth: not copying {entry} to {local}: it alone is larger than "
                            f"BERTH_IMAGE_STORE_LOCAL_MAX_SIZE ({human_size(size - 1)}); "
                            "answering the store's entry\n")
    assert _copy_names(local) == [older.name]

    # room for one: the least recently used copy goes for it
    _set(site, "BERTH_IMAGE_STORE_LOCAL_MAX_SIZE", size + size // 2)
    made = _copy_on_a_disk_of(site, entry, roomy)
    assert made.returncode == 0, made.stderr
    assert made.stdout == f"{local / entry.name}\n"
    assert f"berth: removed {older} (least recently used, for a new copy)\n" in made.stderr
    assert _copy_names(local) == [entry.name]


# -- the key itself ---------------------------------------------------------------

def _cfg(tmp_path, **values):
    sysconf = tmp_path / "sysconf"
    sysconf.mkdir(exist_ok=True)
    (sysconf / "enroot.conf").write_text("".join(f"{k} {v}\n" for k, v in values.items()))
    return config.load({"ENROOT_SYSCONF_PATH": str(sysconf), "HOME": str(tmp_path)})


@pytest.mark.parametrize("read, values, message", [
    ("local_path", {"BERTH_IMAGE_STORE_LOCAL": "/var/lib/berth-local"},
     "BERTH_IMAGE_STORE_LOCAL=/var/lib/berth-local: set without BERTH_IMAGE_STORE"),
    ("local_path", {"BERTH_IMAGE_STORE": "/shared/store", "BERTH_IMAGE_STORE_LOCAL": "local"},
     "BERTH_IMAGE_STORE_LOCAL=local: not an absolute path"),
    ("local_path", {"BERTH_IMAGE_STORE": "/shared/store",
                    "BERTH_IMAGE_STORE_LOCAL": "/shared/store/local"},
     "BERTH_IMAGE_STORE_LOCAL=/shared/store/local: inside BERTH_IMAGE_STORE=/shared/store"),
    ("local_path", {"BERTH_IMAGE_STORE": "/shared/store",
                    "BERTH_IMAGE_STORE_LOCAL": "/shared/store/"},
     "BERTH_IMAGE_STORE_LOCAL=/shared/store: inside BERTH_IMAGE_STORE=/shared/store"),
    ("local_limit", {"BERTH_IMAGE_STORE": "/shared/store",
                     "BERTH_IMAGE_STORE_LOCAL_MAX_SIZE": "500G"},
     "BERTH_IMAGE_STORE_LOCAL_MAX_SIZE=500G: set without BERTH_IMAGE_STORE_LOCAL"),
    ("local_limit", {"BERTH_IMAGE_STORE": "/shared/store",
                     "BERTH_IMAGE_STORE_LOCAL": "/var/lib/berth-local",
                     "BERTH_IMAGE_STORE_LOCAL_MAX_SIZE": "lots"},
     "BERTH_IMAGE_STORE_LOCAL_MAX_SIZE=lots: expected a size such as 200G"),
    ("local_limit", {"BERTH_IMAGE_STORE": "/shared/store",
                     "BERTH_IMAGE_STORE_LOCAL": "/var/lib/berth-local",
                     "BERTH_IMAGE_STORE_LOCAL_MAX_SIZE": "-1G"},
     "BERTH_IMAGE_STORE_LOCAL_MAX_SIZE=-1G: expected a size"),
])
def test_a_wrong_local_setting_is_one_line_naming_the_key(tmp_path, read, values, message):
    with pytest.raises(BerthError) as raised:
        getattr(store, read)(_cfg(tmp_path, **values))
    assert str(raised.value).startswith(message)
    assert "\n" not in str(raised.value)


def test_the_cap_reads_the_runtimes_sizes(tmp_path):
    local = {"BERTH_IMAGE_STORE": "/shared/store", "BERTH_IMAGE_STORE_LOCAL": "/var/lib/l"}
    assert store.local_limit(_cfg(tmp_path, **local)) is None
    assert store.local_limit(_cfg(tmp_path, **local, BERTH_IMAGE_STORE_LOCAL_MAX_SIZE="1.5T")) \
        == int(1.5 * 2**40)


def test_no_local_directory_is_todays_behaviour(tmp_path):
    assert store.local_path(_cfg(tmp_path, BERTH_IMAGE_STORE="/shared/store")) is None
    assert store.local_path(_cfg(tmp_path, BERTH_IMAGE_STORE="/shared/store",
                                 BERTH_IMAGE_STORE_LOCAL="/var/lib/berth-local")) \
        == "/var/lib/berth-local"
