"""Container Device Interface (CDI) devices: `berth start --device NAME`.

NAME is VENDOR/CLASS=DEVICE (`nvidia.com/gpu=0`): a device of a CDI spec,
a JSON (`*.json`) or YAML (`*.yaml`, `*.yml`) file in a directory of
BERTH_CDI_SPEC_DIRS (enroot.conf; default /etc/cdi:/var/run/cdi). A spec
has a `kind` (VENDOR/CLASS), `devices` (each a `name` and its
`containerEdits`) and may have `containerEdits` of its own, applied once
when any of its devices is asked for. Of the edits, Berth applies, inside
the container's user namespace:
  env          KEY=VALUE strings, under the start's own -e
  deviceNodes  each `path` in the container bound from `hostPath` (default
               the same path) on the node, which must be a device node:
               bound, never made
  mounts       `hostPath` bound at `containerPath` with the spec's
               `options` (the flags of berth start -m)
  hooks        each with the container's OCI state (JSON) on its stdin,
               in the order of OCI's stages, a stage's in the spec's order:
               prestart and createRuntime, then createContainer, then
               startContainer, all after hooks.d's, in the container's
               namespaces, before the root turns read-only and before the
               command (Berth has no separate create and start); a failure
               fails the start. poststart: on the host side once the
               command (or --detach's keeper) runs, before --detach's pid
               line; a failure is a warning, as OCI has it. A hook's
               `timeout` (seconds) is enforced: one that has not finished
               is killed with its process group, and fails the start (a
               poststart one: a warning). poststop: on the host side once
               the container has ended (its command, or --detach's keeper
               stopped, or a start that failed after its hooks began),
               before berth exits; a failure is a warning.

Trust: a spec is read only where root alone could have written it: a
regular file owned by root, not writable by group or others, in a
directory for which the same holds all the way up (a sticky directory such
as /tmp passes). Another spec is skipped with a warning naming it, as is a
malformed one: the others still count. A name no spec has (the line lists
the kinds there are), one two specs of one directory claim, a device
node, mount source or hook program missing on the node: one line, and
nothing is started. A name in specs of two directories is the later
directory's, as CDI orders them (/var/run/cdi, where NVIDIA's refresh
service writes its spec, over /etc/cdi).

NVIDIA's spec (`nvidia-ctk cdi generate`, kind nvidia.com/gpu, devices
named by index, GPU-<uuid>, MIG-<uuid> and `all`) is also the GPU path of
hooks/90-nvidia.sh: unless BERTH_NVIDIA_CDI=no, a start with hooks lists
the names of that kind's devices to them (BERTH_NVIDIA_CDI_GPUS); the hook,
which alone decides which GPUs a job gets, writes the chosen ones' names
to BERTH_CDI_DEVICES, and the runtime applies their edits as it does
--device's, after hooks.d's (container/launch.py). Where no such spec is,
the hook finds the driver's files itself.
"""

import json
import os
import re
import stat
import typing

from berth.container import mounts
from berth.errors import BerthError

_KIND = re.compile(r"[A-Za-z0-9][A-Za-z0-9.-]*/[A-Za-z0-9][A-Za-z0-9._-]*")
_DEVICE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]*")
# the OCI hook stages that come before the container's command, in the
# order they run (prestart is createRuntime's old name), and the two after
_STAGES = {"prestart": 0, "createRuntime": 0, "createContainer": 1, "startContainer": 2}
POSTSTART = "poststart"
POSTSTOP = "poststop"
_SUFFIXES = (".json", ".yaml", ".yml")
NVIDIA_GPU = "nvidia.com/gpu"  # the kind of NVIDIA's spec, which hooks/90-nvidia.sh asks for


class Hook(typing.NamedTuple):
    path: str
    args: tuple  # argv, its first the program's name (OCI's)
    env: tuple  # KEY=VALUE strings, the hook's whole environment
    origin: str  # what asked for it, for messages
    stage: str  # its OCI hookName
    timeout: int = None  # seconds it may take, or None


class Devices(typing.NamedTuple):
    """What the devices asked for come to, checked against the node."""

    env: dict
    mounts: list  # mounts.Mount
    hooks: list  # Hook, those before the command, in the order they run
    poststart: list  # Hook, those once the command runs
    poststop: list  # Hook, those once the container has ended


class _Device(typing.NamedTuple):
    spec: str  # the spec file's path
    edits: tuple  # (the spec's containerEdits, the device's)


def resolve(names, spec_dirs, warn):
    """The Devices of `names` (VENDOR/CLASS=DEVICE), from the specs in
    `spec_dirs` (a colon-separated list); `warn` takes each skipped spec's line."""
    return resolve_known(names, load(spec_dirs, warn))


