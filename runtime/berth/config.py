"""enroot-compatible configuration: defaults, enroot.conf files, environment.

Precedence, lowest first: built-in defaults, `$ENROOT_SYSCONF_PATH/enroot.conf`,
`$ENROOT_SYSCONF_PATH/enroot.conf.d/*.conf` (sorted), the process environment.
A file line is `KEY VALUE` (or `KEY=VALUE`); a line starting with `#` is a
comment. A value is read as enroot's shell reads it (confvalue): quotes,
`$VAR`, `${VAR:-word}`, `~/`, `$(id -u)`, from the environment, the keys set
before it, and UID and USER (the caller's), so a site can write per-user
paths. A value that reads as empty, or names an unset variable, leaves the
key as it was, as in enroot.
"""

import os
import pwd
import re
import stat

from berth import confvalue, units
from berth.errors import BerthError

_TRUE = {"1", "true", "yes", "y"}
_FALSE = {"0", "false", "no", "n"}
# KEY, then blanks with at most one `=` (enroot splits on IFS=" \t="), VALUE
_LINE = re.compile(r"([^ \t=]*)[ \t]*=?[ \t]*(.*)")


def _xdg(env, name, fallback):
    value = env.get(name)
    return value if value else fallback


def _defaults(env):
    uid = os.getuid()
    home = env.get("HOME") or os.path.expanduser("~")
    runtime_dir = _xdg(env, "XDG_RUNTIME_DIR", f"/run/user/{uid}")
    if "XDG_RUNTIME_DIR" not in env and not os.access(runtime_dir, os.W_OK):
        tmp = env.get("TMPDIR") or "/tmp"
        # (a new name, made by safedir.ensure with mkdir, is found here next time;
        # os.urandom is what secrets.token_hex reads, without the hashlib, hmac
        # and random that importing secrets costs every start)
        runtime_dir = (private_runtime_dirs(tmp, uid)
                       or [os.path.join(tmp, f"berth-{uid}.{os.urandom(8).hex()}")])[0]
    return {
        "ENROOT_LIBRARY_PATH": os.path.dirname(os.path.realpath(__file__)),
        "ENROOT_SYSCONF_PATH": "/etc/enroot",
        "ENROOT_RUNTIME_PATH": f"{runtime_dir}/enroot",
        "ENROOT_CONFIG_PATH": f"{_xdg(env, 'XDG_CONFIG_HOME', home + '/.config')}/enroot",
        "ENROOT_CACHE_PATH": f"{_xdg(env, 'XDG_CACHE_HOME', home + '/.cache')}/enroot",
        "ENROOT_DATA_PATH": f"{_xdg(env, 'XDG_DATA_HOME', home + '/.local/share')}/enroot",
        "ENROOT_TEMP_PATH": env.get("TMPDIR") or "/tmp",
        # (ISA-L's igzip decompresses about 2.5x as fast as pigz)
        "ENROOT_GZIP_PROGRAM": next(filter(_which, ("igzip", "pigz")), "gzip"),
        # zstd rather than enroot's lzo: RHEL 9's mksquashfs lacks lzo.
        "ENROOT_SQUASH_OPTIONS": "-comp zstd -Xcompression-level 3",
        "ENROOT_ROOTFS_WRITABLE": "no",
        "ENROOT_REMAP_ROOT": "no",
        "ENROOT_UNSHARE_NET": "no",
        "ENROOT_UNSHARE_PID": "no",
        "ENROOT_UNSHARE_IPC": "no",
        "ENROOT_UNSHARE_UTS": "no",
        "ENROOT_MAX_PROCESSORS": str(os.cpu_count() or 1),
        "ENROOT_MAX_CONNECTIONS": "10",
        "ENROOT_CONNECT_TIMEOUT": "30",
        "ENROOT_TRANSFER_TIMEOUT": "60",  # a stall timeout (enroot: 0, the whole transfer)
        "ENROOT_TRANSFER_RETRIES": "0",
        "ENROOT_LOGIN_SHELL": "yes",
        "ENROOT_ALLOW_SUPERUSER": "no",
        "ENROOT_ALLOW_HTTP": "no",
        "ENROOT_MOUNT_HOME": "no",
        "ENROOT_RESTRICT_DEV": "no",
        "ENROOT_FORCE_OVERRIDE": "no",
        # no: an image's writable overlay is always fuse-overlayfs's
        "ENROOT_NATIVE_OVERLAYFS": "yes",
        # Berth's own: the shared image store (store/); an empty path is none.
        "BERTH_IMAGE_STORE": "",
        "BERTH_IMAGE_STORE_SOCKET": "/run/berth-store.sock",
        "BERTH_IMAGE_STORE_OWNER": "berth-store",
        # how long a client waits for the store's answer before importing
        # into its own cache (the service's import may run for hours)
        "BERTH_IMAGE_STORE_TIMEOUT": "3600",
        # a node-local directory for copies of the store's entries; empty: none
        "BERTH_IMAGE_STORE_LOCAL": "",
        # the most those copies hold together (a size: 200G); empty: no cap
        # but the free-space floor
        "BERTH_IMAGE_STORE_LOCAL_MAX_SIZE": "",
        # the site's default for the Slurm hook (hooks/80-slurm.sh), which
        # reads it: a job's environment, then an EDF annotation, override it
        "BERTH_HOOK_SLURM_ENABLE": "no",
        # the same for the NCCL network plugin hook (hooks/85-aws_ofi_nccl.sh),
        # and the site's directory of its plugins, one directory per variant
        # (cuda12/, ...); empty: the site has none
        "BERTH_HOOK_AWS_OFI_NCCL_ENABLE": "no",
        "BERTH_NCCL_PLUGIN_DIR": "",
        # the same for the MPI replacement hook (hooks/86-mpi.sh), and the
        # node's MPICH-ABI C library it binds; empty: none
        "BERTH_HOOK_MPI_ENABLE": "no",
        "BERTH_MPI_LIBRARY": "",
        # the same for the SSH hook (hooks/87-ssh.sh), and the port its
        # server listens on where the job or EDF names none
        "BERTH_HOOK_SSH_ENABLE": "no",
        "BERTH_HOOK_SSH_PORT": "15263",
        # the same for the Slingshot hook (hooks/88-cxi.sh), and a file of
        # the libfabric provider's FI_* settings it adds; empty: none
        "BERTH_HOOK_CXI_ENABLE": "no",
        "BERTH_CXI_ENVIRONMENT": "",
        # the most berth build's RUN --mount=type=cache directories hold
        # together (build/runmounts.py): the least recently used go past it
        "BERTH_BUILD_CACHE_MAX_SIZE": "10G",
        # where `berth edf show` puts an EDF's built image (its
        # `containerfile`) for every node of a job to read: a directory of
        # the user's own on a filesystem the nodes share; empty: the image
        # stays in the user's ENROOT_CACHE_PATH (site/edfbuild.py)
        "BERTH_EDF_BUILD_PATH": "",
        # the most one berth build ADD of a URL fetches (build/fetch.py)
        "BERTH_BUILD_ADD_MAX_SIZE": "10G",
        # where `berth start --device` finds CDI specs (container/cdi.py)
        "BERTH_CDI_SPEC_DIRS": "/etc/cdi:/var/run/cdi",
        # whether the nvidia hook takes a job's GPUs from NVIDIA's CDI spec
        # (nvidia.com/gpu) where the node has one (container/cdi.py)
        "BERTH_NVIDIA_CDI": "yes",
    }


