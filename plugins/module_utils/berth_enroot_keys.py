"""The enroot.conf keys Berth understands, with the kind of value each takes,
and the range of each count.

Kept equal to runtime/berth/config.py's KEYS, HOOK_VARIABLE_PREFIXES and
RANGES by a unit test, so the module that writes enroot.conf and the
runtime that reads it cannot drift apart.
"""

TRUE = ("1", "true", "yes", "y")
FALSE = ("0", "false", "no", "n")

PATH, TEXT, FLAG, COUNT = "path", "text", "flag", "count"

KEYS = {
    "ENROOT_LIBRARY_PATH": PATH,
    "ENROOT_SYSCONF_PATH": PATH,
    "ENROOT_RUNTIME_PATH": PATH,
    "ENROOT_CONFIG_PATH": PATH,
    "ENROOT_CACHE_PATH": PATH,
    "ENROOT_DATA_PATH": PATH,
    "ENROOT_TEMP_PATH": PATH,
    "ENROOT_GZIP_PROGRAM": TEXT,
    "ENROOT_SQUASH_OPTIONS": TEXT,
    "ENROOT_ROOTFS_WRITABLE": FLAG,
    "ENROOT_REMAP_ROOT": FLAG,
    "ENROOT_UNSHARE_NET": FLAG,
    "ENROOT_UNSHARE_PID": FLAG,
    "ENROOT_UNSHARE_IPC": FLAG,
    "ENROOT_UNSHARE_UTS": FLAG,
    "ENROOT_MAX_PROCESSORS": COUNT,
    "ENROOT_MAX_CONNECTIONS": COUNT,
    "ENROOT_CONNECT_TIMEOUT": COUNT,
    "ENROOT_TRANSFER_TIMEOUT": COUNT,
    "ENROOT_TRANSFER_RETRIES": COUNT,
    "ENROOT_LOGIN_SHELL": FLAG,
    "ENROOT_ALLOW_SUPERUSER": FLAG,
    "ENROOT_ALLOW_HTTP": FLAG,
    "ENROOT_MOUNT_HOME": FLAG,
    "ENROOT_RESTRICT_DEV": FLAG,
    "ENROOT_FORCE_OVERRIDE": FLAG,
    "ENROOT_NATIVE_OVERLAYFS": FLAG,
    "BERTH_IMAGE_STORE": PATH,
    "BERTH_IMAGE_STORE_SOCKET": PATH,
    "BERTH_IMAGE_STORE_OWNER": TEXT,
    "BERTH_IMAGE_STORE_TIMEOUT": COUNT,
    "BERTH_IMAGE_STORE_LOCAL": PATH,
    # a size (runtime/berth/units.py), checked by the role's preflight
    "BERTH_IMAGE_STORE_LOCAL_MAX_SIZE": TEXT,
    # hooks' site defaults and settings (hooks/80-slurm.sh, 85-aws_ofi_nccl.sh,
    # 86-mpi.sh, 87-ssh.sh, 88-cxi.sh read them)
    "BERTH_HOOK_SLURM_ENABLE": FLAG,
    "BERTH_HOOK_AWS_OFI_NCCL_ENABLE": FLAG,
    "BERTH_NCCL_PLUGIN_DIR": PATH,
    "BERTH_HOOK_MPI_ENABLE": FLAG,
    "BERTH_MPI_LIBRARY": PATH,
    "BERTH_HOOK_SSH_ENABLE": FLAG,
    "BERTH_HOOK_SSH_PORT": COUNT,
    "BERTH_HOOK_CXI_ENABLE": FLAG,
    "BERTH_CXI_ENVIRONMENT": PATH,
    # a size such as 10G (runtime/berth/build/runmounts.py)
    "BERTH_BUILD_ADD_MAX_SIZE": TEXT,
    "BERTH_BUILD_CACHE_MAX_SIZE": TEXT,
    # a directory, usually with $(id -u) or ${SCRATCH} in it (runtime/berth/site/edfbuild.py)
    "BERTH_EDF_BUILD_PATH": TEXT,
    # a colon-separated list of directories (runtime/berth/container/cdi.py)
    "BERTH_CDI_SPEC_DIRS": TEXT,
    "BERTH_NVIDIA_CDI": FLAG,
    # the network tools' environment, as enroot.conf may set it
    "http_proxy": TEXT,
    "https_proxy": TEXT,
    "all_proxy": TEXT,
    "no_proxy": TEXT,
    "SSL_CERT_FILE": PATH,
    "SSL_CERT_DIR": PATH,
}

# the prefixes of keys that are the hooks' variables (NVIDIA_VISIBLE_DEVICES,
# MELLANOX_VISIBLE_DEVICES, ...): any such key that is a variable name, text
HOOK_VARIABLE_PREFIXES = ("MELLANOX_", "NVIDIA_")

# (low, high) of each count, both inclusive
RANGES = {
    "ENROOT_CONNECT_TIMEOUT": (0, 86400),
    "ENROOT_TRANSFER_TIMEOUT": (0, 86400),
    "ENROOT_TRANSFER_RETRIES": (0, 100),
    "ENROOT_MAX_CONNECTIONS": (1, 256),
    "ENROOT_MAX_PROCESSORS": (1, 4096),
    "BERTH_IMAGE_STORE_TIMEOUT": (1, 86400),
    "BERTH_HOOK_SSH_PORT": (1024, 65535),
}


def conf_value(key, value):
    """Return `value` as enroot.conf text for `key`; ValueError names the key."""
    kind = KEYS.get(key)
    if kind is None and key.startswith(HOOK_VARIABLE_PREFIXES) and key.isascii() \
            and key.isidentifier():
        kind = TEXT
    if kind is None:
        raise ValueError(f"unknown enroot.conf key '{key}'")
    if kind == FLAG:
        return _flag(key, value)
    if kind == COUNT:
        return _count(key, value)
    text = str(value)
    # The runtime reads one line per key, and a '#' that starts a word
    # starts a comment; the value is written as given, shell and all
    # ($(id -u), ${VAR:-word}, ~/), for the runtime to read as enroot does.
    if not text or "\n" in text or "#" in text:
        raise ValueError(f"{key}: value must be one non-empty line without '#', got {text!r}")
    if kind == PATH and not text.startswith(("/", "$", "~")):
        raise ValueError(f"{key}: expected an absolute path, got {text!r}")
    return text


def _flag(key, value):
    if isinstance(value, bool):
        return "yes" if value else "no"
    text = str(value).strip().lower()
    if text in TRUE:
        return "yes"
    if text in FALSE:
        return "no"
    raise ValueError(f"{key}: expected yes or no, got {value!r}")


def _count(key, value):
    # bool is an int in Python; 'yes' is no number of connections.
    if str(value).startswith("$(") and not isinstance(value, bool):
        return str(value)  # enroot's own $(nproc): the runtime reads it and checks the range
    if isinstance(value, bool) or not str(value).strip().isdigit():
        raise ValueError(f"{key}: expected a whole number, got {value!r}")
    number = int(str(value).strip())
    low, high = RANGES[key]
    if not low <= number <= high:
        raise ValueError(f"{key}: expected a whole number from {low} to {high}, got {value!r}")
    return str(number)
