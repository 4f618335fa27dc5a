"""Processes of `berth start` and `berth exec`.

One start is two processes (three with --pid):
  berth    stays on the host, as a child subreaper: forwards SIGTERM, SIGHUP,
           SIGUSR1 and SIGUSR2 to the container (SIGINT/SIGQUIT reach it from
           the terminal), reports setup errors, and at the end stops the
           FUSE servers and removes the per-start runtime directory. A FUSE
           server that ends before then (killed, crashed) stops the
           container: its tasks get I/O errors from that mount at once, and
           the start fails in one line naming it, not a step that hangs on.
  child    in the container's user namespace, mapped as enroot maps it
           (`UID UID 1`, or `0 UID 1` with --root; the same for gids), with
           every capability there until its exec, and a new mount
           namespace: mounts the root (squashfuse + overlay for an image),
           the system, fstab and -m mounts, runs the hooks, pivot_roots,
           makes the net/ipc/uts/pid namespaces asked for, installs the
           seccomp filter (seccomp.py) and execs the command with all of
           the caller's open file descriptors (with --pid it forks pid 1
           for that and waits for it).
Setup messages travel to berth over a close-on-exec pipe, one line each:
`fuse PID WHAT` (a FUSE server to stop at the end, and what it serves,
for the line that says it ended first), `service PID` (a hook's
service, services.py, to kill at the end; in a pid namespace its end kills
them), `poststart HOOK` and `poststop HOOK` (a CDI hook, as JSON, of a
device a hook asked for, to run once the command runs, and once the
container has ended), `error MESSAGE`, and for --detach
`keeper PID`, then `ready` from the keeper itself.

`berth start --detach` (the interface of the SPANK plugin):
  Does everything a start does, then runs a keeper inside the container's
  namespaces instead of the command: the image's /bin/sh, which blocks
  until berth ends. When the root is ready and every hook has run, berth
  prints the keeper's pid (host pid namespace) on stdout as one line
  `PID\\n`. The keeper's /proc/PID/environ is the final container
  environment and its cwd the image's workdir (/ when it has none or it is
  missing). berth then waits until it gets SIGTERM, SIGINT or SIGHUP, or
  its stdin reaches end of file, or the keeper dies; then it kills the
  keeper, tears everything down and exits 0. A setup failure prints
  `berth: error: ...` and exits 1 without printing a pid. `berth exec PID
  COMMAND...` runs a command in there.
  To join by hand: setns /proc/PID/ns/user first, then mnt (and net, ipc,
  uts, pid where they differ from yours): all are owned by that user
  namespace. The root is then the container's; chdir to /proc/PID/cwd
  (opened before the setns calls). Install the seccomp filter of
  seccomp.py before the exec, as the container's own processes have it.
  With --entrypoint, the keeper runs as the arguments of the image's
  entrypoint (which must `exec "$@"`): the entrypoint's environment becomes
  the container's. Its output goes to stderr. One that has not run its
  arguments after BERTH_ENTRYPOINT_TIMEOUT seconds (default 60) is killed
  and the start fails.
"""

import contextlib
import fcntl
import json
import os
import select
import signal
import sys
import typing

from berth import porcelain, rootpath, syscalls as sc
from berth.container import entry, environ, hooks, mounts, rootfs, seccomp, services
from berth.errors import BerthError
from berth.image import parts

