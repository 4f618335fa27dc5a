"""The shared image store (store.py): `berth store serve` as the store's
account behind a Unix socket, and `berth import --cache-only` of ordinary
users as its clients, against a real registry behind the counting proxy.

The socket's service is this test's: a thread accepts each connection and
runs one `berth store serve` with it as stdin and stdout, as the throw-away
store account (setpriv, keeping the environment), as systemd's
berth-store.socket (Accept=yes) would.
"""

import contextlib
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from registry_fixture import (
    FORGED_DIGEST,
    Proxy,
    berth,
    berth_env,
    forged_part,
    gzipped,
    layer_tar,
    throwaway_users,
)
from test_sif import sifs  # noqa: F401 (a fixture)

pytestmark = [
    pytest.mark.skipif(not shutil.which("docker-registry"),
                       reason="needs docker-registry (Debian package docker-registry)"),
    pytest.mark.skipif(os.geteuid() != 0, reason="plays the store's account and two users"),
]

BASE = gzipped(layer_tar(("dir", "etc"), ("file", "etc/os-release", b"ID=berth\n")))
TOP = gzipped(layer_tar(("file", "etc/added", b"added\n")))
# test_store_local.py makes these accounts too: names of their own per
# pytest-xdist worker (gw0, gw1, ...), as the two files may run at once
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
STORE_USER, ALICE, BOB = (f"bdep-{name}{_WORKER}" for name in ("store", "alice", "bob"))
KEY = "ab" * 32  # an image's file name in images/: 64 hex digits


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    from registry_fixture import Registry
    reg = Registry(tmp_path_factory.mktemp("registry"))
    reg.app_digest = reg.push_image("test/app", "v1", [BASE, TOP])
    yield reg
    reg.stop()


@pytest.fixture(scope="module")
def users():
    with throwaway_users(STORE_USER, ALICE, BOB) as made:
        yield made


def _owned_dir(path, user, mode=0o755):
    path.mkdir(mode=mode, parents=True, exist_ok=True)
    path.chmod(mode)
    os.chown(path, user.pw_uid, user.pw_gid)
    return path


def _credentials(directory, user, host):
    _owned_dir(directory, user, 0o700)
    path = directory / ".credentials"
    path.write_text(f"machine {host.split(':')[0]} login alice password secret\n")
    path.chmod(0o600)
    os.chown(path, user.pw_uid, user.pw_gid)


class Site:
    """A node's view: the store (the store account's, 0755), the admin's
    enroot.conf naming it, the socket's path, and a home per user."""

    def __init__(self, top, users, tmp_path):
        self.top, self.users = top, users
        self.store = _owned_dir(top / "store", users[STORE_USER])
        self.socket = top / "run" / "berth-store.sock"
        (top / "run").mkdir(mode=0o755)
        self.sysconf = top / "sysconf"
        self.sysconf.mkdir(mode=0o755)
        (self.sysconf / "enroot.conf").write_text(
            f"BERTH_IMAGE_STORE {self.store}\n"
            f"BERTH_IMAGE_STORE_SOCKET {self.socket}\n"
            f"BERTH_IMAGE_STORE_OWNER {STORE_USER}\n")
        self.homes = {name: _owned_dir(top / name, users[name], 0o700) for name in users}

    def env(self, name, **overrides):
        home = self.homes[name]
        env = berth_env(home, ENROOT_SYSCONF_PATH=str(self.sysconf), HOME=str(home),
                        **overrides)
        for path in (home / "temp", home / "config"):
            _owned_dir(path, self.users[name], 0o700)
        return env

    def run(self, name, *args, env=None):
        return berth(list(args), env or self.env(name), self.homes[name], user=name)

    def serve_command(self):
        store = self.users[STORE_USER]
        # umask 077: serve must set its own (022), whatever it is started with
        return ["setpriv", f"--reuid={store.pw_uid}", f"--regid={store.pw_gid}",
                "--init-groups", "--", "sh", "-c", 'umask 077 && exec "$@"', "serve",
                sys.executable, "-m", "berth.cli", "store", "serve"]

    def own_images(self, name):
        return sorted((self.homes[name] / "cache" / "images").glob("*.sqsh"))

    def store_images(self):
        return sorted((self.store / "images").glob("*.sqsh"))


@pytest.fixture
def site(users, tmp_path):
    top = Path(tempfile.mkdtemp(prefix="bdep-store-", dir="/tmp"))
    top.chmod(0o755)
    yield Site(top, users, tmp_path)
    shutil.rmtree(top)


class UnixServer:
    """A listening AF_UNIX socket, mode 0666, handling each connection in a thread."""

    def __init__(self, path):
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(path))
        os.chmod(path, 0o666)
        self.listener.listen(16)
        self.threads = []
        self.acceptor = threading.Thread(target=self._accept, daemon=True)
        self.acceptor.start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self.threads.append(thread)
            thread.start()

    def join(self):
        for thread in list(self.threads):
            thread.join(120)

    def stop(self):
        """The accept thread ended before the socket is closed: an accept
        under way past the close would take the next test's connections,
        whose listener gets the same descriptor number."""
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)  # ends a blocked accept
        self.acceptor.join(30)
        self.listener.close()
        self.join()


