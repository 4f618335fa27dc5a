"""Container verbs: create, start, exec, list, remove, export, batch.

A container is an unpacked root in $ENROOT_DATA_PATH/NAME; `start` also
takes an IMAGE.sqsh or IMAGE.sif (a path ending in .sqsh or .sif, or
containing '/') and mounts it with squashfuse instead of unpacking it (a
SIF file's system partition in place, at its offset), or a registry reference
docker://URI: the image cache's squashfs of it, found or made as `berth
import --cache-only [--reuse] URI` does (importer.cached_squashfs), then
started as that IMAGE.sqsh; with --detach, the digest it was pulled by is
a line on stdout before the pid's (the SPANK plugin's one Python start per
node and step, where it ran an import and a start). Every start works in a
fresh directory under $ENROOT_RUNTIME_PATH that is removed when it ends.

Config files (`start -c CONF`, `batch CONF`), a small subset of enroot's
batch format; every other line is shell:
  #ENROOT_ROOTFS=NAME|IMAGE.sqsh       what `batch` starts (ignored by -c)
  #ENROOT_<KEY>=VALUE                  an enroot.conf setting, e.g.
                                       #ENROOT_ROOTFS_WRITABLE=yes
  #ENROOT_ENVIRON KEY=VALUE            a container variable (below -e)
  #ENROOT_MOUNTS SRC DST TYPE OPTIONS  an fstab line (before -m mounts)
When the file has any line that is neither blank nor a comment, the whole
file is the container's rc: /bin/sh runs it inside with COMMAND as "$@"
(--rc SCRIPT takes precedence).
"""

import collections
import fcntl
import os
import sys
import typing

from berth import config, porcelain, safedir, syscalls as sc
from berth.container import environ, hooks, launch, mounts, rootfs
from berth.errors import BerthError
from berth.image import imagefile, parts, reference

# What each verb is asked: cli.py makes these of the command line (no
# command-line namespace below it). Named tuples, as image/request.py's.
CreateRequest = collections.namedtuple("CreateRequest", "image name force",
                                       defaults=(None, False))


class _StartFields(typing.NamedTuple):
    command: tuple
    container: str = None  # start's NAME, IMAGE or docker://URI
    config: str = None     # batch's config file
    conf: tuple = ()       # -c CONF files
    env: tuple = ()
    rc: str = None
    root: bool = False
    rw: bool = False
    mount: tuple = ()
    device: tuple = ()     # CDI device names
    pid: bool = False
    net: bool = False
    ipc: bool = False
    uts: bool = False
    detach: bool = False
    entrypoint: bool = False
    reuse: bool = False
    quiet: bool = False
    store_client: object = None  # the shared image store's, for a docker://URI
    porcelain: bool = False


class StartRequest(_StartFields):
    """start and batch: the options they share, start's --reuse and the
    shared image store's client (image.request.ImportRequest's). Given by
    keyword only: nineteen fields are not told apart by their places."""

    __slots__ = ()

    def __new__(cls, **fields):
        return super().__new__(cls, **fields)


ExecRequest = collections.namedtuple("ExecRequest", "pid command")
ListRequest = collections.namedtuple("ListRequest", "fancy", defaults=(False,))
RemoveRequest = collections.namedtuple("RemoveRequest", "names force", defaults=(False,))
ExportRequest = collections.namedtuple("ExportRequest", "name output force keep_setuid quiet "
                                                        "verbose",
                                       defaults=(None, False, False, False, False))


class Conf:
    """What config files say: rootfs, settings, env, mounts, rc (see above)."""

    def __init__(self):
        self.rootfs = None
        self.settings = {}
        self.env = {}
        self.mounts = []
        self.rc = None


# A name is a directory name, with room for the staging names made from it
# (".NAME.old.PID") within NAME_MAX (255 bytes).
NAME_MAX = 200


