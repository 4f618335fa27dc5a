"""`berth store prune` (storeprune.py) on a store of real files: squashfs
images recording their URI, layers, partial files, uris/ links and lock
files, all the throw-away store account's; prune runs as that account, and
the test holds real flocks where an import would."""

import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from registry_fixture import berth, berth_env, throwaway_users

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="plays the store's account")

STORE_USER, OTHER = "bdep-pstore", "bdep-pother"
HOUR, DAY = 3600, 86400
SIZE = 4096  # of every image (mksquashfs pads to 4 KiB) and every layer here


@pytest.fixture(scope="module")
def users():
    with throwaway_users(STORE_USER, OTHER) as made:
        yield made


class Store:
    """A store as `berth store serve` lays it out (0755 directories of the
    store's account), the admin's enroot.conf naming it, and a directory
    outside it that the store's account may write too."""

    def __init__(self, top, users):
        self.top, self.users, self.account = top, users, users[STORE_USER]
        self.path = top / "store"
        for parts in ("", "images", "blobs", "blobs/sha256", "locks", "uris"):
            self.own(self.path / parts, directory=True)
        self.outside = self.own(top / "outside", directory=True)
        self.sysconf = top / "sysconf"
        self.sysconf.mkdir(mode=0o755)
        (self.sysconf / "enroot.conf").write_text(
            f"BERTH_IMAGE_STORE {self.path}\nBERTH_IMAGE_STORE_OWNER {STORE_USER}\n")
        self.home = self.own(top / "home", directory=True)
        self.number = 0

    def own(self, path, directory=False, mode=0o755):
        if directory:
            path.mkdir(mode=mode, exist_ok=True)
            path.chmod(mode)
        os.lchown(path, self.account.pw_uid, self.account.pw_gid)
        return path

    def key(self):
        self.number += 1
        return f"{self.number:064x}"

    def image(self, age, uri=None):
        """A real squashfs entry whose image.json records `uri`, unused for `age` s."""
        key = self.key()
        source = Path(tempfile.mkdtemp(prefix="bdep-pimage-"))
        try:
            (source / "etc/berth").mkdir(parents=True)
            (source / "etc/berth/image.json").write_text(json.dumps(
                {"source": uri or f"docker://registry.example#test/image{self.number}:v1"}))
            path = self.path / "images" / f"{key}.sqsh"
            subprocess.run(["mksquashfs", str(source), str(path), "-noappend", "-no-progress"],
                           check=True, capture_output=True)
        finally:
            shutil.rmtree(source)
        assert path.stat().st_size == SIZE
        return self.aged(path, age, 0o644)

    def layer(self, age):
        return self.file(self.path / "blobs/sha256" / self.key(), age, 0o600)

    def file(self, path, age, mode=0o644, size=SIZE):
        path.write_bytes(b"x" * size)
        return self.aged(path, age, mode)

    def aged(self, path, age, mode=None):
        if mode is not None:
            path.chmod(mode)
        self.own(path)
        os.utime(path, (time.time() - age,) * 2, follow_symlinks=False)
        return path

    def link(self, target, age=DAY, name=None):
        """uris/NAME -> target, as ImageCache.remember makes them."""
        path = self.path / "uris" / (name or self.key())
        path.symlink_to(target)
        return self.aged(path, age)

    def lock(self, path):
        """The lock file an import of `path` (an image or a layer) takes."""
        name = f"image-{path.name[:-5]}" if path.suffix == ".sqsh" else f"sha256-{path.name}"
        lock = self.path / "locks" / name
        lock.touch()
        return self.own(lock)

    def env(self):
        return berth_env(self.home, ENROOT_SYSCONF_PATH=str(self.sysconf))

    def run(self, *args, user=STORE_USER):
        return berth(list(args), self.env(), self.top, user=user)

    def prune(self, *args):
        return self.run("store", "prune", *args)


@pytest.fixture
def store(users):
    top = Path(tempfile.mkdtemp(prefix="bdep-pstore-", dir="/tmp"))
    top.chmod(0o755)
    yield Store(top, users)
    shutil.rmtree(top)