def private_runtime_dirs(tmp, uid):
    """The runtime directories of `uid` where it has no /run/user/UID: in
    `tmp`, world-writable, each `berth-UID.RANDOM` that is a directory of
    its own, 0700, in name order. No other user can guess such a name to
    take or block it first (as /tmp/berth-UID could be, by a link, a
    directory, a file or a FIFO), and any of that form that is not the
    user's own is passed over. Two first starts at once may make one each:
    both are then looked in for running starts (container/verbs.running)."""
    prefix = f"berth-{uid}."
    try:
        names = sorted(n for n in os.listdir(tmp) if n.startswith(prefix))
    except OSError:
        return []
    found = []
    for name in names:
        try:
            st = os.lstat(os.path.join(tmp, name))
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode) and st.st_uid == uid and not st.st_mode & 0o077:
            found.append(os.path.join(tmp, name))
    return found


def _which(program):
    return any(
        os.access(os.path.join(d, program), os.X_OK)
        for d in os.environ.get("PATH", "/usr/bin:/bin").split(":")
    )


#: enroot.conf keys that are the network tools' environment rather than
#: settings of the runtime's own (enroot exports them for curl): set in a file
#: or the environment, they are put in berth's environment, where the
#: registry client reads them (proxies, and the CA certificates it trusts).
NETWORK_ENVIRONMENT = ("http_proxy", "https_proxy", "all_proxy", "no_proxy",
                       "SSL_CERT_FILE", "SSL_CERT_DIR")

