"""hooks/87-ssh.sh and the runtime's services (berth/container/services.py)
in real starts, as an ordinary user: this machine's dropbear (Debian's
dropbear-bin) inside a busybox container, reached with this machine's ssh
client on 127.0.0.1. The multinode scenario logs in from the login node
(molecule/multinode/tests/test_edf.py)."""

import os
import pwd
import re
import shutil
import socket
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
HOOKS = REPO / "hooks"
USER = "berthssh"


@pytest.fixture(scope="module")
def user():
    made = subprocess.run(["useradd", "--create-home", "--shell", "/bin/sh", USER],
                          capture_output=True, text=True, check=False)
    assert made.returncode in (0, 9), made.stderr  # 9: there already
    return pwd.getpwnam(USER)


@pytest.fixture(scope="module")
def keys(user, tmp_path_factory):
    """The user's key (in her ~/.ssh/authorized_keys) and a stranger's."""
    top = tmp_path_factory.mktemp("keys")
    for name in ("mine", "stranger"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name,
                        "-f", str(top / name)], check=True)
    ssh = Path(user.pw_dir) / ".ssh"
    ssh.mkdir(mode=0o700, exist_ok=True)
    (ssh / "authorized_keys").write_text((top / "mine.pub").read_text())
    for path in (ssh, ssh / "authorized_keys"):
        os.chown(path, user.pw_uid, user.pw_gid)
    return top