def tree(root):
    return {str(p.relative_to(root)): (p.lstat().st_mtime_ns, p.lstat().st_size,
                                       p.lstat().st_mode, p.lstat().st_uid)
            for p in [root, *root.rglob("*")]}


def left(*paths):
    return [os.path.lexists(path) for path in paths]


def removed_paths(result):
    """The path of each per-entry line, in order (the last line is the total)."""
    return [line.split()[-1] for line in result.stdout.splitlines()[:-1]]


@pytest.fixture
def held():
    """flock(LOCK_EX) on lock files, as an import holds them, until the test ends."""
    files = []

    def hold(path):
        handle = open(path)  # (held until the test ends)
        fcntl.flock(handle, fcntl.LOCK_EX)
        files.append(handle)

    yield hold
    for handle in files:
        handle.close()


# -- what goes, and in which order ---------------------------------------------------

def test_max_size_removes_the_least_recently_used_first(store):
    oldest = store.image(9 * DAY, "docker://registry.example#test/oldest:v1")
    layer1 = store.layer(8 * DAY)
    older = store.image(7 * DAY, "docker://registry.example#test/older@sha256:" + "a" * 64)
    layer2 = store.layer(6 * DAY)
    newest = store.image(5 * DAY)
    to_oldest = store.link(f"../images/{oldest.name}")
    to_newest = store.link(f"../images/{newest.name}")
    for path in (oldest, layer1, older, layer2, newest):
        store.lock(path)
    locks = sorted(os.listdir(store.path / "locks"))

    # `store list` shows the order prune takes (as root or the store's
    # account: another user's reading counts as a use, see below)
    listed = store.run("store", "list", user="root")
    assert listed.returncode == 0, listed.stderr
    assert [line.split()[-1] for line in listed.stdout.splitlines()] == \
        [str(oldest), str(older), str(newest)]
    # the same for programs: the newest entry of its URI or not, no "(older)" to parse
    listed = store.run("store", "list", "--json", user="root")
    assert listed.returncode == 0, listed.stderr
    assert [(entry["path"], entry["size"], entry["latest"])
            for entry in json.loads(listed.stdout)] \
        == [(str(oldest), SIZE, True), (str(older), SIZE, False), (str(newest), SIZE, True)]
    first = json.loads(listed.stdout)[0]
    assert first["source"] == "docker://registry.example#test/oldest:v1"
    assert abs(first["used"] - (time.time() - 9 * DAY)) < 600

    result = store.prune("--max-size", "10K")  # 20 KiB: three go
    assert result.returncode == 0, result.stderr
    assert left(oldest, layer1, older, layer2, newest) == [False, False, False, True, True]
    assert removed_paths(result) == [str(oldest), str(layer1), str(older), str(to_oldest)]
    lines = result.stdout.splitlines()
    assert lines[0].split()[0] == "4.0K" and lines[0].split()[3] == \
        "docker://registry.example#test/oldest:v1"
    assert lines[1].split()[3] == "(layer)"
    assert lines[2].split()[3] == "docker://registry.example#test/older@sha256:" + "a" * 64
    day = time.strftime("%Y-%m-%d", time.localtime(time.time() - 9 * DAY))
    assert lines[0].split()[1] == day
    assert lines[3].split()[3:6] == ["(link", "to", f"../images/{oldest.name})"]
    assert lines[4] == "freed 12.0K (12288 bytes: images 2, layers 1, partial files 0, uris/ " \
                       "links 1); 0 in use kept; 8.0K (8192 bytes) of images and layers left"
    assert left(to_oldest, to_newest) == [False, True]
    # the lock files of what went go with it; those of what stays stay
    gone = {f"image-{oldest.name[:-5]}", f"sha256-{layer1.name}", f"image-{older.name[:-5]}"}
    assert gone <= set(locks)
    assert sorted(os.listdir(store.path / "locks")) == sorted(set(locks) - gone)


@pytest.mark.parametrize("size, kept", [("0", 0), ("4096", 1), ("8K", 2), ("1.5T", 3),
                                        ("8191", 1), ("2G", 3), ("0.01M", 2)])