#: Every key enroot.conf may set (but HOOK_VARIABLE_PREFIXES's); anything
#: else in a file is an error.
_SOME_DEFAULTS = _defaults({"HOME": "/"})
KEYS = frozenset(_SOME_DEFAULTS) | frozenset(NETWORK_ENVIRONMENT)

#: The keys that are yes or no (their defaults say so).
FLAGS = frozenset(key for key, value in _SOME_DEFAULTS.items() if value in ("yes", "no"))

#: The prefixes of enroot.conf keys that are variables for the hooks rather
#: than settings (NVIDIA_VISIBLE_DEVICES, MELLANOX_VISIBLE_DEVICES, ...), as
#: enroot takes them: the environment wins over the file, the hooks run with
#: them set (enroot's NVIDIA and Mellanox hooks prefer such a variable to the
#: container's), and the container's environment does not get them.
HOOK_VARIABLE_PREFIXES = ("MELLANOX_", "NVIDIA_")
_VARIABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def is_hook_variable(key):
    """Whether the enroot.conf key `key` is a variable for the hooks."""
    return key.startswith(HOOK_VARIABLE_PREFIXES)

#: enroot's keys that Berth refuses in a file, each with why: a site that
#: sets one expects an effect Berth cannot give.
REFUSED = {
    "ENROOT_BUNDLE_ALL": "Berth makes no bundles (enroot bundle is not supported)",
    "ENROOT_BUNDLE_CHECKSUM": "Berth makes no bundles (enroot bundle is not supported)",
    "ENROOT_ZSTD_OPTIONS": "Berth compresses nothing with zstd (it only decompresses zstd "
                           "layers; the squashfs compression is ENROOT_SQUASH_OPTIONS)",
}


def text_lines(path, skip=0, added_by=None):
    """Yield (number, line) of the UTF-8 text file `path`, from byte `skip`
    on (what `added_by` appended); a file that cannot be read, or a line
    that is not UTF-8, is one BerthError naming the file (and the line)."""
    try:
        with open(path, "rb") as f:
            f.seek(skip)
            lines = f.read().splitlines()
    except OSError as e:
        raise BerthError(f"{path}: cannot read: {e.strerror}") from None
    for number, raw in enumerate(lines, 1):
        try:
            yield number, raw.decode("utf-8")
        except UnicodeDecodeError:
            where = f"{path} (a line {added_by} added)" if added_by else f"{path}:{number}"
            raise BerthError(f"{where}: not UTF-8 text") from None


def parse_file(path, scope):
    """Yield (key, value) from one enroot.conf file, each value read with
    `scope`'s variables; a value that reads as nothing yields no pair."""
    for lineno, raw in text_lines(path):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, text = _LINE.fullmatch(line).groups()
        if key in REFUSED:
            raise BerthError(f"{path}:{lineno}: {key} is not supported: {REFUSED[key]}")
        if key not in KEYS and not is_hook_variable(key):
            raise BerthError(f"{path}:{lineno}: unknown configuration key '{key}'")
        if not _VARIABLE.fullmatch(key):  # (enroot's `export` fails on it)
            raise BerthError(f"{path}:{lineno}: {key}: not a variable name")
        try:
            value = confvalue.read(text, scope)
        except confvalue.Refused as e:
            raise BerthError(f"{path}:{lineno}: {key}: {e}") from None
        if value:
            _check_value(f"{path}:{lineno}: {key}", key, value)
            yield key, value



def _check_value(where, key, value):
    """Refuse a file's value that the key's use would refuse, now, naming
    `where` (the file, line and key): a site's mistake is found by every
    command, not by the first that reads the key."""
    if key in FLAGS and value.strip().lower() not in _TRUE | _FALSE:
        raise BerthError(f"{where}: expected yes or no, got {_shown(value)}")
    if key in RANGES:
        number_in_range(where, value, *RANGES[key])