@pytest.fixture
def node(user, tmp_path_factory):
    """World-readable: the runtime package, the hooks, a busybox container
    `app` of the user's, and her enroot directories."""
    top = Path(tempfile.mkdtemp(prefix="bssh-", dir="/tmp"))
    shutil.copytree(REPO / "runtime/berth", top / "lib/berth",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (top / "sys/hooks.d").mkdir(parents=True)
    for name in ("10-shadow.sh", "87-ssh.sh", "common.bash"):
        shutil.copy(HOOKS / name, top / "sys/hooks.d" / name)
    root = top / "data/app"
    for directory in ("bin", "etc", "proc", "dev", "sys", "tmp", "usr/local/bin"):
        (root / directory).mkdir(parents=True)
    busybox = shutil.which("busybox") or "/bin/busybox"
    shutil.copy(busybox, root / "bin/busybox")
    for applet in subprocess.run([busybox, "--list"], capture_output=True, text=True,
                                 check=True).stdout.split():
        if applet != "busybox":
            (root / "bin" / applet).symlink_to("busybox")
    (root / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
    (root / "etc/marker").write_text("inside the container\n")
    for directory in ("cfg", "run"):
        (top / directory).mkdir()
    subprocess.run(["chmod", "-R", "a+rX", str(top)], check=True)
    subprocess.run(["chown", "-R", f"{USER}:", str(top / "data"), str(top / "cfg"),
                    str(top / "run")], check=True)
    yield top
    shutil.rmtree(top)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def environment(node, user, env):
    return {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": user.pw_dir, "LANG": "C.UTF-8",
            "PYTHONPATH": str(node / "lib"),
            "ENROOT_SYSCONF_PATH": str(node / "sys"), "ENROOT_DATA_PATH": str(node / "data"),
            "ENROOT_RUNTIME_PATH": str(node / "run"), "ENROOT_CONFIG_PATH": str(node / "cfg"),
            **env}


def berth(*args):
    return ["runuser", "-u", USER, "--", "/usr/bin/python3", "-m", "berth.cli", *args]


def start(node, user, *command, env=None, options=()):
    return subprocess.run(berth("start", *options, "app", *command), capture_output=True,
                          text=True, env=environment(node, user, env or {}), timeout=60,
                          check=False)


class Detached:
    """`berth start --detach app` with the hook on, each of `variables` given
    as -e (as an EDF's [env]); stops at the end of the with."""

    def __init__(self, node, user, env, options=(), container="app",
                 variables=("PATH=/opt/tools/bin:/bin", "FROM_THE_CONTAINER=yes")):
        self.process = subprocess.Popen(
            berth("start", "--detach", *(w for v in variables for w in ("-e", v)), *options,
                  container),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=environment(node, user, env))
        self.pid = self.process.stdout.readline().strip()

    def __enter__(self):
        assert self.pid.isdigit(), self.process.communicate(timeout=30)
        return self

    def __exit__(self, *_):
        self.process.stdin.close()  # berth stops at the end of its stdin
        self.process.wait(timeout=30)
        self.stderr = self.process.stderr.read()
        self.process.stdout.close()
        self.process.stderr.close()


def ssh(keys, port, command, key="mine", known_hosts=None, login=USER, typed=None):
    """`command` through ssh; with `typed` instead, an interactive session
    (`ssh -tt`, no command) that gets those lines on its terminal."""
    options = ["-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "-o", "LogLevel=ERROR",
               "-o", f"UserKnownHostsFile={known_hosts or '/dev/null'}",
               "-o", f"StrictHostKeyChecking={'yes' if known_hosts else 'no'}"]
    session = ["-tt"] if typed is not None else [command]
    return subprocess.run(["ssh", *options, "-i", str(keys / key), "-p", str(port),
                           f"{login}@127.0.0.1", *session], input=typed,
                          capture_output=True, text=True, timeout=60, check=False)


def servers(port):
    """Processes whose command line serves `port` (a dropbear left behind)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                words = f.read().split(b"\0")
        except OSError:
            continue
        if b"dropbear" in words and str(port).encode() in words:
            found.append(pid)
    return found


def test_the_users_key_logs_into_the_container_with_its_environment(node, user, keys):
    port = free_port()
    on = {"BERTH_HOOK_SSH_ENABLE": "yes", "BERTH_HOOK_SSH_PORT": str(port)}
    with Detached(node, user, on):
        result = ssh(keys, port, "cat /etc/marker; id -un; echo $PATH; echo $FROM_THE_CONTAINER")
        assert result.returncode == 0, result.stderr
        assert result.stdout.splitlines() == ["inside the container", USER,
                                              "/opt/tools/bin:/bin", "yes"]
        stranger = ssh(keys, port, "true", key="stranger")
        assert stranger.returncode == 255 and "Permission denied" in stranger.stderr
    # the server ends with the container
    assert servers(port) == []
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    # the host key is the user's, kept: the next container shows the same
    key = node / "cfg/ssh/dropbear_ed25519_host_key"
    assert stat.S_IMODE(os.stat(key.parent).st_mode) == 0o700
    assert os.stat(key).st_uid == user.pw_uid
    public = subprocess.run(["dropbearkey", "-y", "-f", str(key)], capture_output=True,
                            text=True, check=True).stdout
    line = next(line for line in public.splitlines() if line.startswith("ssh-ed25519 "))
    known_hosts = node / "known_hosts"
    known_hosts.write_text(f"[127.0.0.1]:{port} {line}\n")
    with Detached(node, user, on):
        result = ssh(keys, port, "cat /etc/marker", known_hosts=known_hosts)
        assert result.returncode == 0, result.stderr


def test_the_annotations_key_file_lets_its_key_in(node, user, keys):
    port = free_port()
    extra = node / "extra.pub"
    shutil.copy(keys / "stranger.pub", extra)
    with Detached(node, user, {"BERTH_HOOK_SSH_ENABLE": "true", "BERTH_HOOK_SSH_PORT": str(port),
                               "BERTH_HOOK_SSH_AUTHORIZE_SSH_KEY": str(extra)}):
        assert ssh(keys, port, "true", key="stranger").returncode == 0
        assert ssh(keys, port, "true").returncode == 0


def test_a_remapped_root_logs_in_as_root_with_the_users_key(node, user, keys):
    """Under --root (pyxis's --container-remap-root) the container's user is
    root, whose home is /root there: that is who logs in, by her key."""
    port = free_port()
    with Detached(node, user, {"BERTH_HOOK_SSH_ENABLE": "yes", "BERTH_HOOK_SSH_PORT": str(port)},
                  options=("--root",)):
        result = ssh(keys, port, "id -u; cat /etc/marker", login="root")
        assert result.returncode == 0, result.stderr
        assert result.stdout.splitlines() == ["0", "inside the container"]
        assert ssh(keys, port, "true").returncode == 255  # not as herself: no such user inside
    assert servers(port) == []


# A Debian-like login profile: PATH set anew, then /etc/profile.d
DEBIAN_PROFILE = """\
PATH=/usr/local/bin:/usr/bin:/bin:/usr/local/games:/usr/games
export PATH
for i in /etc/profile.d/*.sh; do if [ -r "$i" ]; then . "$i"; fi; done
"""


def debian_like(node, user):
    """`app` with that profile and a profile.d entry (the login shell runs it)."""
    root = node / "data/app"
    (root / "etc/profile.d").mkdir()
    (root / "etc/profile").write_text(DEBIAN_PROFILE)
    (root / "etc/profile.d/mpi-test.sh").write_text("PATH=/opt/mpi-test:$PATH\n")
    return "app", "/opt/mpi-test:"


def apptainer_sif(node, user):
    """`sif`, created from a SIF file (siftool's) of `app`'s root with an
    environment script in /.singularity.d/env (no login shell: as Apptainer)."""
    root = node / "data/app"
    (root / ".singularity.d/env").mkdir(parents=True)
    (root / ".singularity.d/env/90-environment.sh").write_text(
        'export PATH="/opt/sif/bin:$PATH"\n')
    squashfs, image = node / "sif.sqsh", node / "sif.sif"
    subprocess.run(["mksquashfs", str(root), str(squashfs), "-noappend", "-all-root",
                    "-no-progress", "-quiet"], check=True, stdout=subprocess.DEVNULL)
    arch = {"x86_64": 2, "aarch64": 4}[os.uname().machine]  # SIF's codes for amd64, arm64
    for args in (["new", image], ["add", image, squashfs, "--datatype", 4, "--parttype", 2,
                                  "--partfs", 1, "--partarch", arch]):
        subprocess.run(["siftool", *map(str, args)], check=True, capture_output=True)
    image.chmod(0o644)
    created = subprocess.run(berth("create", "-n", "sif", str(image)), capture_output=True,
                             text=True, env=environment(node, user, {}), check=False)
    assert created.returncode == 0, created.stderr
    return "sif", "/opt/sif/bin:"


def keeper_environ(pid):
    """What the SPANK plugin gives a task of the container: the keeper's environment."""
    with open(f"/proc/{pid}/environ", "rb") as f:
        return dict(e.decode().split("=", 1) for e in f.read().split(b"\0") if e)


@pytest.mark.parametrize("image", [debian_like, apptainer_sif])
def test_a_session_has_the_environment_of_the_containers_tasks(node, user, keys, image):
    """After the login shell's profile or the image's Apptainer scripts, with
    an EDF's [env] variable: a command and an interactive session alike."""
    container, first_on_path = image(node, user)
    port = free_port()
    on = {"BERTH_HOOK_SSH_ENABLE": "yes", "BERTH_HOOK_SSH_PORT": str(port)}
    value = """it's "quoted", $HOME"""  # as a shell would have to quote it
    with Detached(node, user, on, container=container,
                  variables=[f"FROM_THE_CONTAINER={value}"]) as started:
        task = keeper_environ(started.pid)
        assert task["PATH"].startswith(first_on_path) and task["FROM_THE_CONTAINER"] == value
        expected = f"{task['PATH']}|{value}"
        result = ssh(keys, port, r"""printf '%s\n' "$PATH|$FROM_THE_CONTAINER" """)
        assert (result.returncode, result.stdout) == (0, f"{expected}\n"), result.stderr
        # typed on a terminal, which echoes it: the markers appear whole only in the output
        result = ssh(keys, port, None,
                     typed=r"""printf '%s\n' "<""<$PATH|$FROM_THE_CONTAINER>"">" """ + "\nexit\n")
        assert result.returncode == 0, result.stderr
        assert re.findall(r"<<(.*?)>>", result.stdout) == [expected], result.stdout


def test_a_plain_starts_session_has_the_environment_its_command_started_with(
        node, user, keys):
    """Without --detach the command is the container's one task."""
    container, _ = apptainer_sif(node, user)
    port = free_port()
    process = subprocess.Popen(
        berth("start", "-e", "FROM_THE_CONTAINER=yes", container, "sh", "-c",
              'echo "$PATH|$FROM_THE_CONTAINER"; read _'),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=environment(node, user, {"BERTH_HOOK_SSH_ENABLE": "yes",
                                     "BERTH_HOOK_SSH_PORT": str(port)}))
    try:
        expected = process.stdout.readline().strip()
        assert expected.startswith("/opt/sif/bin:") and expected.endswith("|yes")
        result = ssh(keys, port, 'echo "$PATH|$FROM_THE_CONTAINER"')
        assert (result.returncode, result.stdout) == (0, f"{expected}\n"), result.stderr
    finally:
        process.communicate("\n", timeout=30)
    assert process.returncode == 0


def test_off_by_default(node, user):
    result = start(node, user, "cat", "/proc/net/tcp")
    assert result.returncode == 0, result.stderr
    assert f"{15263:04X}" not in result.stdout and servers(15263) == []


def refused(result, needle, by_hook=True):
    """The runtime's one line naming `needle`; the hook's refusal carries its
    reason there (`hook 87-ssh.sh: ssh hook: ...`), the line a Slurm step shows."""
    assert result.returncode == 1 and result.stdout == "", (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    prefix = "berth: error: hook 87-ssh.sh: ssh hook: " if by_hook else "berth: error: "
    assert lines[0].startswith(prefix), result.stderr
    assert needle in lines[0], result.stderr
    return lines[0]


def test_a_port_another_process_listens_on_fails_the_start(node, user):
    with socket.socket() as other:  # another user's server, there first
        other.bind(("0.0.0.0", 0))
        other.listen()
        port = other.getsockname()[1]
        result = start(node, user, "true", env={"BERTH_HOOK_SSH_ENABLE": "1",
                                                "BERTH_HOOK_SSH_PORT": str(port)})
        refused(result, f"TCP port {port} is taken on this node")
    assert list((node / "run").iterdir()) == []


@pytest.mark.parametrize("value", ["80", "65536", "99999999999999999999", "15263\n15264",
                                   "-1", "port", ""])
def test_a_bad_port_is_refused_naming_the_annotation(node, user, value):
    result = start(node, user, "true", env={"BERTH_HOOK_SSH_ENABLE": "yes",
                                            "BERTH_HOOK_SSH_PORT": value or " "})
    refused(result, "BERTH_HOOK_SSH_PORT (com.hooks.ssh.port)")


def test_bad_key_files_are_refused_in_one_line(node, user, keys):
    # refused before the server is used: any program stands in for dropbear
    base = {"BERTH_HOOK_SSH_ENABLE": "yes", "BERTH_HOOK_SSH_PORT": str(free_port()),
            "BERTH_SSH_SERVER": "/bin/true"}
    fifo = node / "keys.fifo"
    os.mkfifo(fifo)
    big = node / "big.pub"
    big.write_text("ssh-ed25519 AAAA x\n" * 5000)
    huge = node / "huge.pub"  # 200 MB, sparse
    with open(huge, "wb") as f:
        f.truncate(200 << 20)
    # another user's file, through a link of hers: the hook reads as she does
    theirs = node / "theirs.pub"
    theirs.write_text((keys / "stranger.pub").read_text())
    theirs.chmod(0o600)
    link = node / "cfg/link.pub"
    link.symlink_to(theirs)
    os.lchown(link, user.pw_uid, user.pw_gid)
    for path, needle in ((fifo, "is not a regular file"), (big, "larger than 65536 bytes"),
                         (huge, "larger than 65536 bytes"), (node, "is not a regular file"),
                         ("/dev/zero", "is not a regular file"),
                         (link, f"'{link}' cannot be read by this user"),
                         ("relative.pub", "is not an absolute path"),
                         (node / "missing.pub", "is not a regular file")):
        result = start(node, user, "true",
                       env={**base, "BERTH_HOOK_SSH_AUTHORIZE_SSH_KEY": str(path)})
        line = refused(result, needle)
        assert "com.hooks.ssh.authorize_ssh_key" in line
    # no key at all: nobody could log in
    home_keys = Path(user.pw_dir) / ".ssh/authorized_keys"
    saved = home_keys.read_bytes()
    home_keys.write_text("# nobody\n")
    try:
        refused(start(node, user, "true", env=base), "no key would let anyone in")
    finally:
        home_keys.write_bytes(saved)
    assert list((node / "run").iterdir()) == []


def test_a_node_without_dropbear_refuses_naming_it(node, user):
    result = start(node, user, "true", env={"BERTH_HOOK_SSH_ENABLE": "yes",
                                            "BERTH_SSH_SERVER": "/nonexistent/dropbear"})
    refused(result, "this node has no dropbear")


# The runtime's services, from a hook that asks for busybox's nc ----------

def services_hook(node, line):
    hook = node / "sys/hooks.d/50-service.sh"
    hook.write_text(f"#!/bin/sh\necho '{line}' >>\"$BERTH_SERVICES\"\n")
    hook.chmod(0o755)


def test_a_service_runs_beside_the_command_and_ends_with_it(node, user):
    port = free_port()
    services_hook(node, f"tcp {port} /bin/nc -l -p {port}")
    result = start(node, user, "sh", "-c", f"cat /proc/net/tcp* | grep -c ':{port:04X} .* 0A '")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "1\n"
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5).close()


@pytest.mark.parametrize("line, needle", [
    ("tcp 1 /bin/false", "service /bin/false exited (status 1) before listening on TCP port 1"),
    ("tcp 70000 /bin/nc", "BERTH_SERVICES line 1: port '70000' is not a number"),
    ("udp 5000 /bin/nc", "BERTH_SERVICES line 1: expected 'tcp PORT PROGRAM [ARG...]'"),
    ("tcp 5000 nc -l", "BERTH_SERVICES line 1: program 'nc' is not an absolute path"),
])
def test_a_service_that_cannot_start_fails_the_start_in_one_line(node, user, line, needle):
    services_hook(node, line)
    result = start(node, user, "true")
    refused(result, needle, by_hook=False)
    assert list((node / "run").iterdir()) == []


def test_a_service_port_another_process_holds_is_refused(node, user):
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        services_hook(node, f"tcp {port} /bin/nc -l -p {port}")
        refused(start(node, user, "true"), f"TCP port {port} is taken by another process",
                by_hook=False)