_FORWARDED = (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
_NAMESPACES = (("user", sc.CLONE_NEWUSER), ("mnt", sc.CLONE_NEWNS), ("pid", sc.CLONE_NEWPID),
               ("net", sc.CLONE_NEWNET), ("ipc", sc.CLONE_NEWIPC), ("uts", sc.CLONE_NEWUTS))


class Plan(typing.NamedTuple):
    """Everything a start needs, checked before any process or file is made
    (verbs.py makes it)."""

    cfg: object              # the resolved configuration (config.Config)
    runtime: str             # per-start directory under ENROOT_RUNTIME_PATH
    image: object            # a squashfs started without unpacking (imagefile.Squashfs), or
    rootfs: str              # an unpacked container root
    scratch: str             # the root unpacked for this start only (a writable start of
                             # an image), removed at the end; or None
    writable: bool
    ids: tuple               # (uid, gid) of the container's processes inside ((0, 0) with
                             # --root), or None: no user namespace (ENROOT_ALLOW_SUPERUSER)
    unshare: int             # extra CLONE_NEW* flags: net, ipc, uts
    pid_namespace: bool
    restrict_dev: bool
    mounts: list             # user mounts: mounts.d, config files, -m, in that order
    env_files: list          # environ.d files
    env: dict                # config-file variables, then -e
    hooks: list              # hook executables in order
    rc: str                  # script run instead of the image's /etc/rc, or None
    login: bool              # run the command (or the keeper) through a login shell of the
                             # image, as enroot's ENROOT_LOGIN_SHELL does (_login_shell)
    command: list            # the command and its arguments
    detach: bool
    porcelain: bool          # --detach's pid line as pid=PID (berth/porcelain.py)
    entrypoint: bool         # run the image's entrypoint with the command as its arguments
    entrypoint_timeout: int  # seconds a --detach entrypoint has to exec its arguments
    device_hooks: tuple = ()  # the CDI devices' OCI hooks (cdi.Hook), after hooks.d's
    poststart_hooks: tuple = ()  # theirs to run once the command runs (cdi.Hook)
    poststop_hooks: tuple = ()  # theirs to run once the container has ended (cdi.Hook)
    nvidia_cdi: dict = {}    # the node's nvidia.com/gpu CDI devices, that hooks may ask
                             # for (cdi.load's form; verbs._nvidia_cdi)


def _send(fd, message):
    os.write(fd, (message.replace("\n", " ") + "\n").encode())


def _exec(command, env, program=None):
    """Exec `command`, found on env's PATH, or with `program` exec that with
    `command` as its argv."""
    entry.restore_signals()
    try:
        if program:
            os.execve(program, command, env)
        entry.execvpe(command, env)
    except OSError as e:
        print(f"berth: error: {program or command[0]}: {e.strerror} in the container",
              file=sys.stderr)
        os._exit(127 if isinstance(e, FileNotFoundError) else 126)


def _child(plan, status, hold):
    """Builds the root, runs the hooks, enters; never returns.

    It works in the container's one user namespace (the caller's uid and
    gid mapped onto themselves, or onto 0 with --root, as enroot maps them),
    with every capability there until it execs, and in a new mount
    namespace; entry.isolate then adds the net/ipc/uts/pid ones, owned by
    that user namespace. The command gets the seccomp filter (seccomp.py)."""
    try:
        if plan.ids is not None:
            entry.new_user_namespace(*plan.ids)
        sc.unshare(sc.CLONE_NEWNS)
        sc.prctl(sc.PR_SET_PDEATHSIG, signal.SIGKILL)
        sc.mount(None, "/", None, sc.MS_REC | sc.MS_PRIVATE)
        root, image, env, wanted = _build(plan, status)
        # a plain start's services learn its environment as the command starts
        ready_environ = (os.open(_ready_environ(plan), os.O_WRONLY)
                         if wanted and not plan.detach else None)
        workdir = image["workdir"]
        if not workdir or not os.path.isdir(rootpath.resolve(root, workdir, follow_last=True)):
            workdir = "/"
        entry.enter(root, workdir)
        flags = plan.unshare | (sc.CLONE_NEWPID if plan.pid_namespace else 0)
        child = entry.isolate(flags)
        if child:
            os.close(status)
            entry.relay(child)
        if plan.detach:  # its host pid: read before a pid namespace's own /proc hides it
            keeper = os.readlink("/proc/self")
        if plan.pid_namespace:
            entry.mount_own_proc()
        if plan.ids is not None:
            seccomp.install()
        shell = None  # an Apptainer image starts as apptainer exec starts it: no login
        if image["apptainer"]:
            env = {**_apptainer_environment(env, plan.entrypoint_timeout), **plan.env}
        elif plan.login:
            shell = _login_shell(env)
        if wanted:
            started = services.start(wanted, env)
            if not plan.pid_namespace:
                for pid in started:
                    _send(status, f"service {pid}")
        if plan.detach:
            _exec_keeper(keeper, status, hold, env,
                         (image["entrypoint"] or []) if plan.entrypoint else [], shell)
        argv, program = _command(plan, image, shell)
        if ready_environ is not None:  # (a login shell's profile is yet to run)
            with os.fdopen(ready_environ, "wb") as f:
                f.write(os.fsencode(environ.to_shell(env)))
        _exec(argv, env, program)
    except (BerthError, OSError) as e:
        _send(status, f"error {e}")
    finally:  # whatever happens, never return into berth's own code
        os._exit(1)


def _build(plan, status):
    """Mount the root and everything into it, run the hooks: (root, image
    config, env, the services they asked for)."""
    if plan.image:
        # Always an overlay, read-only at the end unless --rw: mount points
        # missing in the image can then be created (in the tmpfs upper dir).
        root, lower = f"{plan.runtime}/root", f"{plan.runtime}/lower"
        _send(status, f"fuse {mounts.mount_squashfs(plan.image, lower)} {plan.image.path} at /")
        top = parts.top_of_mounted(lower)  # an image kept as parts: its top over its root
        if top:
            again = f"{plan.runtime}/top"
            os.mkdir(again)
            _send(status, f"fuse {mounts.mount_squashfs(plan.image, again)} "
                          f"{plan.image.path} at / (its top part)")
        server = rootfs.mount_overlay(f"{again}/{top}:{lower}" if top else lower, root,
                                      f"{plan.runtime}/rw",
                                      native=plan.cfg.flag("ENROOT_NATIVE_OVERLAYFS"),
                                      user_xattrs=bool(top))
        if server:
            _send(status, f"fuse {server} the overlay at /")
    else:
        root = plan.rootfs
        sc.mount(root, root, None, sc.MS_BIND | sc.MS_REC)
    image = rootfs.image_config(root)
    env = environ.base(os.environ)
    for path in plan.env_files:
        environ.read_file(path, env)
    env.update(image["env"])
    private_dev = bool(plan.unshare & sc.CLONE_NEWIPC)
    links = rootfs.dev_links(plan.restrict_dev, private_dev)
    late = [m for m in plan.mounts if mounts.after_hooks(m)]
    now = [m for m in plan.mounts if not mounts.after_hooks(m)]
    for mount in rootfs.system_mounts(plan.restrict_dev, private_dev) + now:
        server = mounts.apply(root, mount)  # a sqsh mount's squashfuse
        if server:
            _send(status, f"fuse {server} {mount.source} at {mount.target}")
    rootfs.make_dev_links(root, links)
    hooked = (_run_hooks(plan, root, env) if plan.hooks
              else _Hooked([], device_hooks=(), poststart=(), poststop=()))
    for kind, later in (("poststart", hooked.poststart), ("poststop", hooked.poststop)):
        for hook in later:
            _send(status, f"{kind} {json.dumps(hook._asdict())}")
    device_hooks = (*plan.device_hooks, *hooked.device_hooks)
    if device_hooks:
        state = _oci_state(plan, root=root, status="created", pid=int(os.readlink("/proc/self")))
        with _namespace_capabilities(plan):
            hooks.run_device_hooks(device_hooks, state)
    for mount in late:  # a -m umount: may remove what a hook mounted (/root), as under enroot
        mounts.apply(root, mount)
    env.update(plan.env)
    if not plan.writable:
        mounts.remount_readonly(root)
    return root, image, env, hooked.services


def _oci_state(plan, *, root, status, pid=None):
    """The OCI state a CDI hook reads on its stdin (`pid`: the container's
    process, None once it has ended). Its bundle is the runtime directory,
    with a config.json naming the root there: NVIDIA's hooks (nvidia-ctk
    hook ...) find the container's root that way."""
    rootfs.write_file(f"{plan.runtime}/config.json",
                      json.dumps({"ociVersion": "1.0.2", "root": {"path": root}}))
    state = {"ociVersion": "1.0.2", "id": os.path.basename(plan.runtime), "status": status,
             "bundle": plan.runtime, "annotations": {}}
    return state if pid is None else {**state, "pid": pid}


class _Hooked(typing.NamedTuple):
    """What hooks.d's hooks asked for beyond their mounts and variables."""

    services: list      # services.read's
    device_hooks: tuple  # the OCI hooks of the CDI devices they asked for (cdi.Hook)
    poststart: tuple    # those of them to run once the command runs
    poststop: tuple     # those of them to run once the container has ended


def _hooks_devices(plan, root, env, *, devices_file):
    """Apply the CDI devices hooks named in `devices_file` (the nvidia hook's
    GPUs, of plan.nvidia_cdi alone): their mounts and variables now; their
    OCI hooks, those before the command, the poststart and the poststop
    ones, returned."""
    with open(devices_file, encoding="utf-8") as f:
        names = [line.strip() for line in f if line.strip()]
    if not names:
        return (), (), ()
    from berth.container import cdi
    devices = cdi.resolve_known(names, plan.nvidia_cdi)
    for mount in devices.mounts:
        mounts.apply(root, mount)
    env.update(devices.env)
    return tuple(devices.hooks), tuple(devices.poststart), tuple(devices.poststop)


@contextlib.contextmanager
def _namespace_capabilities(plan):
    """Programs run meanwhile (hooks.d's hooks, a CDI spec's hooks before the
    command) keep this process's capabilities in the container's user
    namespace: they run as its uid, and a uid other than 0 keeps them only
    as ambient ones. NVIDIA's `update-ldcache` hook, for one, makes mount
    and pid namespaces of its own to run ldconfig in the root."""
    ambient = plan.ids is not None and plan.ids[0] != 0
    if ambient:
        sc.keep_capabilities_across_exec()
    try:
        yield
    finally:
        if ambient:
            sc.drop_ambient_capabilities()


def _run_hooks(plan, root, env):
    """Run the hooks in the caller's environment: the container's variables
    (the image's Env, environ.d, -e) reach them as data only, KEY=VALUE
    lines in $ENROOT_ENVIRON, never as variables a shell or the loader acts
    on (BASH_ENV, LD_PRELOAD, PATH...). What they append there joins the
    container's environment. Returns the services they asked for."""
    mounts_file, environ_file = f"{plan.runtime}/mounts", f"{plan.runtime}/environ"
    services_file, devices_file = f"{plan.runtime}/services", f"{plan.runtime}/cdi-devices"
    rootfs.write_file(_ready_environ(plan), "")
    scratch = f"{plan.runtime}/hooks"
    os.mkdir(scratch)
    rootfs.write_file(mounts_file, "")
    rootfs.write_file(services_file, "")
    rootfs.write_file(devices_file, "")
    view = environ.to_lines({**env, **plan.env})
    rootfs.write_file(environ_file, view)
    uid, gid = plan.ids or (0, 0)
    protocol = {**dict(plan.cfg.items()),
                "ENROOT_PID": os.readlink("/proc/self"), "ENROOT_ROOTFS": root,
                "ENROOT_MOUNTS": mounts_file, "ENROOT_ENVIRON": environ_file,
                "BERTH_SERVICES": services_file, "BERTH_READY_ENVIRON": _ready_environ(plan),
                "BERTH_CDI_DEVICES": devices_file,
                "BERTH_NVIDIA_CDI_GPUS": " ".join(n.partition("=")[2] for n in plan.nvidia_cdi),
                "BERTH_RUNTIME_DIR": scratch,
                "BERTH_UID": str(uid), "BERTH_GID": str(gid)}
    with _namespace_capabilities(plan):
        hooks.run(plan.hooks, {**os.environ, "PATH": os.environ.get("PATH", environ.DEFAULT_PATH),
                               **protocol})
    # $VAR in the fstab lines they append expands from the container's
    # environment (mounts.py), the protocol's variables over it.
    for mount in mounts.read_fstab(mounts_file, {**os.environ, **env, **protocol}):
        mounts.apply(root, mount)
    device_hooks, poststart, poststop = _hooks_devices(plan, root, env,
                                                       devices_file=devices_file)
    environ.read_file(environ_file, env, expand=False, skip=len(view.encode()))
    return _Hooked(services.read(services_file), device_hooks=device_hooks,
                   poststart=poststart, poststop=poststop)


# The --detach keeper: a shell of the image (exec'd, so /proc/PID/environ is
# the container's environment) that reports ready on fd 3 and then blocks
# reading fd 4, a pipe only berth writes to: it ends when berth does, however
# berth ends. (dash redirects fds 0-9 only.)
_KEEPER = ("/bin/sh", "-c", "echo ready >&3 && exec 3>&- && read -r _ <&4")


def _exec_keeper(pid, status, hold, env, entrypoint, shell):
    """Become the keeper, host pid `pid`; given the image's entrypoint, run that
    with the keeper as its arguments (its environment then becomes the container's);
    given a login `shell`, through it, so that what its profile exports does too."""
    _send(status, f"keeper {pid}" + (" login" if shell else ""))
    status, hold = fcntl.fcntl(status, fcntl.F_DUPFD, 5), fcntl.fcntl(hold, fcntl.F_DUPFD, 5)
    os.dup2(status, 3)
    os.dup2(hold, 4)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(2 if entrypoint else null, 1)  # an entrypoint's output joins berth's messages
    os.closerange(5, os.sysconf("SC_OPEN_MAX"))
    command = [*entrypoint, *_KEEPER]
    entry.restore_signals()
    try:
        if shell:
            os.execve(shell, _through_login(shell, command), env)
        entry.execvpe(command, env)
    except OSError as e:
        what = (f"login shell {shell}" if shell else f"entrypoint {command[0]}" if entrypoint
                else f"{command[0]} (the keeper of --detach)")
        os.write(3, f"error {what}: {e.strerror} in the container\n".encode())
        os._exit(1)


# An Apptainer image's environment: its scripts sourced in order, as
# Apptainer's exec does, by the image's own shell.
_APPTAINER_SOURCE = (f'for script in {rootfs.APPTAINER_ENV}/*.sh; do '
                     'if [ -f "$script" ]; then . "$script"; fi; done')


def _apptainer_environment(env, seconds):
    """The environment the image's /.singularity.d/env scripts make of `env`,
    run where the command would run (inside, filtered, as the user), in a
    pid namespace of their own: what they start ends with the reading
    (entry.read_environment); their output goes to stderr. A script that
    fails, or has not finished after `seconds`, fails the start."""
    kind, value = entry.read_environment(_APPTAINER_SOURCE, env, seconds)
    if kind == "exit":
        raise BerthError(f"the image's {rootfs.APPTAINER_ENV} scripts failed (/bin/sh "
                         f"exit status {value})")
    if kind == "timeout":
        raise BerthError(f"the image's {rootfs.APPTAINER_ENV} scripts have not finished "
                         f"after {seconds} s (BERTH_ENTRYPOINT_TIMEOUT)")
    return value


def _login_shell(env):
    """The shell enroot-switchroot --login runs: the container's $SHELL where
    it is an executable of the image, else /bin/sh; None in an image with
    neither (it then starts as without ENROOT_LOGIN_SHELL)."""
    for shell in (env.get("SHELL", ""), "/bin/sh"):
        if shell.startswith("/") and os.access(shell, os.X_OK):
            return shell
    return None


def _through_login(shell, command):
    """The argv of `shell` running `command` as a login shell: argv[0] "-sh"
    (the sign every shell reads as login: dash and ash then read /etc/profile
    and ~/.profile; bash only when interactive), then exec "$@"."""
    name = os.path.basename(shell)
    return [f"-{name}", "-c", 'exec "$@"', name, *command] if command else [f"-{name}"]


def _command(plan, image, shell=None):
    """(argv, the shell to exec with it) for the command; (argv, None): exec
    argv[0] from PATH. A login `shell` runs the rc, /etc/rc or the command."""
    command = plan.command
    if plan.entrypoint:  # Docker's rule: ENTRYPOINT + (the command, else CMD)
        command = (image["entrypoint"] or []) + (command or image["cmd"] or [])
    argv0 = f"-{os.path.basename(shell)}" if shell else "/bin/sh"
    if plan.rc is not None:
        return [argv0, "-c", plan.rc, "rc", *command], shell or "/bin/sh"
    if os.path.isfile("/etc/rc"):
        return [argv0, "/etc/rc", *command], shell or "/bin/sh"
    command = command or (image["entrypoint"] or []) + (image["cmd"] or [])
    if shell:  # no command at all: the login shell itself, as enroot's
        return _through_login(shell, command), shell
    return command or ["/bin/sh"], None


def _forward_signals(pid):
    entry.forward_signals(pid, _FORWARDED)
    for sig in (signal.SIGINT, signal.SIGQUIT):
        signal.signal(sig, lambda *_: None)


def _wait_for_stop(child, servers):
    """Block until SIGTERM/SIGINT/SIGHUP, end of stdin, or the container's end
    (None); or until one of the FUSE `servers` (pids) ends first: its pid."""
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: None)
    child_fd = os.pidfd_open(child)
    server_fds = {os.pidfd_open(pid): pid for pid in servers}
    watched = [wake_r, child_fd, *server_fds]
    try:
        os.fstat(0)
        watched.append(0)
    except OSError:
        return None
    while True:
        ready = select.select(watched, [], [])[0]
        ended = [server_fds[fd] for fd in ready if fd in server_fds]
        if ended:
            return ended[0]
        if 0 not in ready or not os.read(0, 65536):
            return None