def of_kind(known, kind):
    """The part of `known` (load's) whose names are of `kind` (VENDOR/CLASS)."""
    return {name: claims for name, claims in known.items()
            if name.partition("=")[0] == kind}


def resolve_known(names, known):
    """The Devices of `names`, from specs already read (load's)."""
    env, found, hooks = {}, [], []
    applied = set()
    for name in names:
        device = _find(known, name)
        for index, edits in enumerate(device.edits):
            if index == 0 and device.spec in applied:
                continue  # the spec's own edits, once
            applied.add(device.spec)
            origin = f"CDI device {name} ({device.spec})"
            _add_edits(edits, origin, env=env, found=found, hooks=hooks)
    before = sorted((h for h in hooks if h.stage in _STAGES), key=lambda h: _STAGES[h.stage])
    return Devices(env=env, mounts=found, hooks=before,
                   poststart=[h for h in hooks if h.stage == POSTSTART],
                   poststop=[h for h in hooks if h.stage == POSTSTOP])


def is_name(name):
    """Is `name` a CDI device name, VENDOR/CLASS=DEVICE?"""
    kind, _, device = name.partition("=")
    return bool(_KIND.fullmatch(kind) and _DEVICE.fullmatch(device))


def _find(known, name):
    if not is_name(name):
        raise BerthError(f"--device {name}: not a CDI device name (VENDOR/CLASS=DEVICE, "
                         f"as nvidia.com/gpu=0)")
    claims = known.get(name, [])
    if not claims:
        kinds = sorted({n.partition("=")[0] for n in known}) or ["none"]
        raise BerthError(f"--device {name}: no CDI spec on this node has it (kinds here: "
                         f"{', '.join(kinds)})")
    if len(claims) > 1:
        raise BerthError(f"--device {name}: claimed by two CDI specs of one directory, "
                         f"{claims[0].spec} and {claims[1].spec}")
    return claims[0]


# ---------------------------------------------------------------- reading specs


def load(spec_dirs, warn):
    """{device name: [_Device, ...]} of the trusted, well-formed specs in
    `spec_dirs`; `warn` takes each skipped spec's line."""
    known = {}
    for directory in (d for d in spec_dirs.split(":") if d):
        known.update(_load_directory(directory, warn))  # a later directory's names win
    return known


def _load_directory(directory, warn):
    """{device name: [_Device, ...]} of the trusted, well-formed specs in
    `directory`: a name with two claims is a conflict within it."""
    try:
        entries = sorted(os.listdir(directory))
    except FileNotFoundError:
        return {}
    except OSError as e:
        warn(f"CDI spec directory {directory}: {e.strerror}: skipped")
        return {}
    why = _untrusted_dir(directory)
    if why:
        warn(f"CDI spec directory {directory}: {why}: skipped")
        return {}
    here = {}
    for entry in entries:
        if entry.endswith(_SUFFIXES):
            path = os.path.join(directory, entry)
            try:
                for name, device in _read_spec(path):
                    here.setdefault(name, []).append(device)
            except BerthError as e:
                warn(f"{e}: skipped")
    return here


def _untrusted(st):
    if st.st_uid != 0:
        return f"owned by uid {st.st_uid}, not root"
    if st.st_mode & 0o022 and not (stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX):
        return f"writable by others than root (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def _untrusted_dir(directory):
    path = os.path.abspath(directory)
    while True:
        why = _untrusted(os.stat(path))
        if why:
            return why if path == os.path.abspath(directory) else f"{path} is {why}"
        if path == "/":
            return None
        path = os.path.dirname(path)