def test_max_size_units(store, size, kept):
    paths = [store.layer(3 * DAY), store.layer(2 * DAY), store.image(DAY)]
    result = store.prune("--max-size", size)
    assert result.returncode == 0, result.stderr
    assert left(*paths) == [False] * (3 - kept) + [True] * kept


@pytest.mark.parametrize("duration", ["30d", "720h", "30", "43200m", "2592000s", "30D"])
def test_older_than_removes_what_was_unused_that_long(store, duration):
    stale = [store.image(40 * DAY), store.layer(31 * DAY)]
    fresh = [store.layer(29 * DAY), store.image(2 * HOUR)]
    result = store.prune("--older-than", duration)
    assert result.returncode == 0, result.stderr
    assert left(*stale, *fresh) == [False, False, True, True]
    assert removed_paths(result) == [str(path) for path in stale]


def test_a_step_reading_an_entry_is_a_use_and_a_listing_is_not(store):
    """A job's step takes a store's entry by `import --reuse`, which cannot
    mark it: reading it moves its atime, which prune counts. `store list`
    and prune read image.json too, and put the atime back."""
    read, listed = store.image(40 * DAY), store.image(40 * DAY)
    probe = store.image(40 * DAY)
    probe.read_bytes()
    assert probe.stat().st_atime > time.time() - HOUR, "this filesystem records no atime"
    os.utime(read, (time.time() - DAY, time.time() - 40 * DAY))  # a step read it yesterday
    before = listed.stat().st_atime_ns
    result = store.run("store", "list")
    assert result.returncode == 0 and str(listed) in result.stdout, result.stderr
    assert listed.stat().st_atime_ns == before
    result = store.prune("--older-than", "30d")
    assert result.returncode == 0, result.stderr
    assert left(read, listed) == [True, False]
    # any user may list; the kernel marks what another user reads (at most daily)
    other = store.image(40 * DAY)
    result = store.run("store", "list", user=OTHER)
    assert result.returncode == 0 and str(other) in result.stdout, result.stderr


def test_nothing_used_in_the_last_hour_goes(store):
    """A client may be about to mount what a serve just handed out."""
    gone = [store.image(2 * HOUR), store.layer(61 * 60)]
    just_used = [store.layer(59 * 60), store.image(10 * 60)]
    for args in (["--older-than", "10m"], ["--max-size", "0"]):
        result = store.prune(*args)
        assert result.returncode == 0, result.stderr
        assert left(*gone, *just_used) == [False, False, True, True]
    assert result.stdout.endswith("; 0 in use kept; 8.0K (8192 bytes) of images and layers "
                                  "left (over --max-size: the rest is in use or was used in "
                                  "the last hour)\n")


def test_quiet_prints_the_total_only(store):
    paths = [store.image(3 * DAY), store.layer(2 * DAY)]
    for args in (["store", "prune", "--quiet"], ["--quiet", "store", "prune"]):
        result = store.run(*args, "--max-size", "0")
        assert result.returncode == 0, result.stderr
        [line] = result.stdout.splitlines()
        assert line.startswith("freed ")
    assert left(*paths) == [False, False]


