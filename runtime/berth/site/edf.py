"""Environment Definition Files (EDF): TOML files that describe a container
environment (image, workdir, mounts, env, hook annotations) and may inherit
from other EDFs through `base_environment`.

`berth edf show [--json|--spank] NAME|PATH` prints the resolved environment
with the file each value came from; `berth edf check NAME|PATH` only
validates it.

A NAME is looked up as NAME or NAME.toml in each directory of $EDF_PATH
(colon-separated), then in ~/.edf/. A value containing '/' or ending in .toml
is a path; in `base_environment` a relative path is taken relative to the
directory of the file that names it.

base_environment nests at most 10 levels deep (a file, its parent, ...
and the 10th ancestor). A mount is SRC:DST[:FLAGS] with the flags of
`berth start -m`, including `sqsh` (SRC is a squashfs image, mounted
read-only at DST).

Merge rules, parents first in the order listed, then the child:
scalars (image, workdir, entrypoint, writable) are replaced; mounts are
appended, a mount whose destination is already mounted replaces that entry in
place (so nested mounts keep their order); devices (CDI names) are appended,
each once; env and annotations tables merge
key by key, and a child's annotation replaces its parents' other spellings
of the same setting (berth.site.annotations). `${VAR}` in image, workdir,
mounts and env values expands from the submitting environment when the
file is read (an unset VAR is an error); `${VAR:-WORD}` gives WORD where
VAR is unset or empty, and `$$` is a literal `$`.

`containerfile` names a Containerfile, relative to the EDF's own directory,
to build the image from rather than pull it (CSCS's key): `show` builds it
at its first use (berth build, with the file's directory as the context)
and takes it from the step cache after that, giving the image cache's
squashfs as `image`; `check` only parses and plans it. An `image` beside
it is the base: it takes the place of the file's first FROM.

The JSON form is for tools; its keys are fixed:
image, workdir, entrypoint, writable, containerfile (null when no file sets
them), mounts, env, annotations, devices, sources (value -> file; table
entries as "env.KEY", "annotations.KEY", "mounts.DST", "devices.NAME"),
hook_env and warnings (see hook_environment).
The --spank form is what the SPANK plugin reads at submission (it has no JSON
parser): one KEY=VALUE line per setting, see to_spank.
"""

import collections
import json
import os
import re
import sys
from pathlib import Path

from berth import tomlread, tomlwrite
from berth.container import cdi, mounts as mounts_module
from berth.errors import BerthError
from berth.image import imagefile, reference
from berth.site import annotations

# base_environment nests at most this deep (the CSCS engine's limit)
MAX_DEPTH = 10
SCALARS = ("image", "workdir", "entrypoint", "writable")
KEYS = ("base_environment", *SCALARS, "containerfile", "mounts", "env", "annotations",
        "devices")
# ${VAR}, ${VAR:-WORD} (WORD when VAR is unset or empty) and $$ (a literal $)
_VAR = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
_TOML_LINE = re.compile(r"at line (\d+)")


# `berth edf show|check ENVIRONMENT` (cli.py makes it of the command line)
EdfRequest = collections.namedtuple("EdfRequest", "edf_verb environment json spank",
                                    defaults=(False, False))


def cmd_edf(request, cfg):
    hooks_dir = Path(cfg["ENROOT_SYSCONF_PATH"]) / "hooks.d"
    resolved = resolve(request.environment, hooks_dir=hooks_dir)
    if not request.spank:  # the plugin prints them from the warning= lines
        for warning in resolved["warnings"]:
            print(f"berth: warning: {warning}", file=sys.stderr)
    if resolved["containerfile"]:
        resolved = _built(resolved, cfg, build=request.edf_verb == "show")
    if request.edf_verb == "show":
        out = to_json if request.json else to_spank if request.spank else to_toml
        print(out(resolved), end="")
    return 0


# ---------------------------------------------------------------- locating