def _check_name(name, what="container name"):
    """`name` if it can name a container; else one line naming `what` (the flag)."""
    bad = (not name or "/" in name or name.startswith(".") or name.endswith(imagefile.SUFFIXES)
           or any(ord(c) < 32 or ord(c) == 127 for c in name)
           or len(name.encode(errors="surrogateescape")) > NAME_MAX)
    if bad:
        shown = name if len(name) <= 40 else name[:40] + "..."
        raise BerthError(f"{what}: invalid container name {shown!r}: it must be non-empty, "
                         f"at most {NAME_MAX} bytes, without '/' or control characters, "
                         "not start with '.' nor end with '.sqsh' or '.sif'")
    return name


def _data_path(cfg):
    """ENROOT_DATA_PATH, checked when it exists (None when it does not)."""
    data = cfg["ENROOT_DATA_PATH"]
    safedir.check_if_present(data, "ENROOT_DATA_PATH")
    return data


def _container_root(cfg, name, what="NAME"):
    _check_name(name, what)
    data = _data_path(cfg)
    root = f"{data}/{name}"
    if not os.path.isdir(root):
        raise BerthError(f"no container named '{name}' in {data} (see berth list)")
    return root


def _make_removable(tree):
    """Give the owner rwx on every directory, so the tree can be removed later."""
    for top, dirs, _ in os.walk(tree):
        for d in [top, *(os.path.join(top, d) for d in dirs)]:
            mode = os.lstat(d).st_mode
            if mode & 0o700 != 0o700 and not os.path.islink(d):
                os.chmod(d, mode | 0o700)


def _fresh_dir(parent, name):
    """A new directory parent/name.PID; a leftover of a dead process is replaced."""
    path = f"{parent}/{name}.{os.getpid()}"
    rootfs.remove_tree(path)
    os.mkdir(path, 0o700)
    return path


def _run_tool(command, what):
    import subprocess  # (like squash in export: kept off the path of start, which a step waits for)
    result = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, check=False)
    if result.returncode:
        detail = (result.stderr.strip().splitlines() or ["no message"])[-1]
        raise BerthError(f"{what}: {command[0]} failed: {detail}")


def _without_suffix(name):
    for suffix in imagefile.SUFFIXES:
        name = name.removesuffix(suffix)
    return name


def cmd_create(request, cfg):
    image = imagefile.locate(request.image)
    name = _check_name(request.name if request.name is not None
                       else _without_suffix(os.path.basename(image.path)),
                       "-n/--name" if request.name is not None else f"{request.image} (as a name)")
    data = safedir.ensure(cfg["ENROOT_DATA_PATH"], "ENROOT_DATA_PATH")
    target = f"{data}/{name}"
    if os.path.exists(target) and not request.force:
        raise BerthError(f"container '{name}' already exists in {data} (-f replaces it)")
    staging = _fresh_dir(data, f".{name}")
    try:
        _unsquash(image, staging)
        if os.path.exists(target):
            old = _fresh_dir(data, f".{name}.old")
            os.rename(target, f"{old}/root")
            os.rename(staging, target)
            rootfs.remove_tree(old)
        else:
            os.rename(staging, target)
    except BaseException:
        rootfs.remove_tree(staging)
        raise
    return 0


def read_conf(path, expand_env):
    conf = Conf()
    try:
        text = _read_text(path)
    except OSError as e:
        raise BerthError(f"{path}: cannot read: {e.strerror}") from None
    except UnicodeDecodeError:
        raise BerthError(f"{path}: not UTF-8 text") from None
    for number, line in enumerate(text.splitlines(), 1):
        origin = f"{path}:{number}"
        directive, _, rest = line.strip().partition(" ")
        key, sep, value = directive.partition("=")
        if directive == "#ENROOT_ENVIRON":
            pair = environ.parse_line(rest, origin)
            if pair:
                conf.env[pair[0]] = pair[1]
        elif directive == "#ENROOT_MOUNTS":
            mount = mounts.parse_fstab_line(rest, origin, expand_env)
            if mount:
                conf.mounts.append(mount)
        elif key == "#ENROOT_ROOTFS" and sep:
            conf.rootfs = value
        elif key.startswith("#ENROOT_") and sep:
            if key[1:] not in config.KEYS:
                raise BerthError(f"{origin}: unknown setting '{key[1:]}'")
            conf.settings[key[1:]] = value
        elif line.strip() and not line.lstrip().startswith("#"):
            conf.rc = text
    return conf


