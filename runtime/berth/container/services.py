"""Services a hook asks for: node programs started inside the container
beside its command (the SSH hook's server).

A hook appends one line per service to $BERTH_SERVICES:
    tcp PORT PROGRAM [ARG...]
words separated by blanks, without quoting. Once the root, the namespaces
and the seccomp filter are in place, PROGRAM (a path inside the container)
starts as the container's user, in the container's working directory, with
the container's environment less LD_PRELOAD and LD_AUDIT (a service is a
node program a hook bound in: the image's libraries must not load into it),
stdin /dev/null and stdout on stderr. The start then waits until PROGRAM
listens on TCP port PORT, and fails, in one line, when another process
listens there before it (another user's server would get the connections),
when it exits first, or when it has not listened after WAIT seconds. It ends
with the container: killed by berth at the end, or with its pid namespace.

These run after pivot_root: only what is imported already is used.
"""

import os
import signal
import time

from berth import units
from berth.container import entry
from berth.errors import BerthError

WAIT = 10  # seconds a service has to listen
_LISTEN = "0A"  # the state column of /proc/net/tcp


def read(path):
    """The services of a hooks' BERTH_SERVICES file: [(port, argv)]."""
    services = []
    with open(path, "rb") as f:
        text = f.read()
    for number, raw in enumerate(text.splitlines(), 1):
        words = raw.decode(errors="surrogateescape").split()
        if not words:
            continue
        where = f"BERTH_SERVICES line {number}"
        if len(words) < 3 or words[0] != "tcp":
            raise BerthError(f"{where}: expected 'tcp PORT PROGRAM [ARG...]'")
        port = units.whole(words[1])
        if port is None or not 0 < port < 65536:
            raise BerthError(f"{where}: port '{words[1][:20]}' is not a number from 1 to 65535")
        if not words[2].startswith("/"):
            raise BerthError(f"{where}: program '{words[2]}' is not an absolute path")
        services.append((port, words[2:]))
    return services


def start(services, env):
    """Start each service and wait until it listens: [pid] (of this pid namespace)."""
    env = {key: value for key, value in env.items() if key not in ("LD_PRELOAD", "LD_AUDIT")}
    pids = []
    try:
        for port, argv in services:
            if _listeners(port):
                raise BerthError(f"service {argv[0]}: TCP port {port} is taken by another process")
            pid = entry.spawn(argv[0], argv, env)
            pids.append(pid)
            _wait_listening(pid, port, argv[0])
    except BaseException:
        stop(pids)
        raise
    return pids


def stop(pids):
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass


def _wait_listening(pid, port, program):
    deadline = time.monotonic() + WAIT
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            raise BerthError(f"service {program} exited (status "
                             f"{os.waitstatus_to_exitcode(status)}) before listening on "
                             f"TCP port {port}")
        listening = _listeners(port)
        mine = _sockets(pid) if listening else None
        if mine is not None:  # (None: it ended meanwhile; waitpid then says how)
            if listening - mine:
                raise BerthError(f"service {program}: TCP port {port} is taken by another process")
            return
        if time.monotonic() > deadline:
            raise BerthError(f"service {program} does not listen on TCP port {port} "
                             f"after {WAIT} s")
        time.sleep(0.01)


def _listeners(port):
    """Inodes of the sockets listening on TCP `port` in this net namespace."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table, "rb") as f:
                lines = f.read().splitlines()[1:]
        except FileNotFoundError:  # a kernel without IPv6
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == _LISTEN.encode() and int(fields[1].rsplit(b":", 1)[1], 16) == port:
                inodes.add(fields[9].decode())
    return inodes


def _sockets(pid):
    """Inodes of the sockets `pid` holds; None when it is gone."""
    inodes = set()
    fds = f"/proc/{pid}/fd"
    try:
        names = os.listdir(fds)
    except OSError:  # gone, or exiting (a dying process's fds are no one's to read)
        return None
    for fd in names:
        try:
            target = os.readlink(f"{fds}/{fd}")
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return inodes