def _server_ended(child, servers):
    """Block until the container's `child` ends (None) or one of the FUSE
    `servers` (pids) ends before it (its pid)."""
    fds = {os.pidfd_open(pid): pid for pid in servers}
    child_fd = os.pidfd_open(child)
    try:
        ready = select.select([child_fd, *fds], [], [])[0]
    finally:
        for fd in (child_fd, *fds):
            os.close(fd)
    return next((fds[fd] for fd in ready if fd in fds), None)


def _server_lost(child, pid, what):
    """Stop the container whose FUSE server `pid` (serving `what`) has ended:
    its tasks get I/O errors from that mount from now on, and one that
    retries must not hold the step. The error line that says so."""
    _kill_tree(child)
    status = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
    how = (f"was killed by signal {status.si_status}" if status.si_code != os.CLD_EXITED
           else f"exited with status {status.si_status}")
    return f"{what}: its FUSE server (pid {pid}) {how}; the container was stopped"


def start(plan):
    """Run `plan`; return the command's exit status (0 after a --detach stop)."""
    sc.prctl(sc.PR_SET_CHILD_SUBREAPER, 1)
    status_r, status_w = os.pipe()
    hold_r, hold_w = os.pipe()  # the --detach keeper's lifeline; berth never writes to it
    child = os.fork()
    if child == 0:
        os.close(status_r)
        os.close(hold_w)
        _child(plan, status_w, hold_r)
    os.close(status_w)
    os.close(hold_r)
    rootfs.write_file(f"{plan.runtime}/state", f"{child}\n")
    _forward_signals(child)  # until --detach is ready: a stop then ends the setup
    setup = _Setup()  # (filled as it goes: what a failed read left is stopped all the same)
    try:
        with os.fdopen(status_r, encoding="utf-8") as messages:
            _read_setup(messages, setup, plan)
        signal.alarm(0)
        if setup.keeper and not setup.ready:
            setup.error = setup.error or _keeper_failure(plan, setup.login)
        if not setup.error:
            # (the root as the host side sees it: the child's is in its mount namespace)
            _run_late((*plan.poststart_hooks, *setup.poststart), lambda: _oci_state(
                plan, root=f"/proc/{child}/root", status="running", pid=child))
        ended = (_hold_detached(plan, child, keeper=setup.keeper, servers=setup.fuse) if setup.ready
                 else _server_ended(child, setup.fuse))
        if ended:
            setup.error = _server_lost(child, ended, setup.fuse[ended])
        code = entry.exit_code(os.waitpid(child, 0)[1])
    finally:
        os.close(hold_w)
        _stop_helpers(setup)
        _run_late((*plan.poststop_hooks, *setup.poststop), lambda: _oci_state(
            plan, root=f"{plan.runtime}/root" if plan.image else plan.rootfs, status="stopped"))
        rootfs.remove_tree(plan.runtime)
        if plan.scratch:
            rootfs.remove_tree(plan.scratch)
    if setup.error:
        raise BerthError(setup.error)
    if setup.ready:  # a Slurm step's end waits for this exit: skip the interpreter's teardown
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return code