class Config:
    """Resolved ENROOT_* settings for one invocation."""

    def __init__(self, values):
        self._values = values

    def __getitem__(self, key):
        return self._values[key]

    def items(self):
        return self._values.items()

    def network_environment(self):
        """The NETWORK_ENVIRONMENT keys set in a file or the environment."""
        return {key: self._values[key] for key in NETWORK_ENVIRONMENT if self._values.get(key)}

    def flag(self, key):
        value = self._values[key].strip().lower()
        if value in _TRUE:
            return True
        if value in _FALSE:
            return False
        raise BerthError(f"{key}: expected yes or no, got '{self._values[key]}'")

    def number(self, key):
        """The whole number `key` holds, within RANGES where it has one."""
        return number_in_range(key, self._values[key], *RANGES.get(key, (None, None)))

    def size(self, key):
        """The size in bytes `key` holds (units.size's form: 10G)."""
        text = self._values[key].strip()
        found = units.size(text)
        if found is None:
            raise BerthError(f"{key}={text}: expected a size such as 10G")
        return found


def number_in_range(name, text, low, high):
    """The whole number (ASCII digits, a minus sign allowed) the setting
    `name` holds as `text`, from `low` to `high` where they are not None;
    one line naming the setting otherwise."""
    digits = text.strip()
    value = units.whole(digits.removeprefix("-"))
    if value is None:
        raise BerthError(f"{name}: expected a number, got {_shown(text)}")
    value = -value if digits.startswith("-") else value
    if low is not None and value < low:
        raise BerthError(f"{name}: expected {low} or more, got {_shown(text)}")
    if high is not None and value > high:
        raise BerthError(f"{name}: expected at most {high}, got {_shown(text)}")
    return value


#: The numeric keys' ranges (low, high), both inclusive: beyond them a value
#: is a mistake that would otherwise surface far away (a socket timeout past
#: what the C library takes, a connection pool filled for ever).
RANGES = {
    "ENROOT_CONNECT_TIMEOUT": (0, 86400),  # seconds; 0: no limit
    "ENROOT_TRANSFER_TIMEOUT": (0, 86400),  # seconds without a byte; 0: no limit
    "ENROOT_TRANSFER_RETRIES": (0, 100),
    "ENROOT_MAX_CONNECTIONS": (1, 256),
    "ENROOT_MAX_PROCESSORS": (1, 4096),
    "BERTH_IMAGE_STORE_TIMEOUT": (1, 86400),  # seconds
    "BERTH_HOOK_SSH_PORT": (1024, 65535),  # an ordinary user's server
}


def _shown(value):
    """A setting's value as an error line quotes it: at most 40 characters
    (the CLI escapes control characters in every error: errors.one_line)."""
    return f"'{value[:40]}...'" if len(value) > 40 else f"'{value}'"


def _caller(env):
    uid = os.getuid()
    try:
        user = pwd.getpwuid(uid).pw_name
    except KeyError:
        user = env.get("USER", str(uid))
    return {"UID": str(uid), "USER": user}


def files_in(directory, suffix):
    """Sorted paths of the regular files named *`suffix` in `directory`
    (none when it is missing or unreadable; dot files are skipped)."""
    try:
        names = sorted(n for n in os.listdir(directory)
                       if n.endswith(suffix) and not n.startswith("."))
    except OSError:
        return []
    return [p for p in (f"{directory}/{n}" for n in names) if os.path.isfile(p)]


def load(env=None):
    """Resolve the configuration from files and the environment `env`."""
    env = dict(os.environ if env is None else env)
    env.update(_caller(env))
    values = _defaults(env)
    sysconf = env.get("ENROOT_SYSCONF_PATH") or values["ENROOT_SYSCONF_PATH"]
    files = [f"{sysconf}/enroot.conf", *files_in(f"{sysconf}/enroot.conf.d", ".conf")]
    scope = {**env, **values}  # (a key a line sets, the lines after it read)
    for path in files:
        if os.path.isfile(path):
            for key, value in parse_file(path, scope):
                values[key] = scope[key] = value
    for key in KEYS | {key for key in values if is_hook_variable(key)}:
        if env.get(key):
            values[key] = env[key]
    values["ENROOT_SYSCONF_PATH"] = sysconf
    return Config(values)
