"""The busybox images, the test user and the `berth` runner that the
container tests share; conftest.py offers the fixtures to every module."""

import contextlib
import json
import os
import pwd
import shutil
import signal
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest

USER = "berthtest"
AS_ROOT = os.geteuid() == 0
PACKAGE = Path(__file__).resolve().parents[1] / "berth"
RC = """#!/bin/sh
cd /work 2>/dev/null || cd /
[ $# -gt 0 ] && exec "$@"
exec /bin/sh
"""


def world_readable_dir(prefix):
    path = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    path.chmod(0o755)
    return path


def make_readable(tree):
    subprocess.run(["chmod", "-R", "a+rX", str(tree)], check=True)


def make_user():
    """The test user, made where it is missing. conftest.py calls it once
    before any xdist worker starts: Debian 13's useradd, run twice at once
    for one name, makes it twice, the second with a new uid, so that a
    worker that looked first would chown to a uid no user has."""
    try:
        return pwd.getpwnam(USER)
    except KeyError:
        subprocess.run(["useradd", "--create-home", "--shell", "/bin/sh", USER],
                       capture_output=True, text=True, check=True)
        return pwd.getpwnam(USER)


@pytest.fixture(scope="session")
def user():
    return make_user() if AS_ROOT else pwd.getpwuid(os.getuid())


@pytest.fixture(scope="session")
def library():
    top = world_readable_dir("bctr-lib-")
    shutil.copytree(PACKAGE, top / "berth", ignore=shutil.ignore_patterns("__pycache__"))
    make_readable(top)
    yield top
    shutil.rmtree(top)