class _Setup:
    """What the child's setup messages (the module's docstring) have said."""

    __slots__ = ("fuse", "services", "poststart", "poststop", "error", "keeper", "login",
                 "ready")

    def __init__(self):
        self.fuse = {}        # FUSE servers' pids -> what each serves; stopped at the end
        self.services = []    # hooks' services' pids, killed at the end
        self.poststart = []   # CDI poststart hooks of the devices hooks asked for (cdi.Hook)
        self.poststop = []    # and their poststop hooks
        self.error = None     # the setup's error message
        self.keeper = None    # --detach's keeper pid
        self.login = False    # the keeper runs through a login shell
        self.ready = False    # the keeper said ready


def _read_setup(messages, setup, plan):
    """Read the child's messages into `setup`, up to `ready` or the pipe's end."""
    for line in messages:
        kind, _, value = line.rstrip("\n").partition(" ")
        if kind == "fuse":
            pid, _, what = value.partition(" ")
            setup.fuse[int(pid)] = what
        elif kind == "service":
            setup.services.append(int(value))
        elif kind in ("poststart", "poststop"):
            from berth.container import cdi
            getattr(setup, kind).append(cdi.Hook(**json.loads(value)))
        elif kind == "error":
            setup.error = value
        elif kind == "keeper":  # "ready" then comes from the keeper shell
            keeper, _, login = value.partition(" ")
            setup.keeper, setup.login = int(keeper), bool(login)
            if plan.entrypoint or setup.login:
                _kill_after(setup.keeper, plan.entrypoint_timeout, plan.entrypoint)
        elif kind == "ready":
            setup.ready = True
            return  # (what the entrypoint left running may hold the pipe)


