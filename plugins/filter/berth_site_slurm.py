"""Filters for fitting Berth into a Slurm the site runs: what its
`scontrol show config` says, whether its Prolog runs a path, which
plugstack lines load pyxis, and which enroot.conf paths its users share."""

import fnmatch
import re

# `KEY = VALUE`, or `KEY[N] = VALUE` for a key given on several lines (24.11's Prolog)
_CONFIG_LINE = re.compile(r"^(\w+)(\[\d+\])?\s+=\s+(.*?)\s*$")
_PYXIS = re.compile(r"^\s*(required|optional)\s+\S*spank_pyxis\.so(\s|$)")
_INCLUDE = re.compile(r"^\s*include\s+(\S+)\s*$", re.IGNORECASE)
# The enroot.conf keys whose directory Berth uses only when it is the
# caller's own, and what makes a value differ from user to user as enroot
# expands it (`$(id -g)` does not: a group's members share that directory).
_OWN_PATHS = ("ENROOT_RUNTIME_PATH", "ENROOT_CACHE_PATH", "ENROOT_DATA_PATH", "ENROOT_CONFIG_PATH")
_SETTING = re.compile(r"^\s*([A-Z_]+)\s+(\S.*?)\s*$")
# (per user: $(id -u), $(id -un), $(whoami), $UID, ${HOME}, ${XDG_CACHE_HOME}, ~)
_PER_USER = re.compile(r"\$\(\s*(id\s+-un?|whoami)\s*\)"
                       r"|\$\{?(UID|USER|HOME|XDG_[A-Z_]+)\b"
                       r"|(^|[\s:=])~")


def berth_scontrol_config(text):
    """`scontrol show config`'s KEY = VALUE lines as a dict (the header and
    the plugin sections' lines that are not of that form are left out):
    a value is a string, or a list of strings where scontrol numbers the
    key's lines (`Prolog[0]`, `Prolog[1]`: Slurm 24.11 takes Prolog and
    Epilog on several lines and runs each). A key shown as '(null)',
    scontrol's word for unset, is left out too: Slurm then uses its
    built-in default (for PlugStackConfig, plugstack.conf beside
    slurm.conf, as 22.05 shows it when unset)."""
    found, section_ended = {}, set()
    for line in text.splitlines():
        pair = _CONFIG_LINE.match(line)
        if not pair:
            section_ended.update(found)  # a plugin's section: its keys are not slurm.conf's
            continue
        key, numbered, value = pair.groups()
        if key in section_ended or value == "(null)":
            continue
        if numbered:
            found.setdefault(key, []).append(value)
        else:
            found.setdefault(key, value)
    return found


def berth_runs_path(setting, path):
    """Whether a Prolog or Epilog setting runs `path`: the setting (a string,
    or a list of one per slurm.conf line, as berth_scontrol_config gives it)
    is the path, or a glob(7) pattern that matches it. Slurm expands each
    value with glob(3) and runs every match; a comma is no separator in
    22.05 or 24.11 (measured on 22.05: a `Prolog=A,B` fails every job's
    prolog and drains the node), so a value with one is taken as one
    pattern too. '(null)' is scontrol's word for unset."""
    values = [setting] if isinstance(setting, str) else setting
    return any(value not in ("", "(null)") and fnmatch.fnmatchcase(path, value)
               for value in values)


def berth_pyxis_lines(text):
    """The lines of a plugstack file that load pyxis, as they are written."""
    return [line for line in text.splitlines() if _PYXIS.match(line)]


def berth_plugstack_loads(text, path):
    """Whether a plugstack.conf includes `path`, by name or by a glob."""
    patterns = [m.group(1) for m in map(_INCLUDE.match, text.splitlines()) if m]
    return any(fnmatch.fnmatchcase(path, pattern) for pattern in patterns)


def berth_shared_enroot_paths(text):
    """The settings of an enroot.conf (`LINE: KEY VALUE`) that give several
    users one directory where Berth takes only the caller's own: a value
    with no part that enroot expands per user (a path of its own, or a
    group's `$(id -g)`)."""
    shared = []
    for number, line in enumerate(text.splitlines(), 1):
        setting = _SETTING.match(line.partition("#")[0])
        if setting and setting.group(1) in _OWN_PATHS and not _PER_USER.search(setting.group(2)):
            shared.append(f"{number}: {setting.group(1)} {setting.group(2)}")
    return shared


class FilterModule:
    def filters(self):
        return {
            "berth_scontrol_config": berth_scontrol_config,
            "berth_runs_path": berth_runs_path,
            "berth_pyxis_lines": berth_pyxis_lines,
            "berth_plugstack_loads": berth_plugstack_loads,
            "berth_shared_enroot_paths": berth_shared_enroot_paths,
        }