def build_root(root, image_config=None, rc=True):
    """A busybox root: every applet, /etc/passwd, optional config and /etc/rc."""
    busybox = shutil.which("busybox") or "/bin/busybox"
    assert os.path.exists(busybox), "tests need Debian's busybox-static"
    for d in ("bin", "etc", "proc", "dev", "sys", "tmp", "work", "usr/local/bin"):
        (root / d).mkdir(parents=True, exist_ok=True)
    shutil.copy(busybox, root / "bin/busybox")
    applets = subprocess.run([busybox, "--list"], capture_output=True, text=True,
                             check=True).stdout.split()
    for applet in applets:
        if not (root / "bin" / applet).exists():
            (root / "bin" / applet).symlink_to("busybox")
    (root / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
    (root / "usr/local/bin/only-in-image").write_text("#!/bin/sh\necho inside \"$@\"\n")
    (root / "usr/local/bin/only-in-image").chmod(0o755)
    if image_config is not None:
        (root / "etc/berth").mkdir()
        (root / "etc/berth/image.json").write_text(json.dumps(image_config))
    if rc:
        (root / "etc/rc").write_text(RC)


def squash(root, image):
    subprocess.run(["mksquashfs", str(root), str(image), "-noappend", "-all-root",
                    "-no-progress", "-quiet", "-comp", "gzip"], check=True,
                   stdout=subprocess.DEVNULL)
    image.chmod(0o644)


def create_with_env(berth, name, env):
    """Container `name` from an image whose config sets `env` (KEY=VALUE
    strings) and nothing else of note."""
    top = world_readable_dir("bctr-env-")
    try:
        build_root(top / "root", {"env": env, "entrypoint": None, "cmd": ["/bin/sh"],
                                  "workdir": "", "user": "", "source": "test", "digest": ""})
        squash(top / "root", top / "image.sqsh")
        make_readable(top)
        berth.ok("create", "-n", name, top / "image.sqsh")
    finally:
        shutil.rmtree(top)


@pytest.fixture(scope="session")
def images():
    top = world_readable_dir("bctr-img-")
    build_root(top / "rc-root", {
        "env": ["FOO=image", "BAR=image", "PATH=/usr/local/bin:/bin"], "entrypoint": None,
        "cmd": ["/bin/sh"], "workdir": "/work", "user": "", "source": "test", "digest": ""})
    squash(top / "rc-root", top / "app.sqsh")
    build_root(top / "plain-root", rc=False)
    squash(top / "plain-root", top / "plain.sqsh")
    (top / "not-an-image.sqsh").write_text("hello\n")
    make_readable(top)
    yield top
    shutil.rmtree(top)


@pytest.fixture(scope="session")
def usable_fuse():
    """/dev/fuse at 0666 for image starts (users mount with FUSE). conftest.py
    sets it once for the whole run, before any worker starts, and restores it
    after the last one ends: a worker's own restore would take it away from
    tests still running on the other."""
    if AS_ROOT:
        mode = stat.S_IMODE(os.stat("/dev/fuse").st_mode)
        assert mode & 0o006 == 0o006, \
            f"/dev/fuse is {mode:o}: conftest.py's session start did not run"


class Berth:
    """`berth` run as the test user with its own enroot directories."""

    def __init__(self, base, library, user):
        self.base = base
        self.user = user
        self.env = {
            "PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "PYTHONPATH": str(library),
            "HOME": user.pw_dir, "LANG": "C.UTF-8",
            "ENROOT_SYSCONF_PATH": str(base / "sys"), "ENROOT_CONFIG_PATH": str(base / "cfg"),
            "ENROOT_DATA_PATH": str(base / "data"), "ENROOT_RUNTIME_PATH": str(base / "run"),
        }
        for d in ("sys", "cfg", "data", "run", "host"):
            (base / d).mkdir()
        self.chown(base)

    def chown(self, *paths):
        """lchown each path and, for a real directory, what is below it; a
        symlink (one a test put in a container root may lead to /) is never followed."""
        for path in paths:
            os.lchown(path, self.user.pw_uid, self.user.pw_gid)
            if os.path.islink(path) or not os.path.isdir(path):
                continue
            for top, dirs, files in os.walk(path):  # followlinks=False
                for name in dirs + files:
                    os.lchown(os.path.join(top, name), self.user.pw_uid, self.user.pw_gid)

    def command(self, *args):
        prefix = ["runuser", "-u", self.user.pw_name, "--"] if AS_ROOT else []
        return [*prefix, "/usr/bin/python3", "-m", "berth.cli", *map(str, args)]

    def interruptible(self, *args):
        """`berth ARGS` started as a terminal's foreground job starts it, in a
        session of its own (os.killpg(pid, SIGINT) is its ^C), with SIGINT's
        default action whatever this suite inherited: a shell's background job
        (`.ci/run &`) ignores SIGINT, and so would every berth it starts."""
        def sigint_as_at_a_terminal():
            signal.signal(signal.SIGINT, signal.SIG_DFL)
        return subprocess.Popen(self.command(*args), env=self.env, cwd=self.base,
                                stderr=subprocess.PIPE, text=True, start_new_session=True,
                                preexec_fn=sigint_as_at_a_terminal)

    def __call__(self, *args, env=None, **kwargs):
        kwargs.setdefault("timeout", 60)
        return subprocess.run(self.command(*args), env={**self.env, **(env or {})},
                              cwd=self.base, capture_output=True, text=True, check=False,
                              **kwargs)

    def ok(self, *args, **kwargs):
        result = self(*args, **kwargs)
        assert result.returncode == 0, result.stderr
        return result.stdout

    def fails(self, *args, needle, **kwargs):
        """Exit 1 with one `berth: error:` line naming `needle`; nothing left behind."""
        result = self(*args, **kwargs)
        assert result.returncode == 1, (result.stdout, result.stderr)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("berth: error:"), result.stderr
        assert needle in lines[0], lines[0]
        assert self.leftovers() == []
        return lines[0]

    def leftovers(self):
        """Hidden staging entries in the data path and per-start runtime dirs."""
        data = [p.name for p in (self.base / "data").iterdir() if p.name.startswith(".")]
        return data + [p.name for p in (self.base / "run").iterdir()]

    def write(self, relative, text, mode=0o644):
        path = self.base / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        path.chmod(mode)
        self.chown(self.base)
        return path


@pytest.fixture
def berth(library, user, images, usable_fuse):
    base = world_readable_dir("bctr-home-")
    yield Berth(base, library, user)
    shutil.rmtree(base)


@pytest.fixture
def app(berth, images):
    """A created container named `app`."""
    berth.ok("create", images / "app.sqsh")
    return berth.base / "data/app"


def pids_of(uid, needle):
    """Pids of `uid` whose command line holds `needle`."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            line = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
            if os.stat(f"/proc/{pid}").st_uid == uid and needle.encode() in line:
                found.append(pid)
    return found


def start_detached(berth, *args, env=None):
    process = subprocess.Popen(berth.command("start", "--detach", *args),
                               env={**berth.env, **(env or {})},
                               cwd=berth.base, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    line = process.stdout.readline()
    assert line.strip().isdigit(), process.stderr.read()
    return process, int(line)


def berth_pid(process):
    """The berth process itself, below runuser when the tests run as root."""
    if not AS_ROOT:
        return process.pid
    children = Path(f"/proc/{process.pid}/task/{process.pid}/children").read_text().split()
    return int(children[0])