def _warn(line):
    print(f"berth: warning: {line}", file=sys.stderr, flush=True)


def _run_late(late, state):
    """CDI hooks of the stages after the start (poststart, poststop), on
    the host side, each with what `state()` gives (_oci_state's, asked only
    where there are hooks: it writes the bundle's config.json): a failure
    is a warning, as OCI has it."""
    if late:
        hooks.run_device_hooks(late, state(), warn=_warn)


def _keeper_failure(plan, login):
    """Why a keeper that never said ready ended, where the child said nothing."""
    if plan.entrypoint:
        return 'the image\'s entrypoint exited; it must end with exec "$@"'
    return "the container's keeper shell exited" + (
        " (in the login shell's profile: ENROOT_LOGIN_SHELL=no skips it)" if login else "")


def _hold_detached(plan, child, *, keeper, servers):
    """--detach, ready: say the keeper's pid, then hold the container until told
    to stop; the pid of the FUSE server of `servers` that ended first, if one did."""
    _fill_ready_environ(plan, keeper)
    print(porcelain.line(pid=keeper) if plan.porcelain else f"{keeper}\n", end="", flush=True)
    ended = _wait_for_stop(child, servers)
    with contextlib.suppress(ProcessLookupError):  # it may be gone already
        os.kill(keeper, signal.SIGKILL)
    return ended