def _read_spec(path):
    """[(device name, _Device)] of the spec at `path`; BerthError naming it
    when it cannot be trusted or read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as e:
        raise BerthError(f"CDI spec {path}: {e.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        why = "not a regular file" if not stat.S_ISREG(st.st_mode) else _untrusted(st)
        if why:
            raise BerthError(f"CDI spec {path}: {why}")
        text = f.read(1 << 20)
    spec = _parse(path, text)
    if not isinstance(spec, dict):
        raise BerthError(f"CDI spec {path}: not a mapping")
    kind = spec.get("kind")
    if not isinstance(kind, str) or not _KIND.fullmatch(kind):
        raise BerthError(f"CDI spec {path}: 'kind' must be VENDOR/CLASS, not {kind!r}")
    common = _edits(spec.get("containerEdits", {}), path, "containerEdits")
    devices = spec.get("devices")
    if not isinstance(devices, list) or not devices:
        raise BerthError(f"CDI spec {path}: 'devices' must be a list of devices")
    found = []
    for index, device in enumerate(devices):
        where = f"devices[{index}]"
        name = device.get("name") if isinstance(device, dict) else None
        if not isinstance(name, str) or not _DEVICE.fullmatch(name):
            raise BerthError(f"CDI spec {path}: {where}: 'name' must be a device name")
        edits = _edits(device.get("containerEdits", {}), path, f"{where}.containerEdits")
        found.append((f"{kind}={name}", _Device(spec=path, edits=(common, edits))))
    return found


def _parse(path, text):
    try:
        if path.endswith(".json"):
            return json.loads(text)
        import yaml  # only for a YAML spec
        # (libyaml's loader where it is there: NVIDIA's spec has hundreds of mounts)
        return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except ValueError as e:  # json's errors, and UnicodeDecodeError
        raise BerthError(f"CDI spec {path}: not valid JSON: {e}") from None
    except Exception as e:  # yaml.YAMLError, and what its parser raises for odd input
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise BerthError(f"CDI spec {path}: not valid YAML: {first}") from None


_EDIT_LISTS = {"env": str, "deviceNodes": dict, "mounts": dict, "hooks": dict}


def _edits(edits, path, where):
    """containerEdits, checked for shape: {key: list}."""
    if not isinstance(edits, dict):
        raise BerthError(f"CDI spec {path}: {where} must be a mapping")
    for key, value in edits.items():
        kind = _EDIT_LISTS.get(key)
        if kind is None:
            continue  # (additionalGIDs, intelRdt, netDevices: not applied)
        if not isinstance(value, list) or not all(isinstance(v, kind) for v in value):
            raise BerthError(f"CDI spec {path}: {where}.{key} must be a list of "
                             f"{'strings' if kind is str else 'mappings'}")
    return edits


# ---------------------------------------------------------------- the edits


def _add_edits(edits, origin, *, env, found, hooks):
    for pair in edits.get("env", []):
        key, eq, value = pair.partition("=")
        if not eq or not key:
            raise BerthError(f"{origin}: env entry {pair!r} is not KEY=VALUE")
        env[key] = value
    for node in edits.get("deviceNodes", []):
        found.append(_device_node(node, origin))
    for mount in edits.get("mounts", []):
        found.append(_mount(mount, origin))
    for hook in edits.get("hooks", []):
        hooks.append(_hook(hook, origin))


def _absolute(entry, key, origin, default=None):
    value = entry.get(key, default)
    if not isinstance(value, str) or not value.startswith("/"):
        raise BerthError(f"{origin}: '{key}' must be an absolute path, not {value!r}")
    return value


def _device_node(node, origin):
    path = _absolute(node, "path", origin)
    host = _absolute(node, "hostPath", origin, default=path)
    try:
        mode = os.stat(host).st_mode
    except OSError:
        mode = 0
    if not (stat.S_ISCHR(mode) or stat.S_ISBLK(mode)):
        raise BerthError(f"{origin}: device node {host} is missing on this node")
    return mounts.Mount(source=host, target=path, fstype="none",
                        options=("bind", "nosuid", "noexec", "x-create=file"), origin=origin)


def _mount(mount, origin):
    host = _absolute(mount, "hostPath", origin)
    target = _absolute(mount, "containerPath", origin)
    options = mount.get("options", [])
    if not isinstance(options, list) or not all(isinstance(o, str) for o in options):
        raise BerthError(f"{origin}: mount {target}: 'options' must be a list of strings")
    unknown = [o for o in options if o not in mounts.FLAGS - {"sqsh", "x-move", "x-detach"}]
    if unknown:
        raise BerthError(f"{origin}: mount {target}: unknown option '{unknown[0]}'")
    if not os.path.exists(host):
        raise BerthError(f"{origin}: mount source {host} is missing on this node")
    binding = () if {"bind", "rbind"} & set(options) else ("rbind",)
    return mounts.Mount(source=host, target=target, fstype="none",
                        options=(*binding, *options, "x-create=auto"), origin=origin)


def _hook(hook, origin):
    path = _absolute(hook, "path", origin)
    stage = hook.get("hookName")
    if stage not in (*_STAGES, POSTSTART, POSTSTOP):
        raise BerthError(f"{origin}: hook {path}: stage {stage!r} is not one of OCI's "
                         f"({', '.join((*_STAGES, POSTSTART, POSTSTOP))})")
    timeout = hook.get("timeout")
    if timeout is not None and (type(timeout) is not int or timeout <= 0):
        raise BerthError(f"{origin}: hook {path}: 'timeout' must be a number of seconds "
                         f"above 0, not {timeout!r}")
    args, env = hook.get("args", [path]), hook.get("env", [])
    for key, value in (("args", args), ("env", env)):
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise BerthError(f"{origin}: hook {path}: '{key}' must be a list of strings")
    if not os.access(path, os.X_OK) or not os.path.isfile(path):
        raise BerthError(f"{origin}: hook program {path} is missing on this node")
    return Hook(path, tuple(args or [path]), env=tuple(env), origin=origin, stage=stage,
                timeout=timeout)
