"""The container environment: KEY=VALUE files, image env, `-e` options.

Precedence, lowest first: a few caller basics (HOME, USER, LOGNAME, TERM)
and a default PATH; `$ENROOT_SYSCONF_PATH/environ.d/*.env`;
`$ENROOT_CONFIG_PATH/environ.d/*.env`; the image's env; lines hooks append
to `$ENROOT_ENVIRON`; batch `#ENROOT_ENVIRON` lines; `-e` options.
In .env files `$VAR`/`${VAR}` expand from the environment built so far,
so `PATH=${PATH}:/opt/bin` extends it.
"""

import re
import shlex

from berth.config import text_lines
from berth.errors import BerthError

_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_VAR = re.compile(r"\$(?:\{(\w+)\}|(\w+))")
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_FROM_CALLER = ("HOME", "USER", "LOGNAME", "TERM")


def base(caller):
    env = {key: caller[key] for key in _FROM_CALLER if key in caller}
    env["PATH"] = DEFAULT_PATH
    return env


def parse_line(line, origin):
    """A KEY=VALUE line as (key, value), or None for a blank or comment line."""
    line = line.strip()
    if not line or line.startswith("#"):
        return None
    key, sep, value = line.partition("=")
    if not sep or not _KEY.match(key):
        raise BerthError(f"{origin}: expected KEY=VALUE, got '{line}'")
    if len(value) > 1 and value[0] == value[-1] and value[0] in "\"'":
        value = value[1:-1]
    return key, value


def read_file(path, env, expand=True, skip=0):
    """Add the KEY=VALUE lines of `path` (from byte `skip` on) to `env` (in place)."""
    for number, line in text_lines(path, skip, "a hook" if skip else None):
        pair = parse_line(line, f"{path}:{number}")
        if pair:
            key, value = pair
            if expand:
                value = _VAR.sub(lambda m: env.get(m.group(1) or m.group(2), ""), value)
            env[key] = value


def to_lines(env):
    """`env` as the KEY=VALUE lines of $ENROOT_ENVIRON, which hooks read as
    data. A variable whose name or value has a newline cannot be one line:
    hooks do not see it (the container still gets it)."""
    return "".join(f"{key}={value}\n" for key, value in env.items()
                   if "\n" not in key and "\n" not in value and "\r" not in value)


def to_shell(env):
    """`env` as lines a POSIX shell sources, `export NAME='VALUE'`; a name no
    shell can assign (bash's exported functions, `BASH_FUNC_f%%`) is left out."""
    return "".join(f"export {key}={shlex.quote(value)}\n" for key, value in env.items()
                   if _KEY.match(key))


def parse_option(spec, caller):
    """`-e KEY=VALUE`, or `-e KEY` for the caller's value; None when the caller has none."""
    key, sep, value = spec.partition("=")
    if not _KEY.match(key):
        raise BerthError(f"-e {spec}: '{key}' is not a valid variable name")
    if sep:
        return key, value
    return (key, caller[key]) if key in caller else None


def from_list(pairs):
    """Image-style ["K=V", ...] as a dict; entries without '=' are ignored."""
    return dict(p.split("=", 1) for p in pairs if "=" in p)