def test_dry_run_changes_nothing_and_says_what_would_go(store):
    paths = [store.image(40 * DAY), store.layer(35 * DAY), store.image(DAY)]
    store.link(f"../images/{paths[0].name}")
    store.file(store.path / "images" / f"{paths[2].name}.tmp-77", 2 * HOUR)
    store.lock(paths[0])
    before = tree(store.path)
    dry = store.prune("--older-than", "30d", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert tree(store.path) == before  # not even a lock file made
    assert dry.stdout.splitlines()[-1].startswith("would free 12.0K (12288 bytes: images 1, "
                                                  "layers 1, partial files 1, uris/ links 1);")
    assert dry.stdout.splitlines()[-1].endswith("of images and layers would be left")

    real = store.prune("--older-than", "30d")
    assert real.returncode == 0, real.stderr
    assert real.stdout.splitlines()[:-1] == dry.stdout.splitlines()[:-1]
    assert left(*paths) == [False, False, True]


# -- who may prune, and with what ---------------------------------------------------------

def test_only_the_stores_account_prunes(store, users):
    paths = [store.image(40 * DAY), store.layer(40 * DAY)]
    before = tree(store.path)
    as_root = berth(["store", "prune", "--max-size", "0"], store.env(), store.top)
    assert as_root.returncode == 1 and as_root.stdout == ""
    assert as_root.stderr == "berth: error: berth store prune refuses to run as root; run it " \
                             f"as the store's account ({STORE_USER})\n"
    other = store.run("store", "prune", "--max-size", "0", user=OTHER)
    assert other.returncode == 1 and other.stdout == ""
    assert other.stderr == f"berth: error: berth store prune runs as uid " \
                           f"{users[OTHER].pw_uid}, not as BERTH_IMAGE_STORE_OWNER " \
                           f"{STORE_USER} (uid {users[STORE_USER].pw_uid})\n"
    assert tree(store.path) == before
    assert left(*paths) == [True, True]


@pytest.mark.parametrize("args, message", [
    (["--max-size", "abc"], "--max-size: expected bytes or a size such as 500M or 20G, got 'abc'"),
    (["--older-than", "1d", "--max-size=-5G"],
     "--max-size: expected bytes or a size such as 500M or 20G, got '-5G'"),
    (["--older-than", "3x"], "--older-than: expected a duration such as 30d or 12h (s, m, h, d, "
                             "w; a number alone is days), got '3x'"),
    (["--older-than=-1d", "--max-size", "0"], "--older-than: expected a duration such as 30d "
                                              "or 12h (s, m, h, d, w; a number alone is days), "
                                              "got '-1d'"),
    (["--older-than", "nan", "--max-size", "0"], "--older-than: expected a duration such as "
                                                 "30d or 12h (s, m, h, d, w; a number alone is "
                                                 "days), got 'nan'"),
    ([], "store prune: give --older-than DURATION, --max-size SIZE or both"),
    (["--dry-run"], "store prune: give --older-than DURATION, --max-size SIZE or both"),
])
def test_bad_values_change_nothing(store, args, message):
    store.image(40 * DAY)
    store.layer(40 * DAY)
    before = tree(store.path)
    result = store.prune(*args)
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr == f"berth: error: {message}\n"
    assert tree(store.path) == before


# Group write by the account's own private group (its name and number, no
# other member) is the account's alone; by any other group it is not.
@pytest.mark.parametrize("mode, group", [(0o777, None), (0o775, 65534)])
def test_a_store_others_may_write_is_refused(store, mode, group):
    paths = [store.image(40 * DAY), store.layer(40 * DAY)]
    if group is not None:
        os.chown(store.path, -1, group)
    store.path.chmod(mode)
    result = store.prune("--max-size", "0")
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr == f"berth: error: BERTH_IMAGE_STORE {store.path}: is writable by " \
                            f"others (mode {mode:04o}); refusing to use it (it must be owned " \
                            "by you and writable by nobody else)\n"
    assert left(*paths) == [True, True]


def test_a_missing_store_is_an_empty_one(store):
    shutil.rmtree(store.path)
    result = store.prune("--max-size", "0")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "freed 0B (0 bytes: images 0, layers 0, partial files 0, uris/ " \
                            "links 0); 0 in use kept; 0B (0 bytes) of images and layers left\n"


# -- beside imports ---------------------------------------------------------------------

def test_what_an_import_holds_stays(store, held):
    building = store.image(40 * DAY)  # an import looks it up, or builds it again
    fetching = store.layer(40 * DAY)  # an import downloads it
    free = [store.image(40 * DAY), store.layer(40 * DAY)]
    held(store.lock(building))
    held(store.lock(fetching))
    result = store.prune("--max-size", "0")
    assert result.returncode == 0, result.stderr
    assert left(building, fetching, *free) == [True, True, False, False]
    assert removed_paths(result) == [str(path) for path in free]
    assert "; 2 in use kept; 8.0K (8192 bytes) of images and layers left (over --max-size" \
        in result.stdout


def test_layers_are_an_import_cache_that_goes_by_last_use(store, held):
    """No image records its layers (image.json: source and digest only), so
    none needs one once built: a layer goes when unused for --older-than,
    stays while an import marked it lately or holds its lock."""
    image = store.image(DAY)
    unused = store.layer(40 * DAY)
    used_lately = store.layer(2 * DAY)  # an import of another image took it
    downloading = store.layer(40 * DAY)
    held(store.lock(downloading))
    result = store.prune("--older-than", "30d")
    assert result.returncode == 0, result.stderr
    assert left(image, unused, used_lately, downloading) == [True, False, True, True]
    assert removed_paths(result) == [str(unused)]


def test_partial_files_of_killed_imports_go_after_an_hour(store, held):
    images, blobs, uris = (store.path / name for name in ("images", "blobs/sha256", "uris"))
    killed = [store.file(images / f"{'1' * 64}.sqsh.tmp-123", 2 * HOUR),
              # the same image's: with its lock held, no build of it is at work
              store.file(images / f"{'1' * 64}.sqsh.tmp-456", 10 * 60),
              store.file(blobs / ".partial-k1ll3d", 2 * HOUR),
              store.link(f"../images/{'1' * 64}.sqsh", 2 * HOUR, name=f"{'2' * 64}.999")]
    building = store.file(images / f"{'3' * 64}.sqsh.tmp-7", 2 * HOUR)
    held(store.lock(images / f"{'3' * 64}.sqsh"))
    writing = [store.file(images / f"{'4' * 64}.sqsh.tmp-8", 10 * 60),
               store.file(blobs / ".partial-l1v3", 10 * 60),
               store.link(f"../images/{'1' * 64}.sqsh", 60, name=f"{'5' * 64}.1000")]
    not_ours = [store.file(images / "notes.txt", 40 * DAY), store.file(blobs / "x", 40 * DAY)]
    result = store.prune("--older-than", "30d")
    assert result.returncode == 0, result.stderr
    assert left(*killed) == [False] * 4
    assert left(building, *writing, *not_ours) == [True] * 6
    assert "partial files 3, uris/ links 1); 1 in use kept;" in result.stdout


# -- links, in the store and out of it ---------------------------------------------------

def test_uris_links_that_name_no_image_go_as_links(store):
    kept = store.image(DAY)
    outside = store.outside / f"{'9' * 64}.sqsh"
    store.file(outside, 40 * DAY)
    victim = store.file(store.outside / "victim", 40 * DAY)
    before = tree(store.outside)
    links = [store.link(victim),  # out of the store, absolute
             store.link(f"../../outside/{outside.name}"),  # out, relative, an image's name
             store.link(f"../images/{'8' * 64}.sqsh"),  # a missing entry
             store.link(f"../images/../images/{kept.name}")]  # not as remember writes it
    good = store.link(f"../images/{kept.name}")
    result = store.prune("--older-than", "30d")
    assert result.returncode == 0, result.stderr
    assert left(*links, good) == [False] * 4 + [True]
    assert tree(store.outside) == before  # the targets untouched
    assert sorted(removed_paths(result)) == sorted(map(str, links))


@pytest.mark.parametrize("place", ["images", "blobs", "blobs/sha256", "locks", "uris"])
def test_a_directory_of_the_store_that_is_a_link_is_refused(store, place):
    kept = store.image(40 * DAY)
    target = store.outside / "elsewhere"
    store.own(target, directory=True)
    for name in (f"{'9' * 64}.sqsh", f"{'9' * 64}", "sha256", f"{'7' * 64}.sqsh.tmp-1"):
        store.file(target / name, 40 * DAY)
    before = tree(store.outside)
    link = store.path / place
    shutil.rmtree(link)
    link.symlink_to(target)
    store.own(link)
    result = store.prune("--max-size", "0")
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr == f"berth: error: {link}: a symbolic link; berth store prune " \
                            "follows none in the store\n"
    assert tree(store.outside) == before
    if place != "images":  # (the link hides it)
        assert left(kept) == [True]