def find(ref, environ, relative_to=None):
    """Path of the EDF that `ref` (a NAME or a path) names."""
    if "/" in ref or ref.endswith(".toml"):
        path = Path(os.path.expanduser(ref))
        if relative_to is not None and not path.is_absolute():
            path = relative_to / path
        if not path.is_file():
            raise BerthError(f"{path}: no such environment file")
        return path
    if not ref:
        raise BerthError("empty environment name")
    dirs = search_path(environ)
    for directory in dirs:
        for candidate in (directory / ref, directory / f"{ref}.toml"):
            if candidate.is_file():
                return candidate
    looked = ", ".join(str(d) for d in dirs)
    raise BerthError(f"environment '{ref}' not found as {ref} or {ref}.toml in: {looked}")


def search_path(environ):
    """$EDF_PATH's directories, then ~/.edf. A relative entry is refused, as
    the CSCS engine does: it would mean another directory on every node."""
    dirs = [Path(d) for d in environ.get("EDF_PATH", "").split(":") if d]
    for d in dirs:
        if not d.is_absolute():
            raise BerthError(f"EDF_PATH: '{d}' is not an absolute path")
    home = environ.get("HOME") or os.path.expanduser("~")
    return [*dirs, Path(home) / ".edf"]


# ---------------------------------------------------------------- reading one file


class _Layer:
    """The values of one file (or of a merge of files), each with its source."""

    def __init__(self):
        self.scalars = {}  # key -> (value, file)
        self.mounts = []  # [(mount, destination, file)]
        self.env = {}  # key -> (value, file)
        self.annotations = {}  # key -> (value, file)
        self.devices = {}  # CDI name -> file, in the order first given

    def add_mount(self, mount, destination, source):
        entry = (mount, destination, source)
        for i, (_, mounted, _) in enumerate(self.mounts):
            if mounted == destination:
                self.mounts[i] = entry
                return
        self.mounts.append(entry)

    def merge(self, child):
        self.scalars.update(child.scalars)
        for mount in child.mounts:
            self.add_mount(*mount)
        self.env.update(child.env)
        for key in child.annotations:  # the child's spelling of a setting replaces the parent's
            setting = annotations.meaning(key)
            for other in [k for k in self.annotations if k != key]:
                if setting and annotations.meaning(other) == setting:
                    del self.annotations[other]
        self.annotations.update(child.annotations)
        for name, source in child.devices.items():
            self.devices.setdefault(name, source)


class _File:
    """One parsed EDF: its path, text (for line numbers) and TOML table."""

    def __init__(self, path):
        self.path = path
        try:
            self.text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise BerthError(f"{path}: cannot read: {e}") from None
        try:
            self.data = tomlread.loads(self.text)
        except tomlread.DecodeError as e:
            line = getattr(e, "lineno", None) or _decode_error_line(e)
            message = str(e).split(" (at ")[0]
            raise BerthError(f"{self.where(line)}: invalid TOML: {message}") from None

    def where(self, line=None):
        return f"{self.path}:{line}" if line else str(self.path)

    def fail(self, message, key, table=None):
        raise BerthError(f"{self.where(_line_of(self.text, key, table))}: {message}")


def _decode_error_line(error):
    # Python < 3.14 keeps the position only in the message.
    match = _TOML_LINE.search(str(error))
    return int(match.group(1)) if match else None


def _line_of(text, key, table=None):
    """Best-effort line number of `key` (top-level, or inside [table])."""
    k = re.escape(key)
    key_line = re.compile(rf"""\s*(?:"{k}"|'{k}'|{k})\s*[=.]""")
    header = re.compile(rf"""\s*\[\s*(?:"{k}"|{k})\s*[\].]""")
    section = None
    for number, line in enumerate(text.splitlines(), 1):
        opened = re.match(r"\s*\[\s*([^\]\s]+)\s*\]", line)
        if opened:
            section = opened.group(1).strip("\"'")
            if table is None and header.match(line):
                return number
        elif section == table and key_line.match(line):
            return number
        elif section is None and table and re.match(rf"\s*{re.escape(table)}\.{k}\s*=", line):
            return number
    return None


