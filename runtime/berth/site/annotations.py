"""The `com.hooks.*` annotations of an EDF: each one Berth's hooks take,
the hook it reaches and the BERTH_HOOK_* variable it becomes there.

This table is the one list: the EDF resolver (berth.site.edf) reads
annotations through it, scripts/reference.py writes the hooks reference
from it, and the tests check it against the variables each hook reads.

Several spellings may mean one setting: Berth's own (`enable = true`), the
CSCS engine's current one (`enabled = "true"`, a string, and
`aws_ofi_nccl.variant`), and the one of the CSCS talk "Containers-First
User Environments on HPE Cray EX" (`ofi_nccl.version`, `cxi.enable = true`).
An annotation for a hook that is not in this table (a site's own hook) is
read by the general rule: `com.hooks.NAME.PARAM` becomes
BERTH_HOOK_NAME_PARAM, `enable`/`enabled` the hook's switch.
"""

import re
from typing import NamedTuple

PREFIX = "com.hooks."
# The on/off parameter: Berth's `enable` and the CSCS engine's `enabled`.
SWITCHES = ("enable", "enabled")

BERTH = "Berth"
CSCS = "the CSCS engine"
CSCS_TALK = "the CSCS talk"


class Annotation(NamedTuple):
    key: str  # the annotation, without com.hooks.: "ofi_nccl.version"
    hook: str  # the hook it reaches, as hooks.d names it: "aws_ofi_nccl"
    variable: str  # what the hook reads: "BERTH_HOOK_AWS_OFI_NCCL_VARIANT"
    spelling: str  # whose spelling it is: BERTH, CSCS or CSCS_TALK


def env_name(text):
    """A name as a variable takes it: upper case, anything else '_'."""
    return re.sub(r"[^A-Za-z0-9]", "_", text).upper()


def _switch(hook, name=None, *, spellings=((BERTH, "enable"), (CSCS, "enabled"))):
    variable = f"BERTH_HOOK_{env_name(hook)}_ENABLE"
    return tuple(Annotation(f"{name or hook}.{param}", hook, variable=variable, spelling=spelling)
                 for spelling, param in spellings)


def _setting(hook, param, *, name=None, variable=None, spelling=CSCS):
    variable = variable or f"BERTH_HOOK_{env_name(hook)}_{env_name(param)}"
    return Annotation(f"{name or hook}.{param}", hook, variable=variable, spelling=spelling)


TABLE = (
    *_switch("slurm"),
    _setting("slurm", "replace", spelling=BERTH),
    *_switch("aws_ofi_nccl"),
    _setting("aws_ofi_nccl", "variant"),
    *_switch("aws_ofi_nccl", "ofi_nccl",
             spellings=((CSCS_TALK, "enable"), (CSCS_TALK, "enabled"))),
    _setting("aws_ofi_nccl", "version", name="ofi_nccl",
             variable="BERTH_HOOK_AWS_OFI_NCCL_VARIANT", spelling=CSCS_TALK),
    *_switch("mpi"),
    *_switch("ssh"),
    _setting("ssh", "port"),
    _setting("ssh", "authorize_ssh_key"),
    *_switch("cxi", spellings=((CSCS_TALK, "enable"), (CSCS, "enabled"))),
    *_switch("nvidia"),
    *_switch("mellanox"),
)
_BY_KEY = {row.key: row for row in TABLE}
# the names an annotation may give (hooks and other spellings) -> the hook
NAMES = {row.key.partition(".")[0]: row.hook for row in TABLE}
HOOKS = frozenset(NAMES.values())


class Meaning(NamedTuple):
    hook: str
    variable: str
    switch: bool  # true/false (or "true"/"false"), passed on as 1/0


def split(key):
    """com.hooks.NAME.PARAM -> (NAME, PARAM); ('', '') for another key."""
    if not key.startswith(PREFIX):
        return "", ""
    name, _, param = key[len(PREFIX):].partition(".")
    return name, param


def meaning(key, site_hooks=frozenset()):
    """What the annotation `key` sets, or None where NAME is one of this
    table's and PARAM is none of its (a misspelling). A NAME among
    `site_hooks` (hooks installed that Berth does not ship) is theirs."""
    name, param = split(key)
    if name in NAMES and name not in site_hooks:
        row = _BY_KEY.get(f"{name}.{param}")
        if row is None:
            return None
        return Meaning(row.hook, row.variable, param in SWITCHES)
    switch = param in SWITCHES
    variable = f"BERTH_HOOK_{env_name(name)}_{'ENABLE' if switch else env_name(param)}"
    return Meaning(name, variable, switch)


def keys_of(name):
    """The annotations NAME takes, in full, for a message."""
    return sorted(PREFIX + row.key for row in TABLE if row.key.partition(".")[0] == name)


def for_variable(variable):
    """The table's rows that set `variable`, Berth's spelling first."""
    order = (BERTH, CSCS, CSCS_TALK)
    return sorted((row for row in TABLE if row.variable == variable),
                  key=lambda row: (order.index(row.spelling), row.key))