def _stop_helpers(setup):
    for pid in setup.services:  # with their sessions, before their root goes
        _kill_tree(pid)
        with contextlib.suppress(ChildProcessError):  # orphans come to berth
            os.waitpid(pid, 0)
    for pid in setup.fuse:
        os.kill(pid, signal.SIGTERM)
        os.waitpid(pid, 0)


def _ready_environ(plan):
    """The file, empty until then, that the container's environment fills once
    it is ready: as its tasks get it (for --detach the keeper's, after the
    login shell's profile and the image's scripts), `export NAME='VALUE'`
    lines (environ.to_shell). Hooks get it as $BERTH_READY_ENVIRON, to bind it
    in for their services (the SSH hook's sessions source it)."""
    return f"{plan.runtime}/ready-environ"


def _fill_ready_environ(plan, keeper):
    path = _ready_environ(plan)
    if not os.path.exists(path):  # no hooks ran
        return
    try:
        env = _environ_of(keeper)
    except OSError:  # it has just ended: so does the start
        return
    with open(path, "r+b") as f:  # in place: a bind of it shows the same file
        f.write(os.fsencode(environ.to_shell(env)))


def _environ_of(pid):
    """The environment of process `pid`, from /proc/PID/environ: its
    NAME=VALUE entries (one with no '=' or no name is no variable)."""
    with open(f"/proc/{pid}/environ", "rb") as f:
        entries = f.read().split(b"\0")
    pairs = (os.fsdecode(e).partition("=") for e in entries)
    return {name: value for name, equals, value in pairs if name and equals}


