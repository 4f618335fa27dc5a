"""The image configuration kept inside every imported root filesystem.

`/etc/berth/image.json` is the contract with `berth start` and the SPANK
plugin: {"env", "entrypoint", "cmd", "workdir", "user", "source", "digest"}.
`/etc/environment` and `/etc/rc` carry the same facts the way enroot does,
so a plain squashfs is self-describing for enroot users too.
"""

import json
import os
import shlex

from berth.errors import BerthError
from berth.rootpath import resolve

IMAGE_JSON = "etc/berth/image.json"
SQUASHFS_MAGIC = b"hsqs"  # the first four bytes of every squashfs, so of every image
# uname -m names to the GOARCH names registries and SIF files use (others are the same)
_GOARCH = {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm", "i686": "386",
           "i386": "386"}
_KEYS = {"env": list, "entrypoint": (list, type(None)), "cmd": (list, type(None)),
         "workdir": str, "user": str, "source": str, "digest": str}


def goarch(machine=None):
    """The GOARCH name of `machine` (a uname -m name; this machine's by default)."""
    machine = machine or os.uname().machine
    return _GOARCH.get(machine, machine)


def from_oci(config, source, digest):
    """Our contract from an OCI/Docker image config blob (parsed JSON);
    a field of the wrong type is refused, naming it."""
    where = f"the image config of {source}"
    if not isinstance(config, dict):
        raise BerthError(f"{where} is not a JSON object")
    settings = config.get("config") or {}
    if not isinstance(settings, dict):
        raise BerthError(f"{where}: 'config' is {_kind(settings)}, not an object")

    def field(key, kind):
        value = settings.get(key)
        if value is None:
            return None
        if kind is str:
            if not isinstance(value, str):
                raise BerthError(f"{where}: config.{key} is {_kind(value)}, not a string")
        elif not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
            raise BerthError(f"{where}: config.{key} is {_kind(value)}, not a list of "
                             "strings")
        # No process takes a NUL in its arguments or environment, and
        # /etc/environment holds one variable a line.
        if any("\0" in v or (key == "Env" and "\n" in v)
               for v in ([value] if kind is str else value)):
            raise BerthError(f"{where}: config.{key} holds a NUL"
                             f"{' or newline' if key == 'Env' else ''} character")
        return value

    return {
        "env": list(field("Env", list) or []),
        "entrypoint": field("Entrypoint", list) or None,
        "cmd": field("Cmd", list) or None,
        "workdir": field("WorkingDir", str) or "",
        "user": field("User", str) or "",
        "source": source,
        "digest": digest,
    }


def _kind(value):
    """What a JSON value is, for a message."""
    if isinstance(value, list):
        return "a list" + ("" if all(isinstance(v, str) for v in value) else
                           " holding a non-string")
    return {dict: "an object", str: "a string", bool: "a boolean", int: "a number",
            float: "a number", type(None): "null"}.get(type(value), type(value).__name__)


def rc_script(image):
    """A POSIX sh /etc/rc: workdir, then the caller's command, the image's, or a shell."""
    lines = ["#!/bin/sh", f"# Written by berth import from {image['source']}."]
    if image["workdir"]:
        lines.append(f"cd {shlex.quote(image['workdir'])} || exit 1")
    lines.append('if [ "$#" -gt 0 ]; then exec "$@"; fi')
    command = (image["entrypoint"] or []) + (image["cmd"] or [])
    if command:
        lines.append("exec " + " ".join(shlex.quote(arg) for arg in command))
    else:
        lines.append("exec /bin/sh -l")
    return "\n".join(lines) + "\n"


def image_files(image):
    """Berth's files of an image: (name, text, mode) each, image.json,
    /etc/environment and /etc/rc; None for a mode is 0644 less the umask."""
    return [
        (IMAGE_JSON, json.dumps(image, indent=2) + "\n", None),
        ("etc/environment", "".join(f"{entry}\n" for entry in image["env"]), None),
        ("etc/rc", rc_script(image), 0o755),
    ]


def write_image_config(root, image):
    """Write image_files(image) into `root`."""
    for name, text, mode in image_files(image):
        path = resolve(root, name)
        os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
        if os.path.lexists(path):
            os.unlink(path)  # never write through a symlink the image left there
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            if mode is not None:
                os.fchmod(f.fileno(), mode)


def read_image_config(root_path):
    """The image.json of an unpacked or mounted root, checked against the contract."""
    path = resolve(str(root_path), IMAGE_JSON, follow_last=True)
    try:
        with open(path, encoding="utf-8") as f:
            image = json.load(f)
    except FileNotFoundError:
        raise BerthError(f"{root_path}/{IMAGE_JSON} is missing: not a root made by "
                         "berth import") from None
    except (ValueError, OSError) as e:
        raise BerthError(f"{root_path}/{IMAGE_JSON}: {e}") from None
    except RecursionError:
        raise BerthError(f"{root_path}/{IMAGE_JSON}: nested too deeply") from None
    if not isinstance(image, dict):
        raise BerthError(f"{root_path}/{IMAGE_JSON}: expected a JSON object")
    for key, kind in _KEYS.items():
        if not isinstance(image.get(key), kind):
            raise BerthError(f"{root_path}/{IMAGE_JSON}: key '{key}' missing or of the "
                             "wrong type")
    for key in ("env", "entrypoint", "cmd", "workdir", "user"):
        value = image[key]
        items = [value] if isinstance(value, str) else value or []
        if not all(isinstance(item, str) for item in items):
            raise BerthError(f"{root_path}/{IMAGE_JSON}: key '{key}' holds an entry that "
                             "is not a string")
        if any("\0" in item for item in items):
            raise BerthError(f"{root_path}/{IMAGE_JSON}: key '{key}' holds a NUL character")
    return image