class StoreService(UnixServer):
    """berth-store.socket in a thread: per connection, one `berth store
    serve` as the store's account, its stdin and stdout the connection."""

    def __init__(self, site, env):
        self.site = site
        # stdout buffered, as the unit has it: a PYTHONUNBUFFERED of the
        # machine's would hide what a closed connection leaves in the buffer
        self.env = {key: value for key, value in env.items() if key != "PYTHONUNBUFFERED"}
        self.results = []  # (exit status, stderr) of each serve
        super().__init__(site.socket)

    def _serve(self, conn):
        with conn:
            served = subprocess.run(self.site.serve_command(), stdin=conn.fileno(),
                                    stdout=conn.fileno(), stderr=subprocess.PIPE,
                                    env=self.env, text=True, timeout=120, check=False)
        self.results.append((served.returncode, served.stderr))

    def ask(self, request):
        """Send raw bytes as a client would; the answer line and the serve's result."""
        before = len(self.results)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect(str(self.site.socket))
            sock.sendall(request)
            sock.shutdown(socket.SHUT_WR)
            answer = b""
            while chunk := sock.recv(4096):
                answer += chunk
        self.join()
        assert len(self.results) == before + 1
        return answer.decode(), self.results[-1]


@pytest.fixture
def private(registry):
    """The same registry, behind a proxy that wants alice's password."""
    proxy = Proxy(registry.url, auth="basic", login="alice", password="secret")
    yield proxy
    proxy.stop()


@pytest.fixture
def service(site, private):
    """The store's service. Its account has credentials for the private
    proxy, in its ENROOT_CONFIG_PATH and under its HOME: serve must read
    neither."""
    store_user = site.users[STORE_USER]
    env = site.env(STORE_USER)
    _credentials(site.homes[STORE_USER] / "config", store_user, private.host)
    dot = _owned_dir(site.homes[STORE_USER] / ".config" / "enroot", store_user, 0o700)
    _credentials(dot, store_user, private.host)
    service = StoreService(site, env)
    yield service
    service.stop()


class FakeService(UnixServer):
    """A socket that answers every connection with `line`, whatever is asked."""

    def __init__(self, path):
        self.line = b"error unset\n"
        super().__init__(path)

    def _serve(self, conn):
        with conn:
            conn.recv(8192)
            conn.sendall(self.line)


def age_store(store, hours):
    """Every image, layer and uris/ link of the store last used `hours` ago."""
    then = time.time() - hours * 3600
    for name in ("images", "blobs/sha256", "uris"):
        for path in (store / name).iterdir():
            os.utime(path, (then, then), follow_symlinks=False)


def uri_of(proxy, image="test/app:v1"):
    return f"docker://{proxy.host}#{image}"


def modes(root):
    return {str(p.relative_to(root)): (stat.S_IMODE(p.lstat().st_mode), p.lstat().st_uid)
            for p in [root, *root.rglob("*")]}


def tree(root):
    return {str(p.relative_to(root)): (p.lstat().st_mtime_ns, p.lstat().st_size,
                                       p.lstat().st_mode)
            for p in [root, *root.rglob("*")]}


# -- the store serves every user -----------------------------------------------