def _kill_after(pid, seconds, entrypoint):
    """An entrypoint that never runs its arguments, or a login shell's profile
    that never ends, must not hold the start forever."""
    def expire(*_):
        _kill_tree(pid)
        if entrypoint:
            raise BerthError(f"the image's entrypoint did not run its arguments within "
                             f'{seconds} s; it must end with exec "$@"')
        raise BerthError(f"the login shell's profile has not finished after {seconds} s "
                         "(BERTH_ENTRYPOINT_TIMEOUT; ENROOT_LOGIN_SHELL=no skips it)")
    signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)


def _kill_tree(pid):
    """SIGKILL `pid` and every process under it (what a profile or an
    entrypoint started would keep berth's stderr open): each is stopped as
    it is found, so none forks past the walk."""
    found, pending = [], [pid]
    while pending:
        current = pending.pop()
        with contextlib.suppress(ProcessLookupError):
            os.kill(current, signal.SIGSTOP)
            found.append(current)
        with contextlib.suppress(OSError):
            for task in os.listdir(f"/proc/{current}/task"):
                with open(f"/proc/{current}/task/{task}/children") as f:
                    pending += [int(child) for child in f.read().split()]
    for each in found:
        with contextlib.suppress(ProcessLookupError):
            os.kill(each, signal.SIGKILL)