def _configs(paths, expand_env, cfg):
    """Merge -c files into one Conf; return it and the configuration it changes."""
    merged = Conf()
    for path in paths:
        conf = read_conf(path, expand_env)
        merged.rootfs = conf.rootfs or merged.rootfs
        merged.settings.update(conf.settings)
        merged.env.update(conf.env)
        merged.mounts += conf.mounts
        merged.rc = conf.rc if conf.rc is not None else merged.rc
    return merged, config.Config({**dict(cfg.items()), **merged.settings})


def _read_text(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def _sorted_files(cfg, directory, suffix):
    return [p for key in ("ENROOT_SYSCONF_PATH", "ENROOT_CONFIG_PATH")
            for p in config.files_in(f"{cfg[key]}/{directory}", suffix)]


def _entrypoint_timeout():
    # (signal.alarm takes no more than an unsigned int: the others' day at most)
    return config.number_in_range("BERTH_ENTRYPOINT_TIMEOUT",
                                  os.environ.get("BERTH_ENTRYPOINT_TIMEOUT", "60"), 1, 86400)


def _plan(request, cfg, container, conf, uri=False):
    """Check every input, then make the runtime directory: a launch.Plan.
    With `uri`, `container` is a registry reference (docker://URI), its
    image pulled (_pulled) once every other input is checked."""
    if request.porcelain and not request.detach:
        raise BerthError("--porcelain: only with --detach")
    # hooks.d, environ.d and mounts.d in there run as the caller or reach the container
    safedir.check_if_present(cfg["ENROOT_CONFIG_PATH"], "ENROOT_CONFIG_PATH")
    source = _source(request, cfg, container=container, uri=uri)
    devices = _devices(request, cfg)
    user_mounts = [*devices.mounts, *_user_mounts(request, cfg, conf)]
    env = {**dict(devices.env), **_environment(request, conf)}
    rc = _rc(request, conf)
    ids = _ids(request, cfg)
    unshare = _unshare(request, cfg)
    pid_namespace = request.pid or cfg.flag("ENROOT_UNSHARE_PID")
    restrict_dev = cfg.flag("ENROOT_RESTRICT_DEV")
    env_files = _sorted_files(cfg, "environ.d", ".env")
    found_hooks = hooks.find(cfg)
    login = cfg.flag("ENROOT_LOGIN_SHELL")
    entrypoint_timeout = _entrypoint_timeout()
    # the first change made: last, once every input is read
    root = _prepare_root(request, cfg, container=container, uri=uri,
                         source=source)
    return launch.Plan(
        cfg=cfg, runtime=root.runtime, image=root.image, rootfs=root.rootfs,
        scratch=root.scratch, writable=source.writable, ids=ids, unshare=unshare,
        pid_namespace=pid_namespace, restrict_dev=restrict_dev, mounts=user_mounts,
        env_files=env_files, env=env, hooks=found_hooks, rc=rc, login=login,
        command=list(request.command), detach=request.detach, porcelain=request.porcelain,
        entrypoint=request.entrypoint, entrypoint_timeout=entrypoint_timeout,
        device_hooks=tuple(devices.hooks), poststart_hooks=tuple(devices.poststart),
        poststop_hooks=tuple(devices.poststop),
        nvidia_cdi=_nvidia_cdi(cfg, found_hooks),
    )


class _NoDevices(typing.NamedTuple):
    """What a start without --device has of CDI (cdi.Devices' fields)."""

    env: tuple = ()
    mounts: tuple = ()
    hooks: tuple = ()
    poststart: tuple = ()
    poststop: tuple = ()


def _warn(line):
    print(f"berth: warning: {line}", file=sys.stderr)


def _devices(request, cfg):
    """The CDI devices of --device, checked against the node (container/cdi.py)."""
    if not request.device:
        return _NoDevices()
    from berth.container import cdi  # only for a start that asks for a device
    return cdi.resolve(request.device, cfg["BERTH_CDI_SPEC_DIRS"], _warn)


def _nvidia_cdi(cfg, found_hooks):
    """The node's trusted nvidia.com/gpu CDI devices (cdi.load's form), which
    the nvidia hook asks for rather than finding the driver's files itself;
    none with BERTH_NVIDIA_CDI=no, or without hooks to ask."""
    if not found_hooks or not cfg.flag("BERTH_NVIDIA_CDI"):
        return {}
    from berth.container import cdi
    return cdi.of_kind(cdi.load(cfg["BERTH_CDI_SPEC_DIRS"], _warn), cdi.NVIDIA_GPU)


class _Source(typing.NamedTuple):
    """Where a start's root comes from, checked (_source)."""

    image: object   # the image file's imagefile.Squashfs; None for a container or a URI
    rootfs: str     # the container's root, or None for an image
    writable: bool
    unpack: bool    # the image unpacked for this start (_writable_image)


def _source(request, cfg, *, container, uri):
    is_image = uri or container.endswith(imagefile.SUFFIXES) or "/" in container
    image = imagefile.locate(container) if is_image and not uri else None
    root = None if is_image else _container_root(cfg, container)
    writable = request.rw or cfg.flag("ENROOT_ROOTFS_WRITABLE")
    unpack = is_image and writable and _writable_image() == "unpack"
    if is_image and not unpack and sc.overlay_unsafe(cfg["ENROOT_RUNTIME_PATH"]):
        raise BerthError(f"ENROOT_RUNTIME_PATH {cfg['ENROOT_RUNTIME_PATH']}: a path with ',', "
                         "':' or '\\' cannot be an overlay's directory (the image's root is one)")
    if is_image and not unpack and not os.access("/dev/fuse", os.R_OK | os.W_OK):
        raise BerthError(f"/dev/fuse is not usable by uid {os.getuid()}: starting {container} "
                         "without unpacking needs it with mode 0666 (or use berth create)")
    return _Source(image=image, rootfs=root, writable=writable, unpack=unpack)


def _user_mounts(request, cfg, conf):
    """mounts.d's fstab files, then the config files', then -m's."""
    expand_env = {**os.environ, **dict(cfg.items())}
    fstabs = []
    for path in _sorted_files(cfg, "mounts.d", ".fstab"):
        fstabs += mounts.read_fstab(path, expand_env)
    return fstabs + conf.mounts + [mounts.parse_spec(s) for s in request.mount]


def _environment(request, conf):
    """The config files' variables, then -e's."""
    env = dict(conf.env)
    for spec in request.env:
        pair = environ.parse_option(spec, os.environ)
        if pair:
            env[pair[0]] = pair[1]
    return env


def _rc(request, conf):
    if not request.rc:
        return conf.rc
    try:
        return _read_text(request.rc)
    except OSError as e:
        raise BerthError(f"--rc {request.rc}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise BerthError(f"--rc {request.rc}: not UTF-8 text") from None


def _ids(request, cfg):
    if os.getuid() == 0 and cfg.flag("ENROOT_ALLOW_SUPERUSER"):
        return None  # no user namespace at all
    if request.root or cfg.flag("ENROOT_REMAP_ROOT"):
        return (0, 0)
    return (os.getuid(), os.getgid())


def _unshare(request, cfg):
    unshare = 0
    for ns, flag in (("net", sc.CLONE_NEWNET), ("ipc", sc.CLONE_NEWIPC), ("uts", sc.CLONE_NEWUTS)):
        if getattr(request, ns) or cfg.flag(f"ENROOT_UNSHARE_{ns.upper()}"):
            unshare |= flag
    return unshare


class _Root(typing.NamedTuple):
    """The start's directories as _prepare_root made them (launch.Plan's fields)."""

    runtime: str
    image: object
    rootfs: str
    scratch: str


def _prepare_root(request, cfg, *, container, uri, source):
    """The runtime directory, made, and the root: a URI's image pulled, an
    image unpacked for a writable start, else the image's mount points."""
    base = safedir.ensure(cfg["ENROOT_RUNTIME_PATH"], "ENROOT_RUNTIME_PATH")
    image = source.image
    if uri:  # from here on, as a start of the image cache's IMAGE.sqsh
        container = _pulled(request, cfg, container)
        image = imagefile.locate(container)
    label = _label(container)
    try:
        runtime = _fresh_dir(base, label)
    except OSError as e:
        raise BerthError(f"ENROOT_RUNTIME_PATH {base}: {e.strerror}") from None
    if source.unpack:
        try:
            scratch = _unpack_for_start(cfg, image, label)
        except BaseException:
            rootfs.remove_tree(runtime)
            raise
        return _Root(runtime=runtime, image=None, rootfs=scratch, scratch=scratch)
    for sub in ("root", "lower") if image else ():
        os.mkdir(f"{runtime}/{sub}")
    return _Root(runtime=runtime, image=image, rootfs=source.rootfs, scratch=None)


def _label(container):
    """An image's file name, made a safe directory name (the start's, for
    berth list) that overlay's options (sc.OVERLAY_UNSAFE) can hold."""
    return "".join(c if c.isprintable() and c not in f"/{sc.OVERLAY_UNSAFE}" else "_"
                   for c in os.path.basename(container))[:NAME_MAX]


def _writable_image():
    """BERTH_WRITABLE_IMAGE: how a writable start of IMAGE.sqsh gets its root.

    unpack (default)  unpacked into a hidden directory of ENROOT_DATA_PATH,
                      removed at the end, as enroot does for every start: a
                      directory of the image can be renamed (dpkg, apt).
    overlay           the squashfs mounted under an overlay, as read-only
                      starts: no unpacking, but renaming a directory that
                      came from the image, and even one made there (dpkg
                      puts each new directory in place by renaming its
                      X.dpkg-new), fails with EXDEV ("Invalid cross-device
                      link"): in a user namespace neither the kernel's
                      overlay (no redirect_dir there) nor fuse-overlayfs
                      can rename one."""
    mode = os.environ.get("BERTH_WRITABLE_IMAGE", "unpack")
    if mode not in ("unpack", "overlay"):
        raise BerthError(f"BERTH_WRITABLE_IMAGE: expected unpack or overlay, got '{mode}'")
    return mode


def _unsquash(image, target):
    """Unpack the imagefile.Squashfs `image` into `target`."""
    top = None if image.offset else parts.top_of_file(image.path)
    if top:
        parts.unpack(image.path, target, top)  # its merged tree, as a start shows it
        _make_removable(target)
        return
    # Unprivileged, unsquashfs cannot make device nodes: a non-fatal error.
    tolerate = ["-no-exit-code"] if os.getuid() else []
    offset = ["-o", str(image.offset)] if image.offset else []
    _run_tool(["unsquashfs", "-no-progress", "-no-xattrs", *tolerate, *offset, "-f",
               "-d", target, image.path], image.path)
    _make_removable(target)


def _unpack_for_start(cfg, image, label):
    """IMAGE unpacked into ENROOT_DATA_PATH/..rw.LABEL.PID, locked (flock) for
    as long as this berth lives: one that a killed berth left behind is
    unlocked, and removed by the next writable start of its owner. ('..'
    starts no container's staging name: a name never starts with '.')"""
    data = safedir.ensure(cfg["ENROOT_DATA_PATH"], "ENROOT_DATA_PATH")
    _remove_abandoned_unpacks(data)
    staging = _fresh_dir(data, f"..unpacking.{label}")
    try:
        hold = os.open(staging, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        fcntl.flock(hold, fcntl.LOCK_EX)  # kept (close-on-exec) until berth ends
        final = f"{data}/..rw.{label}.{os.getpid()}"
        rootfs.remove_tree(final)
        os.rename(staging, final)  # only now can a cleanup see it: locked already
        staging = final
        _unsquash(image, staging)
    except BaseException:
        rootfs.remove_tree(staging)
        raise
    return staging


def _remove_abandoned_unpacks(data):
    for name in _entries(data):
        if not name.startswith("..rw."):
            continue
        try:
            fd = os.open(f"{data}/{name}", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # its start is alive
            os.close(fd)
            continue
        try:
            rootfs.remove_tree(f"{data}/{name}")
        except OSError:
            pass  # another start removing it too, or not ours to remove: left as it is
        finally:
            os.close(fd)


def _pulled(request, cfg, uri):
    """start docker://URI: the image cache's squashfs of URI, as `berth
    import --cache-only [--reuse] URI` finds or makes it. With --detach, the
    digest it was pulled by goes to stdout at once, a line before the pid's,
    followed by " cached" when the image was there already (the plugin
    tells the user that nothing was downloaded)."""
    from berth.image import importer  # (only here: starts of a name or a file need none of it)
    from berth.image.request import ImportRequest
    pulled = importer.cached_squashfs(cfg, ImportRequest(
        uri, reuse=request.reuse, quiet=request.quiet, digest=True,
        store_client=request.store_client))
    if request.detach and request.porcelain:
        print(porcelain.line(digest=pulled.digest, cached=pulled.found), end="", flush=True)
    elif request.detach:
        print(f"{pulled.digest} cached" if pulled.found else pulled.digest, flush=True)
    return pulled.path


def cmd_start(request, cfg):
    # a registry reference (a container name has no '/')
    uri = request.container.startswith(reference.SCHEMES)
    if request.reuse and not uri:
        raise BerthError(f"--reuse: only with a docker:// or oras:// target, not "
                         f"'{request.container}'")
    conf, cfg = _configs(request.conf, {**os.environ, **dict(cfg.items())}, cfg)
    return launch.start(_plan(request, cfg, request.container, conf, uri))


def cmd_batch(request, cfg):
    conf, cfg = _configs([*request.conf, request.config], {**os.environ, **dict(cfg.items())}, cfg)
    if not conf.rootfs:
        raise BerthError(f"{request.config}: no #ENROOT_ROOTFS=NAME|IMAGE.sqsh line")
    return launch.start(_plan(request, cfg, conf.rootfs, conf))


def cmd_exec(request, cfg):
    return launch.exec_in(request.pid, request.command)


def running(cfg):
    """{container name: [pid, ...]} of the starts alive under ENROOT_RUNTIME_PATH."""
    found = {}
    base = cfg["ENROOT_RUNTIME_PATH"]
    safedir.check_if_present(base, "ENROOT_RUNTIME_PATH")
    parent = os.path.dirname(base)
    fallbacks = config.private_runtime_dirs(os.path.dirname(parent), os.getuid())
    for runtime_path in [f"{d}/enroot" for d in fallbacks] if parent in fallbacks else [base]:
        for start in _entries(runtime_path):
            try:
                pid = int(_read_text(f"{runtime_path}/{start}/state"))
            except (OSError, ValueError):
                continue
            if os.path.exists(f"/proc/{pid}"):
                found.setdefault(start.rsplit(".", 1)[0], []).append(pid)
    return found


def _entries(directory):
    try:
        return os.listdir(directory)
    except FileNotFoundError:
        return []


def _shown(name):
    """One line per container, even for a name an older berth let in with a
    newline or other control character (shown escaped, as \\n)."""
    if name.isprintable():
        return name
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in name)


# `list --fancy`: enroot's columns, in its order
_FANCY = ("NAME", "PID", "COMM", "STATE", "STARTED", "TIME", "MNTNS", "USERNS", "COMMAND")


def _process_row(pid):
    """The PID...COMMAND cells of process `pid`, or None once it is gone."""
    proc = f"/proc/{pid}"
    try:
        with open(f"{proc}/stat", encoding="utf-8", errors="replace") as f:
            stat = f.read()
        with open(f"{proc}/cmdline", "rb") as f:
            argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
        namespaces = [os.readlink(f"{proc}/ns/{ns}") for ns in ("mnt", "user")]
    except OSError:
        return None
    comm = stat[stat.index("(") + 1:stat.rindex(")")]
    fields = stat[stat.rindex(")") + 2:].split()
    ticks = os.sysconf("SC_CLK_TCK")
    cpu = (int(fields[11]) + int(fields[12])) // ticks  # utime + stime
    days, rest = divmod(cpu, 86400)
    used = (f"{days}-" if days else "") + "{:02}:{:02}:{:02}".format(
        rest // 3600, rest // 60 % 60, rest % 60)
    import time  # (list only)
    started = _boot_time() + int(fields[19]) / ticks
    same_day = time.localtime(started)[:3] == time.localtime()[:3]
    when = time.strftime("%H:%M" if same_day else "%b%d", time.localtime(started))
    mntns, userns = (n.split("[", 1)[-1].rstrip("]") for n in namespaces)
    return [str(pid), _shown(comm), fields[0], when, used, mntns, userns,
            _shown(" ".join(argv)) or f"[{_shown(comm)}]"]


def _boot_time():
    with open("/proc/stat", encoding="ascii") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("btime "))


def cmd_list(request, cfg):
    data = _data_path(cfg)
    names = sorted(n for n in _entries(data)
                   if not n.startswith(".") and os.path.isdir(f"{data}/{n}"))
    if not request.fancy:
        for name in names:
            print(_shown(name))
        return 0
    pids = running(cfg)
    rows = [list(_FANCY)]
    for name in names:  # one row each; a stopped container shows only its name
        found = (_process_row(pid) for pid in sorted(pids.get(name, [])))
        rows.append([_shown(name), *next((row for row in found if row), [])])
    widths = [max(len(row[i]) for row in rows if len(row) > i) for i in range(len(_FANCY))]
    for row in rows:
        cells = zip(row, widths, strict=False)  # a stopped container's row: its name alone
        print("  ".join(cell.ljust(width) for cell, width in cells).rstrip())
    return 0


def cmd_remove(request, cfg):
    """Every NAME must exist (with -f too, as enroot); -f also removes a running one."""
    data = _data_path(cfg)
    busy = running(cfg)
    doomed = []
    for name in request.names:
        root = f"{data}/{_check_name(name, 'NAME')}"
        if not os.path.isdir(root):
            raise BerthError(f"no container named '{name}' in {data}")
        if name in busy and not request.force:
            raise BerthError(f"container '{name}' is running (pid {busy[name][0]}); "
                             "-f removes it anyway")
        doomed.append(root)
    for root in doomed:
        hidden = _fresh_dir(data, f".{os.path.basename(root)}.removing")
        os.rename(root, f"{hidden}/root")
        rootfs.remove_tree(hidden)
    return 0


def cmd_export(request, cfg):
    from berth.image import squash  # (its imports would slow every start)
    root = _container_root(cfg, request.name)
    output = os.path.abspath(request.output or f"{request.name}.sqsh")
    if os.path.exists(output) and not request.force:
        raise BerthError(f"{output} already exists (-f overwrites it)")
    # root's create kept the image's owners; anyone else's made them theirs.
    # Setuid/setgid bits set inside the container would become root's in an
    # image owned by root: they go unless --keep-setuid.
    squash.make_squashfs(root, output, cfg, not request.quiet and sys.stderr.isatty(),
                         all_root=os.getuid() != 0, strip_setuid=not request.keep_setuid,
                         verbose=request.verbose)
    return 0