def test_two_users_get_one_pull_and_the_same_entry(site, service, proxy, registry):
    uri = uri_of(proxy)
    results = {}

    def run(name):
        results[name] = site.run(name, "import", "--cache-only", "--digest", uri)

    threads = [threading.Thread(target=run, args=(name,)) for name in (ALICE, BOB)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for name in (ALICE, BOB):
        assert results[name].returncode == 0, results[name].stderr
        assert results[name].stderr == ""
    [entry] = site.store_images()
    assert results[ALICE].stdout == results[BOB].stdout == \
        f"{entry}\n{registry.app_digest}\n"
    service.join()
    assert [code for code, _ in service.results] == [0, 0], service.results

    # One download of each blob (config and two layers) for both users.
    blobs = proxy.blob_requests()
    assert len(blobs) == len(set(blobs)) == 3, blobs
    # Nothing in the users' own caches.
    assert site.own_images(ALICE) == site.own_images(BOB) == []

    store_uid = site.users[STORE_USER].pw_uid
    found = modes(site.store)
    for name in ("", "images", "blobs", "blobs/sha256", "uris"):
        assert found[name if name else "."] == (0o755, store_uid), name
    assert found["locks"] == (0o700, store_uid)  # nobody else can hold an import's lock
    assert found[f"images/{entry.name}"] == (0o644, store_uid)
    for name, (mode, uid) in found.items():
        link = (site.store / name).is_symlink()  # uris/: links are 0777 everywhere
        assert uid == store_uid and (link or not mode & 0o022), (name, oct(mode))


def test_a_sif_image_from_a_registry_is_pulled_once_for_everyone(site, service, proxy,
                                                                   registry, sifs):
    """oras://: the store keeps the SIF file (with Berth's record) as it keeps
    a squashfs, one pull for both users, listed under its URI."""
    from test_sif_oras import push_sif
    digest = push_sif(registry, "apps/sif", "1", (sifs / "app.sif").read_bytes())
    uri = f"oras://{proxy.host}/apps/sif:1"
    first = site.run(ALICE, "import", "--cache-only", "--digest", uri)
    second = site.run(BOB, "import", "--cache-only", "--digest", uri)
    assert first.returncode == second.returncode == 0, first.stderr + second.stderr
    [entry] = site.store_images()
    assert first.stdout == second.stdout == f"{entry}\n{digest}\n"
    assert site.own_images(ALICE) == site.own_images(BOB) == []
    listed = site.run(BOB, "store", "list").stdout.split()
    assert listed[3:5] == [uri, str(entry)]


def test_no_user_can_hold_a_lock_of_the_store(site, service, proxy):
    """A user holding an entry's flock (a read-only descriptor is enough) held
    every import of that image, its node-local copies and the prune for ever."""
    uri = uri_of(proxy)
    (site.store / "locks").mkdir(mode=0o755)  # a store made by an earlier release
    os.chown(site.store / "locks", site.users[STORE_USER].pw_uid, site.users[STORE_USER].pw_gid)
    result = site.run(ALICE, "import", "--cache-only", uri)
    assert result.returncode == 0, result.stderr
    locks = site.store / "locks"
    assert stat.S_IMODE(locks.stat().st_mode) == 0o700
    lock_files = sorted(locks.iterdir())
    assert lock_files
    hold = ("import fcntl, sys\nfor path in sys.argv[1:]:\n"
            "    fcntl.flock(open(path), fcntl.LOCK_SH)\n")
    held = subprocess.run(["runuser", "-u", BOB, "--", sys.executable, "-c", hold,
                           *map(str, lock_files)], capture_output=True, text=True, timeout=60)
    assert held.returncode != 0 and "Permission denied" in held.stderr, held.stderr


_HOLD_CONNECTIONS = """
import socket, sys, time
held = []
for _ in range(int(sys.argv[2])):
    held.append(socket.socket(socket.AF_UNIX))
    held[-1].connect(sys.argv[1])
print("holding", flush=True)
time.sleep(600)
"""


def test_one_user_cannot_take_every_slot_of_the_socket(site, service, proxy):
    """Idle connections, renewed before REQUEST_TIMEOUT, took every import
    slot of a node: a user now holds at most PER_USER_CONNECTIONS."""
    alice = site.users[ALICE]
    # (setpriv execs: the process killed below is the one holding the connections)
    holder = subprocess.Popen(["setpriv", f"--reuid={alice.pw_uid}", f"--regid={alice.pw_gid}",
                               "--init-groups", "--", sys.executable, "-c", _HOLD_CONNECTIONS,
                               str(site.socket), "4"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "holding\n"
        time.sleep(1)  # the four serves are up, each holding one of alice's slots
        uri = uri_of(proxy)
        mine = site.run(ALICE, "import", "--cache-only", uri)
        assert mine.returncode == 0, mine.stderr
        assert mine.stderr.startswith(f"berth: the image store: uid {site.users[ALICE].pw_uid} "
                                      "has 4 requests open on this node already; importing "
                                      "into your own cache\n"), mine.stderr
        assert site.own_images(ALICE) and site.store_images() == []
        theirs = site.run(BOB, "--quiet", "import", "--cache-only", uri)
        assert theirs.returncode == 0, theirs.stderr
        assert site.store_images() and site.own_images(BOB) == []
    finally:
        holder.kill()
        holder.wait()


def test_a_client_killed_mid_import_leaves_one_journal_line_and_the_entry(site, service,
                                                                          proxy):
    """A client SIGKILLed while the store imports (a cancelled step): the
    import goes on to its end, the entry stays for the next request, and the
    serve says in one line that its client went away, not with Python's
    `Exception ignored ... BrokenPipeError` at its exit."""
    alice = site.users[ALICE]
    uri = uri_of(proxy)
    proxy.blob_delay = 0.5  # the client is killed while its store waits on a blob
    client = subprocess.Popen(["setpriv", f"--reuid={alice.pw_uid}", f"--regid={alice.pw_gid}",
                               "--init-groups", "--", sys.executable, "-m", "berth.cli",
                               "import", "--cache-only", uri],
                              env=site.env(ALICE), cwd=site.homes[ALICE],
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not proxy.blob_requests() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proxy.blob_requests(), "the store never asked for a blob"
    finally:
        client.kill()
        client.wait()
    service.join()
    [entry] = site.store_images()
    [(code, journal)] = service.results
    assert (code, journal.splitlines()) == (0, [
        "berth: store serve: the client went away before its answer (Broken pipe): "
        f"ok {entry}"]), journal
    proxy.blob_delay = 0
    pulled = len(proxy.blob_requests())
    second = site.run(BOB, "import", "--cache-only", uri)
    assert (second.returncode, second.stdout) == (0, f"{entry}\n"), second.stderr
    assert len(proxy.blob_requests()) == pulled


def _write_imports(site, uid, rows):
    """users/UID of the store as its account would have written it."""
    record = site.store / "users" / str(uid)
    record.write_text("".join(f"{start} {pid} {size}\n" for start, pid, size in rows))
    os.chown(record, site.users[STORE_USER].pw_uid, site.users[STORE_USER].pw_gid)


def test_one_user_gets_her_hourly_share_of_the_store_and_no_more(site, service, proxy,
                                                                  registry):
    """Any user could make the store import image after image, for everyone
    to hold: each now gets IMPORTS_PER_HOUR new entries an hour (or
    IMPORT_BYTES_PER_HOUR), then imports into her own cache."""
    from berth.store.service import IMPORT_BYTES_PER_HOUR, IMPORTS_PER_HOUR
    alice, bob = site.users[ALICE].pw_uid, site.users[BOB].pw_uid
    first = site.run(ALICE, "--quiet", "import", "--cache-only", uri_of(proxy))
    assert first.returncode == 0, first.stderr
    [entry] = site.store_images()
    record = site.store / "users" / str(alice)
    assert modes(site.store / "users")[str(record.relative_to(site.store / "users"))] == (
        0o600, site.users[STORE_USER].pw_uid)
    assert stat.S_IMODE((site.store / "users").stat().st_mode) == 0o700
    [(start, pid, size)] = [tuple(map(int, line.split())) for line in
                            record.read_text().splitlines()]
    assert abs(start - time.time()) < 120 and pid > 1 and size == entry.stat().st_size

    registry.push_image("test/app", "v2", [BASE, gzipped(layer_tar(("file", "v2", b"2\n")))])
    now = int(time.time())
    for rows, used in (([(now - 60, 1, 1)] * IMPORTS_PER_HOUR, f"{IMPORTS_PER_HOUR}, 20B"),
                       ([(now - 60, 1, IMPORT_BYTES_PER_HOUR)], "1, 100.0G")):
        _write_imports(site, alice, rows)
        over = site.run(ALICE, "import", "--cache-only", uri_of(proxy, "test/app:v2"))
        assert over.returncode == 0, over.stderr
        assert over.stderr == (f"berth: the image store: uid {alice} used its hourly share of "
                               f"the store's imports ({IMPORTS_PER_HOUR} images or 100.0G): "
                               f"{used}, in the last hour; importing into your own cache\n")
        assert len(site.own_images(ALICE)) == 1 and site.store_images() == [entry]
        # an entry the store holds costs her nothing: still served
        held = site.run(ALICE, "--quiet", "import", "--cache-only", uri_of(proxy))
        assert held.returncode == 0 and held.stdout == f"{entry}\n", held.stderr
        Path(site.own_images(ALICE)[0]).unlink()

    theirs = site.run(BOB, "--quiet", "import", "--cache-only", uri_of(proxy, "test/app:v2"))
    assert theirs.returncode == 0, theirs.stderr
    assert len(site.store_images()) == 2 and site.own_images(BOB) == []
    assert len((site.store / "users" / str(bob)).read_text().splitlines()) == 1

    # an hour later her share is whole again, and the old lines are gone
    _write_imports(site, alice, [(now - 3700, 1, IMPORT_BYTES_PER_HOUR)] * IMPORTS_PER_HOUR)
    registry.push_image("test/app", "v3", [BASE, gzipped(layer_tar(("file", "v3", b"3\n")))])
    again = site.run(ALICE, "--quiet", "import", "--cache-only", uri_of(proxy, "test/app:v3"))
    assert again.returncode == 0, again.stderr
    assert len(site.store_images()) == 3 and site.own_images(ALICE) == []
    assert len(record.read_text().splitlines()) == 1


def test_a_layer_bomb_stops_at_the_nodes_free_floor(site, service, proxy, registry):
    """A layer of a few hundred kilobytes that unpacks to hundreds of
    megabytes, asked of the store by any user, filled the disk of the node
    whose service unpacked it. It now stops where it would leave the
    filesystem less than its floor (a tenth, at least 1 GiB) free."""
    from berth.image.squash import FREE_FLOOR_BYTES
    temp = site.homes[STORE_USER] / "temp"
    store_user = site.users[STORE_USER]
    big = 300 << 20
    registry.push_image("test/bomb", "v1", [BASE, gzipped(layer_tar(("file", "big",
                                                                      bytes(big))))])
    # a disk with about 200 MiB above its floor (tmpfs: nothing is held until written)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={FREE_FLOOR_BYTES + (200 << 20)},"
                    f"mode=0700,uid={store_user.pw_uid},gid={store_user.pw_gid}",
                    "bdep-store-temp", str(temp)], check=True)
    try:
        bomb = site.run(ALICE, "import", "--cache-only", uri_of(proxy, "test/bomb:v1"))
        assert bomb.returncode == 1
        [line] = bomb.stderr.splitlines()
        assert line.startswith("berth: error: the image store: layer sha256:"), line
        assert line.endswith(f": 'big' ({big} bytes) would leave the filesystem of {temp} "
                             f"under the {FREE_FLOOR_BYTES} bytes kept free there; refusing "
                             "the layer"), line
        assert os.listdir(temp) == ["slots"] and shutil.disk_usage(temp).used < (1 << 20)
        assert site.store_images() == [] and site.own_images(ALICE) == []
        # an image that fits is served from the same disk
        fits = site.run(ALICE, "--quiet", "import", "--cache-only", uri_of(proxy))
        assert fits.returncode == 0, fits.stderr
        assert len(site.store_images()) == 1 and os.listdir(temp) == ["slots"]
    finally:
        service.join()  # (a serve still ending holds the mount busy)
        subprocess.run(["umount", str(temp)], check=True)


def test_a_user_cannot_write_the_store(site, service, proxy):
    result = site.run(ALICE, "--quiet", "import", "--cache-only", uri_of(proxy))
    assert result.returncode == 0, result.stderr
    entry = Path(result.stdout.strip())
    before = tree(site.store)
    script = (
        "import os, sys\n"
        "done = []\n"
        "attempts = {\n"
        "    'append': lambda: open(sys.argv[1], 'ab').close(),\n"
        "    'create': lambda: open(os.path.join(os.path.dirname(sys.argv[1]), "
        "'x' * 64 + '.sqsh'), 'wb').close(),\n"
        "    'unlink': lambda: os.unlink(sys.argv[1]),\n"
        "    'touch': lambda: os.utime(sys.argv[1]),\n"
        "    'lock': lambda: open(os.path.join(sys.argv[2], 'locks', 'mine'), 'wb').close(),\n"
        "}\n"
        "for name, attempt in attempts.items():\n"
        "    try:\n"
        "        attempt()\n"
        "        done.append(name)\n"
        "    except PermissionError:\n"
        "        pass\n"
        "print(' '.join(done))\n")
    tried = subprocess.run(["runuser", "-u", ALICE, "--", sys.executable, "-c", script,
                            str(entry), str(site.store)], capture_output=True, text=True,
                           check=True)
    assert tried.stdout == "\n", tried.stdout
    assert tree(site.store) == before


def test_reuse_takes_the_stores_entry_without_any_request(site, service, proxy, registry):
    first = site.run(ALICE, "--quiet", "import", "--cache-only", uri_of(proxy))
    assert first.returncode == 0, first.stderr
    before = tree(site.store)
    proxy.requests.clear()
    service.join()
    served = len(service.results)

    # bob never imported it: his own cache is empty, the store's entry serves
    again = site.run(BOB, "import", "--cache-only", "--reuse", "--digest", uri_of(proxy))
    assert again.returncode == 0, again.stderr
    assert again.stderr == ""
    assert again.stdout == f"{first.stdout.strip()}\n{registry.app_digest}\n"
    assert proxy.requests == []
    assert len(service.results) == served  # the socket was not asked either
    assert tree(site.store) == before  # read only: not even marked used
    assert site.own_images(BOB) == []

    # another URI: not in the store; --reuse then asks the socket
    registry.push_image("test/reused", "v1", [BASE])
    other = site.run(BOB, "--quiet", "import", "--cache-only", "--reuse",
                     uri_of(proxy, "test/reused:v1"))
    assert other.returncode == 0, other.stderr
    service.join()
    assert len(service.results) == served + 1
    assert len(site.store_images()) == 2


def test_start_of_a_registry_image_takes_the_stores_entry(site, service, proxy, registry,
                                                         usable_fuse):
    """`berth start docker://URI` finds its image as `import --cache-only` would."""
    from test_start_uri import OS_RELEASE, push_busybox
    digest = push_busybox(registry)
    uri = uri_of(proxy, "test/busybox:v1")

    def start(name, *args):
        env = site.env(name, ENROOT_RUNTIME_PATH=str(site.homes[name] / "run"))
        return site.run(name, "start", *args, env=env)

    first = start(ALICE, uri, "cat", "/etc/os-release")
    assert first.returncode == 0, first.stderr
    assert first.stdout == OS_RELEASE and first.stderr == ""
    service.join()
    assert [code for code, _ in service.results] == [0]  # the store pulled it
    [entry] = site.store_images()
    assert site.own_images(ALICE) == []
    imported = site.run(ALICE, "--quiet", "import", "--cache-only", "--digest", uri)
    assert imported.stdout == f"{entry}\n{digest}\n", imported.stderr
    service.join()
    before, served = tree(site.store), len(service.results)
    proxy.requests.clear()

    # bob never imported it: with --reuse the store's entry serves, nobody is asked
    # (stdin is /dev/null: the detached start ends once it printed its pid)
    again = start(BOB, "--detach", "--reuse", uri)
    assert again.returncode == 0, again.stderr
    lines = again.stdout.splitlines()
    assert len(lines) == 2 and lines[0] == f"{digest} cached" and lines[1].isdigit(), again.stdout
    assert proxy.requests == [] and len(service.results) == served
    assert tree(site.store) == before
    assert site.own_images(BOB) == []
    assert list((site.homes[BOB] / "run").iterdir()) == []


def test_store_list_shows_the_entries(site, service, proxy):
    result = site.run(ALICE, "--quiet", "import", "--cache-only", uri_of(proxy))
    assert result.returncode == 0, result.stderr
    listed = site.run(BOB, "store", "list")
    assert listed.returncode == 0, listed.stderr
    [line] = listed.stdout.splitlines()
    size, day, clock, uri, path = line.split()
    assert (uri, path) == (uri_of(proxy), result.stdout.strip())
    assert size.endswith("K") and day.count("-") == 2 and clock.count(":") == 1


def test_no_layer_chooses_the_digest_or_source_the_store_reports(site, service, proxy,
                                                                  registry):
    """A lower layer posing as a part: a marker whose link target forges
    the line `unsquashfs -lls` would print for Berth's, and an image.json
    claiming another source and digest. The store's entry is the image's
    whole, and reports what the registry and the request said."""
    posing = gzipped(layer_tar(*forged_part(9, marker="link")))
    digest = registry.push_image("test/forge", "v1", [BASE, posing, TOP])
    uri = uri_of(proxy, "test/forge:v1")
    result = site.run(ALICE, "import", "--cache-only", "--digest", uri)
    assert result.returncode == 0, result.stderr
    path, printed = result.stdout.split()
    assert printed == digest != FORGED_DIGEST
    listed = site.run(BOB, "store", "list")
    assert listed.returncode == 0, listed.stderr
    [line] = [line for line in listed.stdout.splitlines() if line.endswith(path)]
    assert line.split()[3] == uri and "nvcr" not in listed.stdout, listed.stdout
    again = site.run(BOB, "import", "--cache-only", "--digest", "--reuse", uri)
    assert again.returncode == 0 and again.stdout.split() == [path, digest], again.stderr


def test_prune_after_real_imports(site, service, proxy):
    """What a serve wrote (entry, layers, uris/ link, lock files) goes once
    unused for an hour; the next request imports again."""
    uri = uri_of(proxy)
    first = site.run(ALICE, "--quiet", "import", "--cache-only", uri)
    assert first.returncode == 0, first.stderr
    before = tree(site.store)
    fresh = site.run(STORE_USER, "store", "prune", "--max-size", "0")
    assert fresh.returncode == 0, fresh.stderr
    assert fresh.stdout.startswith("freed 0B (0 bytes: images 0, layers 0, partial files 0, ")
    assert tree(site.store) == before  # a client may be about to mount it

    age_store(site.store, hours=2)
    pruned = site.run(STORE_USER, "store", "prune", "--older-than", "1h")
    assert pruned.returncode == 0, pruned.stderr
    assert f"  {uri}  {first.stdout.strip()}\n" in pruned.stdout
    # uris/ links: the URI's, and the record of the lower layers the entry holds (parts.py)
    assert "images 1, layers 2, partial files 0, uris/ links 2); 0 in use kept; 0B (0 bytes)" \
        in pruned.stdout
    for name in ("images", "blobs/sha256", "uris", "locks"):
        assert os.listdir(site.store / name) == [], name

    proxy.requests.clear()
    again = site.run(BOB, "--quiet", "import", "--cache-only", uri)
    assert again.returncode == 0, again.stderr
    assert again.stdout == first.stdout  # the same key, built again
    assert len(proxy.blob_requests()) == 3


# -- private images go to the user's own cache -----------------------------------

def test_a_private_image_falls_back_to_the_users_cache(site, service, private):
    uri = uri_of(private)
    answer, (code, _) = service.ask(f"{uri}\n".encode())
    assert answer.startswith("private registry ") and ("refused access to test/app (401 "
                                                       "Unauthorized) with no credentials (an "
                                                       "anonymous pull)") in answer, answer
    assert code == 0

    _credentials(site.homes[ALICE] / "config", site.users[ALICE], private.host)
    result = site.run(ALICE, "import", "--cache-only", uri)
    assert result.returncode == 0, result.stderr
    assert result.stderr == (f"berth: the image store cannot pull {uri} without credentials; "
                             "importing into your own cache\n")
    [own] = site.own_images(ALICE)
    assert result.stdout == f"{own}\n"
    assert site.store_images() == []  # the store's account had credentials, unread

    # bob has none: his own import is refused by the registry
    refused = site.run(BOB, "--quiet", "import", "--cache-only", uri)
    assert refused.returncode == 1
    assert "refused access" in refused.stderr and site.own_images(BOB) == []


def test_a_users_enroot_sysconf_path_never_reaches_the_store(site, service, proxy):
    """The admin blocks the registry; alice points ENROOT_SYSCONF_PATH at a
    configuration of her own without the rule. The store's service reads the
    admin's only: it refuses, naming the admin's file, and holds nothing."""
    uri = uri_of(proxy)
    (site.sysconf / "registries.conf").write_text(
        f'[[registry]]\nprefix = "{proxy.host}"\nblocked = true\n')
    own_sysconf = _owned_dir(site.homes[ALICE] / "sysconf", site.users[ALICE])
    (own_sysconf / "enroot.conf").write_text((site.sysconf / "enroot.conf").read_text())
    answer, _ = service.ask(f"{uri}\n".encode())
    assert answer.startswith(f"error {proxy.host}/test/app is blocked by the rule for "), answer

    result = site.run(ALICE, "import", "--cache-only", uri,
                      env={**site.env(ALICE), "ENROOT_SYSCONF_PATH": str(own_sysconf)})
    assert result.returncode == 1
    assert result.stderr.startswith(f"berth: error: the image store: {proxy.host}/test/app is "
                                    "blocked by the rule for "), result.stderr
    assert f"({site.sysconf}/registries.conf:1)" in result.stderr
    assert site.store_images() == []


def test_a_missing_repository_is_the_users_to_pull(site, service, proxy):
    uri = uri_of(proxy, "test/nothere:v1")
    result = site.run(ALICE, "import", "--cache-only", uri)
    assert result.returncode == 1
    lines = result.stderr.splitlines()
    assert lines[0] == (f"berth: the image store cannot pull {uri} without credentials; "
                        "importing into your own cache")
    assert lines[1].startswith("berth: error: image not found: ")
    assert len(lines) == 2


# -- what serve refuses -------------------------------------------------------------

@pytest.mark.parametrize("request_bytes, reason", [
    (b"docker-archive:/etc/shadow\n", "no archives"),
    (b"oci-archive:/etc/shadow.tar\n", "no archives"),
    (b"oci:/etc\n", "no archives"),
    (b"docker://alice@HOST#test/app:v1\n", "USER@"),
    (b"docker://HOST#test/app:v1\ndocker://HOST#test/other:v1\n", "more than one line"),
    (b"docker://HOST#test/app:v1\n--reuse", "more than one line"),
    (b"docker://HOST#" + b"a" * 4090 + b":v1\n", "longer than 4096 bytes"),
    (b"", "empty request"),
    (b"--reuse docker://HOST#test/app:v1\n", "not a registry reference"),
    (b"/etc/passwd\n", "not a registry reference"),
    (b"docker://HOST#test/app:v1\r\n", "control characters"),
])
def test_serve_refuses_anything_but_one_registry_reference(site, service, proxy,
                                                           request_bytes, reason):
    request_bytes = request_bytes.replace(b"HOST", proxy.host.encode())
    answer, (code, stderr) = service.ask(request_bytes)
    assert answer.startswith("error ") and answer.endswith("\n") and answer.count("\n") == 1
    assert reason in answer, answer
    assert code == 1 and stderr == f"berth: error: store serve: {answer[6:]}"
    assert proxy.requests == []
    assert site.store_images() == []


def test_serve_refuses_to_run_as_root_or_as_another_user(site, proxy):
    for command in (
            [sys.executable, "-m", "berth.cli", "store", "serve"],
            ["runuser", "-u", ALICE, "--", sys.executable, "-m", "berth.cli", "store", "serve"]):
        result = subprocess.run(command, input=f"{uri_of(proxy)}\n", env=site.env(ALICE),
                                capture_output=True, text=True, timeout=60, check=False)
        assert result.returncode == 1
        assert result.stdout.startswith("error berth store serve ")
        assert ("refuses to run as root" in result.stdout if command[0] != "runuser"
                else "not as BERTH_IMAGE_STORE_OWNER" in result.stdout), result.stdout
        assert result.stderr.count("\n") == 1 and result.stderr.startswith("berth: error:")
    assert proxy.requests == []
    assert not (site.store / "images").exists()


# -- what the client refuses -----------------------------------------------------------

def _squashfs(path, owner):
    source = Path(tempfile.mkdtemp(prefix="bdep-sq-"))
    try:
        (source / "file").write_text("x\n")
        path.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mksquashfs", str(source), str(path), "-noappend", "-no-progress"],
                       check=True, capture_output=True)
    finally:
        shutil.rmtree(source)
    path.chmod(0o644)
    os.chown(path, owner.pw_uid, owner.pw_gid)
    return path


def test_the_client_takes_only_the_stores_own_whole_entries(site, proxy):
    store_user, alice = site.users[STORE_USER], site.users[ALICE]
    images = _owned_dir(site.store / "images", store_user)
    good = _squashfs(images / f"{KEY}.sqsh", store_user)
    outside = _squashfs(site.top / "elsewhere" / f"{KEY}.sqsh", store_user)
    alices = _squashfs(images / f"{'cd' * 32}.sqsh", alice)
    writable = _squashfs(images / f"{'ef' * 32}.sqsh", store_user)
    writable.chmod(0o666)
    cut = _squashfs(images / f"{'01' * 32}.sqsh", store_user)
    os.truncate(cut, 100)
    link = images / f"{'23' * 32}.sqsh"
    link.symlink_to(outside)
    misnamed = _squashfs(images / "mine.sqsh", store_user)
    fake = FakeService(site.socket)
    uri = uri_of(proxy)

    def answered(line):
        fake.line = line.encode()
        return site.run(ALICE, "import", "--cache-only", uri)

    accepted = answered(f"ok {good}\n")  # the control: all checks pass
    assert accepted.returncode == 0, accepted.stderr
    assert accepted.stdout == f"{good}\n"
    for path, why in ((outside, "not an image of BERTH_IMAGE_STORE"),
                      ("/etc/passwd", "not an image of BERTH_IMAGE_STORE"),
                      ("images/" + good.name, "not an image of BERTH_IMAGE_STORE"),
                      (link, "not an image of BERTH_IMAGE_STORE"),
                      (misnamed, "not an image of BERTH_IMAGE_STORE"),
                      (alices, f"owned by uid {alice.pw_uid}, not by BERTH_IMAGE_STORE_OWNER"),
                      (writable, "writable by others (mode 0666)"),
                      (cut, "not a whole squashfs"),
                      (images / f"{'45' * 32}.sqsh", "no such file")):
        result = answered(f"ok {path}\n")
        assert result.returncode == 1, (path, result.stdout)
        assert result.stdout == ""
        assert result.stderr.startswith(f"berth: error: the image store's answer {path}: {why}")
        assert result.stderr.endswith("; refusing it\n") and result.stderr.count("\n") == 1
    images.chmod(0o777)  # a store others may write: nothing in it is taken
    result = answered(f"ok {good}\n")
    assert result.returncode == 1 and "is not the store account's alone" in result.stderr
    images.chmod(0o755)
    site.store.chmod(0o1777)  # sticky is no excuse in the store itself
    result = answered(f"ok {good}\n")
    assert result.returncode == 1 and f"{site.store} is not the store account's alone (owner " \
        f"uid {store_user.pw_uid}, mode 1777)" in result.stderr
    site.store.chmod(0o755)
    # a directory above the store that others may write or own: they may
    # rename the store away and put their own in its place
    for owner, mode in ((alice.pw_uid, 0o755), (0, 0o777)):
        os.chown(site.top, owner, owner and alice.pw_gid)
        site.top.chmod(mode)
        result = answered(f"ok {good}\n")
        assert result.returncode == 1 and result.stderr == (
            f"berth: error: the image store's answer {good}: {site.top} lets others replace "
            f"what is in it (owner uid {owner}, mode {mode:04o}); refusing it\n")
    os.chown(site.top, 0, 0)
    site.top.chmod(0o1777)  # sticky, as /tmp: what is in it is the store account's
    assert answered(f"ok {good}\n").returncode == 0
    site.top.chmod(0o755)

    failed = answered("error the registry is on fire\n")
    assert failed.returncode == 1 and failed.stdout == ""
    assert failed.stderr == "berth: error: the image store: the registry is on fire\n"
    for garbage, why in (("hello\n", "not ok, private, busy or error"),
                         ("ok /a\nok /b\n", "not one line"),
                         ("ok " + "x" * 9000 + "\n", "more than 8192 bytes")):
        result = answered(garbage)
        assert result.returncode == 1 and result.stdout == ""
        assert why in result.stderr and result.stderr.endswith("; refusing it\n"), result.stderr
    assert proxy.requests == [] and site.own_images(ALICE) == []


# -- no store service on this node -----------------------------------------------------

def test_without_the_socket_the_user_imports_alone(site, proxy):
    uri = uri_of(proxy)
    result = site.run(ALICE, "import", "--cache-only", uri)
    assert result.returncode == 0, result.stderr
    assert result.stderr == (f"berth: no image store answers at {site.socket} (No such file "
                             "or directory); importing into your own cache\n")
    [own] = site.own_images(ALICE)
    assert result.stdout == f"{own}\n"

    # a socket nobody listens on any more
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as dead:
        dead.bind(str(site.socket))
        os.chmod(site.socket, 0o666)
    result = site.run(ALICE, "import", "--cache-only", uri)
    assert result.returncode == 0
    assert result.stderr.splitlines()[0] == (f"berth: no image store answers at {site.socket} "
                                             "(Connection refused); importing into your own "
                                             "cache")
    assert result.stdout == f"{own}\n"
    quiet = site.run(ALICE, "--quiet", "import", "--cache-only", uri)
    assert quiet.returncode == 0 and quiet.stderr == ""
    assert not (site.store / "images").exists()


class SilentStore(UnixServer):
    """A store's socket whose service takes each request and never answers."""

    def __init__(self, path):
        self.released = threading.Event()
        super().__init__(path)

    def _serve(self, conn):
        with conn:
            self.released.wait(120)

    def stop(self):
        self.released.set()
        super().stop()


def test_a_client_waits_for_a_silent_store_no_longer_than_its_bound(site, proxy):
    """A hung store (or an import of hours) holds no step beyond
    BERTH_IMAGE_STORE_TIMEOUT: the client says so, --quiet or not, and imports
    into the user's own cache."""
    uri = uri_of(proxy)
    silent = SilentStore(site.socket)
    try:
        huge = "99999999999999999999"
        for bad, why in (("0", "expected 1 or more, got '0'"),
                         (huge, f"expected at most 86400, got '{huge}'")):
            refused = site.run(ALICE, "import", "--cache-only", uri,
                               env={**site.env(ALICE), "BERTH_IMAGE_STORE_TIMEOUT": bad})
            assert refused.returncode == 1 and refused.stdout == ""
            assert refused.stderr == f"berth: error: BERTH_IMAGE_STORE_TIMEOUT: {why}\n"
            assert site.own_images(ALICE) == []
        result = site.run(ALICE, "--quiet", "import", "--cache-only", uri,
                          env={**site.env(ALICE), "BERTH_IMAGE_STORE_TIMEOUT": "2"})
    finally:
        silent.stop()
    assert result.returncode == 0, result.stderr
    assert result.stderr == (f"berth: the image store at {site.socket} has not answered within "
                             "2 s (BERTH_IMAGE_STORE_TIMEOUT); importing into your own cache\n")
    [own] = site.own_images(ALICE)
    assert result.stdout == f"{own}\n"
    assert not (site.store / "images").exists()


def test_without_a_store_nothing_changes(site, proxy):
    (site.sysconf / "enroot.conf").write_text("")
    result = site.run(ALICE, "import", "--cache-only", uri_of(proxy))
    assert result.returncode == 0 and result.stderr == ""
    assert result.stdout == f"{site.own_images(ALICE)[0]}\n"