def exec_in(pid, command):
    """`berth exec`: run `command` in the namespaces, environment and cwd of `pid`."""
    if not command:
        raise BerthError("exec: missing COMMAND")
    proc = f"/proc/{pid}"
    try:
        env = _environ_of(pid)
        cwd = os.open(f"{proc}/cwd", os.O_RDONLY | os.O_DIRECTORY)
        joins = []
        for name, flag in _NAMESPACES:
            theirs, ours = os.stat(f"{proc}/ns/{name}"), os.stat(f"/proc/self/ns/{name}")
            if (theirs.st_dev, theirs.st_ino) != (ours.st_dev, ours.st_ino):
                joins.append((os.open(f"{proc}/ns/{name}", os.O_RDONLY), flag))
    except FileNotFoundError:
        raise BerthError(f"no process with pid {pid}") from None
    except PermissionError:
        raise BerthError(f"pid {pid}: permission denied (not your container?)") from None
    try:
        for fd, flag in joins:
            sc.setns(fd, flag)
            os.close(fd)
        os.fchdir(cwd)
    except OSError as e:
        raise BerthError(f"pid {pid}: cannot join its container: {e.strerror}") from None
    os.close(cwd)
    if any(flag == sc.CLONE_NEWUSER for _, flag in joins):
        seccomp.install()  # the container's processes have it; a joiner is none of their children
    if any(flag == sc.CLONE_NEWPID for _, flag in joins):
        child = os.fork()  # a pid namespace applies to children only
        if child:
            _forward_signals(child)
            return entry.exit_code(os.waitpid(child, 0)[1])
    _exec(command, env)
