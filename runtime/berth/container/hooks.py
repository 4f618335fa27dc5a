"""hooks.d: executables run before the container command.

Order: `$ENROOT_SYSCONF_PATH/hooks.d/*.sh` sorted, then
`$ENROOT_CONFIG_PATH/hooks.d/*.sh` sorted. A file without the execute bit
is skipped (`chmod -x` disables a hook). Each hook runs in the container's
user namespace, as the container's uid (BERTH_UID: 0 with --root, else the
caller's), with every capability in that namespace (ambient ones for a uid
other than 0: so it may mount into the root, and write where the caller
may), and in the new mount namespace, but still sees the host's
filesystem. Its environment is the caller's (that of `berth start`, where
the SPANK plugin puts an EDF's BERTH_HOOK_* annotations) with every
ENROOT_* setting and:
  ENROOT_PID        pid of the process that becomes the container
  ENROOT_ROOTFS     host path of the container root
  ENROOT_MOUNTS     a file the hook may append fstab lines to
  ENROOT_ENVIRON    the container's environment so far (environ.d, the
                    image's, -e and batch values), one KEY=VALUE line each,
                    then what earlier hooks appended (the last line of a
                    KEY wins); the hook may append KEY=VALUE lines to it.
                    A variable whose value has a newline is left out.
  BERTH_SERVICES    a file the hook may append `tcp PORT PROGRAM [ARG...]`
                    lines to: programs started inside the container once
                    it is ready, which must listen on PORT (services.py)
  BERTH_RUNTIME_DIR a private scratch directory removed when the container ends
  BERTH_NVIDIA_CDI_GPUS  the device names of the node's nvidia.com/gpu CDI
                    spec, space-separated (empty: none, or BERTH_NVIDIA_CDI=no)
  BERTH_CDI_DEVICES a file the hook may append `nvidia.com/gpu=NAME` lines to,
                    of those: the runtime applies their edits (container/cdi.py)
  BERTH_UID, BERTH_GID  the ids the container's processes will have inside
A hook that exits non-zero aborts the start, in one line: its last line of
output is the reason (`hook NAME: LINE`); what it printed before goes to
stderr, as all the output of a hook that succeeds does (stdout too: that
of --detach is the pid line). The output is held until the hook ends.

The container's variables never become the hook's own: an image's Env
(BASH_ENV, LD_PRELOAD, PATH...) or `-e` is data in $ENROOT_ENVIRON, read as
such (hooks/common.bash: container_env), never acted on by a shell or the
loader on the host side.
"""

import json
import os
import select
import signal
import sys

from berth.config import files_in
from berth.errors import BerthError


def find(cfg):
    hooks = []
    for base in (cfg["ENROOT_SYSCONF_PATH"], cfg["ENROOT_CONFIG_PATH"]):
        hooks += [p for p in files_in(f"{base}/hooks.d", ".sh") if os.access(p, os.X_OK)]
    return hooks


def _relayed(status, output):
    """Copy a hook's `output` to stderr, less its last line where it failed
    (`status`): that line is why, returned for the one error line."""
    reason = b""
    if status:
        before, _, reason = output.rstrip().rpartition(b"\n")
        output = before + b"\n" if before else b""
    sys.stderr.flush()
    with open(sys.stderr.fileno(), "wb", closefd=False) as stderr:
        stderr.write(output)
    return reason


def run(hooks, env):
    for hook in hooks:
        status, output = _run_one(hook, env)
        reason = _relayed(status, output)
        if reason:
            raise BerthError(f"hook {os.path.basename(hook)}: "
                             f"{reason.decode(errors='replace').strip()}")
        if status:
            raise BerthError(f"hook {hook} failed with exit status {status}")


def run_device_hooks(device_hooks, state, warn=None):
    """A CDI spec's OCI hooks (cdi.Hook), in order, each with the container's
    OCI state (a dict) as JSON on its stdin; one that fails, or has not
    finished within its timeout (it is then killed with its process group),
    aborts the start as a hooks.d hook does, its last line the reason. With
    `warn` (poststart hooks), `warn` takes that line instead, and the rest run."""
    data = json.dumps(state).encode()
    for hook in device_hooks:
        status, output = _run_one(hook.path, dict(e.partition("=")[::2] for e in hook.env),
                                  argv=list(hook.args), stdin=data, timeout=hook.timeout)
        if status is None:
            _relayed(0, output)
            problem = (f"{hook.origin}: {hook.stage} hook {hook.path} has not finished after "
                       f"{hook.timeout} s (the spec's timeout): killed")
        else:
            reason = _relayed(status, output)
            if not status:
                continue
            why = reason.decode(errors="replace").strip()
            problem = (f"{hook.origin}: hook {hook.path} failed with exit status {status}"
                       + (f": {why}" if why else ""))
        if warn is None:
            raise BerthError(problem)
        warn(problem)


def _waited(pid, timeout):
    """`pid`'s wait status; None where it has not ended within `timeout`
    seconds (None: no limit), when it and its process group are killed."""
    if timeout is not None:
        fd = os.pidfd_open(pid)
        try:
            ended, _, _ = select.select([fd], [], [], timeout)
        finally:
            os.close(fd)
        if not ended:
            os.killpg(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return None
    return os.waitpid(pid, 0)[1]


def _run_one(hook, env, argv=None, stdin=None, timeout=None):
    """Run `hook` with its stdout and stderr in a file (not a pipe: what it
    leaves running cannot hold the start): (its exit status, its output);
    the status None where it outlasted `timeout` seconds (it has a process
    group of its own then, killed). `stdin`: bytes for its standard input
    (else /dev/null)."""
    # posix_spawn rather than subprocess: every start runs every hook, and
    # subprocess costs an import of its own.
    output = os.memfd_create("hook-output")
    given = os.memfd_create("hook-input") if stdin is not None else None
    if given is not None:
        os.write(given, stdin)
        os.lseek(given, 0, os.SEEK_SET)
    first = ((os.POSIX_SPAWN_DUP2, given, 0) if given is not None
             else (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0))
    try:
        try:
            pid = os.posix_spawn(hook, argv or [hook], env, file_actions=[
                first, (os.POSIX_SPAWN_DUP2, output, 1), (os.POSIX_SPAWN_DUP2, output, 2)],
                setsigdef=(signal.SIGPIPE, signal.SIGXFSZ),
                **({} if timeout is None else {"setpgroup": 0}))
        except OSError as e:
            raise BerthError(f"hook {hook}: cannot run: {e.strerror}") from None
        status = _waited(pid, timeout)
        if status is not None:
            status = os.waitstatus_to_exitcode(status)
        return status, os.pread(output, os.fstat(output).st_size, 0)
    finally:
        os.close(output)
        if given is not None:
            os.close(given)