_TYPE_NAMES = {bool: "a boolean", int: "an integer", float: "a float", str: "a string",
               list: "an array", dict: "a table"}


def _type_name(value):
    return _TYPE_NAMES.get(type(value), type(value).__name__)


def _expand(value, environ, edf, key, table=None):
    def lookup(match):
        name, default = match.group(1), match.group(2)
        if name is None:
            return "$"
        if default is not None:
            return environ.get(name) or default
        if name not in environ:
            label = f"{table}.{key}" if table else key
            edf.fail(f"${{{name}}} in '{label}' is not set in the environment", key, table)
        return environ[name]
    return _VAR.sub(lookup, value)


def _flatten(table, prefix=""):
    """Dotted TOML keys (a.b.c = 1 parses as nested tables) back to 'a.b.c'."""
    for key, value in table.items():
        if isinstance(value, dict):
            yield from _flatten(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def _parents(edf):
    value = edf.data.get("base_environment", [])
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
        edf.fail("'base_environment' must be a name or an array of names", "base_environment")
    return names


def _read_layer(edf, environ):
    """Validate one file's own keys and return them as a layer."""
    layer = _Layer()
    source = str(edf.path)
    for key in edf.data:
        if key not in KEYS:
            edf.fail(f"unknown key '{key}' (known: {', '.join(sorted(KEYS))})", key)
    for key in SCALARS:
        if key not in edf.data:
            continue
        value = edf.data[key]
        wanted = bool if key in ("entrypoint", "writable") else str
        if type(value) is not wanted:
            edf.fail(f"'{key}' must be {_TYPE_NAMES[wanted]}, not {_type_name(value)}", key)
        if wanted is str:
            value = _expand(value, environ, edf, key)
            if not value:
                edf.fail(f"'{key}' is empty", key)
        if key == "workdir" and not value.startswith("/"):
            edf.fail(f"'workdir' must be an absolute path, not '{value}'", key)
        layer.scalars[key] = (value, source)
    _read_containerfile(edf, environ, layer)
    _read_mounts(edf, environ, layer)
    _read_devices(edf, layer)
    for key, value in _table(edf, "env").items():
        if not isinstance(value, str):
            edf.fail(f"'env.{key}' must be a string, not {_type_name(value)}", key, "env")
        layer.env[key] = (_expand(value, environ, edf, key, "env"), source)
    for key, value in _flatten(_table(edf, "annotations")):
        if not isinstance(value, (str, int)):
            edf.fail(f"'annotations.{key}' must be a string, integer or boolean, "
                     f"not {_type_name(value)}", key, "annotations")
        if key in layer.annotations:
            edf.fail(f"annotation '{key}' is given twice", key, "annotations")
        layer.annotations[key] = (value, source)
    return layer


def _read_containerfile(edf, environ, layer):
    """`containerfile`: a path, relative to the EDF's own directory."""
    if "containerfile" not in edf.data:
        return
    value = edf.data["containerfile"]
    if not isinstance(value, str):
        edf.fail(f"'containerfile' must be a string, not {_type_name(value)}", "containerfile")
    value = _expand(value, environ, edf, key="containerfile")
    if not value:
        edf.fail("'containerfile' is empty", "containerfile")
    path = os.path.normpath(os.path.join(edf.path.parent.absolute(), value))
    layer.scalars["containerfile"] = (path, str(edf.path))


def _built(resolved, cfg, *, build):
    """A `containerfile` EDF's image: the file built (at its first use, and
    from the step cache after it) with its directory as the context and the
    EDF's `image`, where given, as its first FROM's, and put where the
    job's nodes read it (edfbuild); or, without `build`, only parsed and
    planned. The resolved environment with `image` set."""
    from berth.build import parse, plan, verbs  # (only for an EDF with a containerfile)
    from berth.site import edfbuild
    path = resolved["containerfile"]
    if not build:
        plan.make(parse.read(path), build_args={}, target=None, base=resolved["image"])
        return resolved
    built = verbs.build(cfg, verbs.BuildRequest(context=os.path.dirname(path), file=path,
                                                base=resolved["image"], quiet=True))
    sources = {**resolved["sources"], "image": path}
    return {**resolved, "image": edfbuild.placed(cfg, built.path), "sources": sources}


def _table(edf, key):
    value = edf.data.get(key, {})
    if not isinstance(value, dict):
        edf.fail(f"'{key}' must be a table, not {_type_name(value)}", key)
    return value


def _read_devices(edf, layer):
    """`devices`: CDI names (VENDOR/CLASS=DEVICE), looked up by `berth start
    --device` on the node that starts the container, whose specs count."""
    names = edf.data.get("devices", [])
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        edf.fail("'devices' must be an array of CDI device names", "devices")
    for name in names:
        if not cdi.is_name(name):
            edf.fail(f"device '{name}' is not a CDI device name (VENDOR/CLASS=DEVICE, as "
                     f"nvidia.com/gpu=0)", "devices")
        layer.devices.setdefault(name, str(edf.path))


def _read_mounts(edf, environ, layer):
    mounts = edf.data.get("mounts", [])
    if not isinstance(mounts, list):
        edf.fail(f"'mounts' must be an array of strings, not {_type_name(mounts)}", "mounts")
    for mount in mounts:
        if not isinstance(mount, str):
            edf.fail(f"'mounts' entries must be strings, not {_type_name(mount)}", "mounts")
        mount = _expand(mount, environ, edf, "mounts")
        parts = mount.split(":")
        if len(parts) < 2 or not parts[1]:
            edf.fail(f"mount '{mount}' has no destination (SRC:DST[:FLAGS])", "mounts")
        if len(parts) > 3 or not parts[0]:
            edf.fail(f"mount '{mount}' is not SRC:DST[:FLAGS]", "mounts")
        if not parts[1].startswith("/"):
            edf.fail(f"mount '{mount}': destination '{parts[1]}' is not an absolute path",
                     "mounts")
        try:  # the flags (ro, sqsh, ...) are those of berth start -m
            mounts_module.parse_spec(mount, cwd="/")
        except BerthError as e:
            edf.fail(f"mount '{mount}': {str(e).split(': ', 1)[-1]}", "mounts")
        layer.add_mount(mount, os.path.normpath(parts[1]), str(edf.path))


# ---------------------------------------------------------------- resolving


def _image_reference(image):
    """An image named as Docker names it (`nvcr.io/nvidia/x`, as the CSCS
    talk's EDFs write it) in the enroot form the plugin passes on
    (`nvcr.io#nvidia/x`); an image file's path, absolute or relative, as given."""
    if image is None or image.startswith(("/", ".", "~")) or image.endswith(imagefile.SUFFIXES):
        return image
    return reference.in_enroot_form(image)


def resolve(ref, environ=None, hooks_dir=None):
    """Resolve the EDF `ref` with all its parents into one environment dict.

    `environ` is the submitting environment (default: this process's); it
    expands ${VAR}s and gives EDF_PATH and HOME. Annotations that switch
    hooks are checked against the hooks installed in `hooks_dir`.
    """
    environ = dict(os.environ if environ is None else environ)
    layer = _resolve(find(ref, environ), ref, environ, chain=[])
    result = {key: layer.scalars.get(key, (None, None))[0] for key in (*SCALARS, "containerfile")}
    result["image"] = _image_reference(result["image"])
    result["mounts"] = [m[0] for m in layer.mounts]
    result["env"] = {k: v for k, (v, _) in layer.env.items()}
    result["annotations"] = {k: v for k, (v, _) in layer.annotations.items()}
    result["devices"] = list(layer.devices)
    sources = {key: src for key, (_, src) in layer.scalars.items()}
    sources.update({f"mounts.{dst}": src for _, dst, src in layer.mounts})
    sources.update({f"env.{k}": src for k, (_, src) in layer.env.items()})
    sources.update({f"annotations.{k}": src for k, (_, src) in layer.annotations.items()})
    sources.update({f"devices.{name}": src for name, src in layer.devices.items()})
    result["sources"] = sources
    result["hook_env"], result["warnings"] = hook_environment(result, hooks_dir)
    return result


def _resolve(path, label, environ, chain):
    """Merge the parents of the file at `path`, then the file itself.

    `chain` holds (label, real path) of the files being resolved above this
    one, to name a base_environment cycle the way the files name each other.
    """
    real = os.path.realpath(path)
    if any(real == seen for _, seen in chain):
        start = next(i for i, (_, seen) in enumerate(chain) if seen == real)
        cycle = " -> ".join([*(name for name, _ in chain[start:]), label])
        raise BerthError(f"base_environment cycle: {cycle}")
    chain = [*chain, (label, real)]
    if len(chain) > MAX_DEPTH + 1:
        names = " -> ".join(name for name, _ in chain)
        raise BerthError(f"base_environment nests deeper than {MAX_DEPTH} levels: {names}")
    edf = _File(Path(path))
    merged = _Layer()
    for parent in _parents(edf):
        try:
            parent_path = find(parent, environ, relative_to=edf.path.parent)
        except BerthError as e:
            edf.fail(f"base_environment: {e}", "base_environment")
        merged.merge(_resolve(parent_path, parent, environ, chain))
    merged.merge(_read_layer(edf, environ))
    return merged


# ---------------------------------------------------------------- hooks


def installed_hooks(hooks_dir):
    """Hook names in hooks_dir: the `*.sh` files the runtime runs, without a
    leading 'NN-' and '.sh' (helpers and data files beside them are no hooks)."""
    if hooks_dir is None or not Path(hooks_dir).is_dir():
        return set()
    return {
        re.sub(r"^\d+-", "", entry.name.removesuffix(".sh"))
        for entry in Path(hooks_dir).glob("*.sh")
        if entry.is_file()
    }


class HookSettings(collections.namedtuple("HookSettings", "env warnings")):
    """What an EDF's hook annotations come to: BERTH_HOOK_* variables
    {name: value} for `berth start`, and one line for each annotation left
    out because its hook is not installed here."""


def hook_environment(resolved, hooks_dir=None):
    """The `com.hooks.*` annotations of `resolved`, read through the
    vocabulary (berth.site.annotations), as HookSettings.

    A switch (`enable = true`, `enabled = "true"`) becomes 1 or 0, another
    boolean too; other values pass as they are. Two spellings of one
    setting that disagree are an error naming both. With `hooks_dir`: an
    annotation for a hook not installed there is left out with a warning
    (an EDF may be written for several clusters), and one that a hook
    installed there does not take (a misspelling) is an error.
    """
    installed = installed_hooks(hooks_dir) if hooks_dir is not None else None
    site_hooks = frozenset(installed or ()) - annotations.HOOKS
    sources = resolved.get("sources", {})
    env, given, warnings = {}, {}, []
    for key, value in resolved["annotations"].items():
        name, param = annotations.split(key)
        if not name and not key.startswith(annotations.PREFIX):
            continue
        where = sources.get(f"annotations.{key}", "annotations")
        if not name or not param:
            raise BerthError(f"{where}: annotation '{key}' is not com.hooks.NAME.PARAM")
        meaning = annotations.meaning(key, site_hooks)
        hook = meaning.hook if meaning else annotations.NAMES[name]
        if installed is not None and hook not in installed:
            known = ", ".join(sorted(installed)) or "none"
            warnings.append(f"{where}: annotation '{key}' is for hook '{hook}', which is not "
                            f"installed in {hooks_dir} (installed: {known}): left out")
            continue
        if meaning is None:
            raise BerthError(f"{where}: hook '{hook}' takes no annotation '{key}' (it takes "
                             f"{', '.join(annotations.keys_of(name))})")
        if meaning.switch:
            value = "1" if _switch(value, key, where) else "0"
        elif isinstance(value, bool):
            value = "1" if value else "0"
        value = str(value)
        if env.get(meaning.variable, value) != value:
            raise BerthError(f"{where}: annotations '{given[meaning.variable]}' and '{key}' "
                             f"disagree")
        env[meaning.variable] = value
        given[meaning.variable] = key
    return HookSettings(env, warnings)


def _switch(value, key, where):
    if isinstance(value, str) and value in ("true", "false"):
        return value == "true"
    if not isinstance(value, bool):
        raise BerthError(f"{where}: annotation '{key}' must be true or false")
    return value


# ---------------------------------------------------------------- output


def to_json(resolved):
    return json.dumps(resolved, indent=2) + "\n"


def _one_line(text):
    return re.sub(r"[\x00-\x1f\x7f]", "?", text)


def _comment(source):
    # A source path is printed as a comment: keep it on one line.
    return "  # " + _one_line(source)


def to_toml(resolved):
    """The resolved environment as TOML, each value's source file as a comment."""
    sources = resolved["sources"]
    lines = []
    for key in SCALARS:
        if resolved[key] is not None:
            lines.append(f"{key} = {tomlwrite.value(resolved[key], key)}{_comment(sources[key])}")
    if resolved["mounts"]:
        lines.append("mounts = [")
        for mount in resolved["mounts"]:
            destination = os.path.normpath(mount.split(":")[1])
            comment = _comment(sources["mounts." + destination])
            lines.append(f"    {tomlwrite.string(mount)},{comment}")
        lines.append("]")
    if resolved["devices"]:
        lines.append("devices = [")
        lines += [f"    {tomlwrite.string(name)},{_comment(sources[f'devices.{name}'])}"
                  for name in resolved["devices"]]
        lines.append("]")
    for table in ("env", "annotations"):
        if resolved[table]:
            lines += ["", f"[{table}]"]
            lines += [f"{tomlwrite.key(k, f'{table}.{k}')} = {tomlwrite.value(v, f'{table}.{k}')}"
                      f"{_comment(sources[f'{table}.{k}'])}" for k, v in resolved[table].items()]
    return "\n".join(lines) + "\n"


def to_spank(resolved):
    """One KEY=VALUE line per setting, in the plugin's flag vocabulary:
    warning=LINE for each warning (the plugin prints them), image=, workdir=,
    entrypoint=yes|no, writable=yes|no, then mount=SRC:DST[:FLAGS],
    device=NAME, env=KEY=VALUE and hook_env=KEY=VALUE, one line each, in
    merge order.
    A value that cannot travel on one line (or, for a mount, in the plugin's
    comma-separated mount list) is an error naming it."""
    sources = resolved["sources"]
    lines = [f"warning={_one_line(warning)}" for warning in resolved["warnings"]]

    def add(key, value, where):
        if "\n" in value or "\0" in value:
            raise BerthError(f"{where}: '{key}' has a newline or NUL, which the SPANK "
                             f"plugin cannot carry")
        lines.append(f"{key}={value}")

    for key in SCALARS:
        value = resolved[key]
        if isinstance(value, bool):
            value = "yes" if value else "no"
        if value is not None:
            add(key, value, sources[key])
    for mount in resolved["mounts"]:
        where = sources["mounts." + os.path.normpath(mount.split(":")[1])]
        if "," in mount:
            raise BerthError(f"{where}: mount '{mount}' has a ',', which the SPANK plugin's "
                             f"mount list cannot carry")
        add("mount", mount, where)
    for name in resolved["devices"]:
        add("device", name, sources[f"devices.{name}"])
    for key, value in resolved["env"].items():
        add("env", f"{key}={value}", sources[f"env.{key}"])
    for key, value in resolved["hook_env"].items():
        add("hook_env", f"{key}={value}", "annotations")
    return "".join(line + "\n" for line in lines)
