#!/usr/bin/python
"""Ansible module: build spank_berth.so against the installed Slurm and install it."""

DOCUMENTATION = r"""
---
module: berth_spank
short_description: Build the Berth SPANK plugin against the installed Slurm and install it
description:
  - Compiles C(spank_berth.so) from the plugin sources in O(src) against the C(spank.h)
    under O(slurm_include), in a temporary copy (O(src) is never written to), and installs
    it at O(dest) with mode C(0755).
  - Slurm refuses a plugin built for another release ("Incompatible plugin version"), so
    the version in the headers must equal the version of the installed Slurm
    (C(O(slurm_binary) -V)); when they differ the module fails naming both and changes
    nothing.
  - Idempotent. The hash of the sources and the Slurm version are kept in a stamp file
    C(<dest>.stamp) next to the plugin; the plugin is rebuilt only when either changed,
    or when the installed plugin is missing or is not the one the stamp records.
  - The new plugin is written next to O(dest) as C(<dest>.new), synced to disk and renamed
    over O(dest), so a running C(slurmstepd) or C(srun) keeps the file it loaded and a crash
    leaves the old plugin or the new one. A failed build or install leaves the installed
    plugin and its stamp as they were.
version_added: "0.1.0"
options:
  src:
    description: Directory with the plugin's sources on the managed node, as in C(spank/)
      (C(sources.txt), the files it names one a line, and the C(Makefile)).
    type: path
    required: true
  dest:
    description: Where the plugin goes, normally C(<Slurm PluginDir>/spank_berth.so).
    type: path
    required: true
  slurm_include:
    description: Directory holding C(slurm/spank.h) and C(slurm/slurm_version.h).
    type: path
    default: /usr/include
  slurm_binary:
    description:
      - A Slurm program whose C(-V) names the installed release.
      - Default the first of C(slurmd), C(slurmctld), C(srun) found in C(PATH), C(/usr/sbin),
        C(/usr/bin).
    type: path
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
requirements:
  - make and a C compiler on the managed node
  - the Slurm development headers (Debian C(libslurm-dev))
author:
  - Berth authors
"""

EXAMPLES = r"""
- name: Build and install the SPANK plugin
  berth_spank:
    src: /usr/local/src/berth-spank
    dest: /usr/lib/x86_64-linux-gnu/slurm-wlm/spank_berth.so
"""

RETURN = r"""
path:
  description: The installed plugin.
  returned: always
  type: str
  sample: /usr/lib/x86_64-linux-gnu/slurm-wlm/spank_berth.so
slurm_version:
  description: Version of the installed Slurm, as O(slurm_binary) reports it.
  returned: always
  type: str
  sample: 22.05.8
header_version:
  description: Slurm version of the headers the plugin is built against.
  returned: always
  type: str
  sample: 22.05.8
source_sha256:
  description: Hash of the plugin sources.
  returned: always
  type: str
  sample: 9c1d0e...
rebuilt_because:
  description: Why the plugin was (or, in check mode, would be) built; empty when unchanged.
  returned: always
  type: str
  sample: slurm version 22.05.7 -> 22.05.8
"""

import contextlib
import hashlib
import json
import os
import re
import shutil
import tempfile

from ansible.module_utils.basic import AnsibleModule

# The list of the plugin's sources, one a line, in O(src) as in spank/: the
# Makefile builds from it, and the role copies what it names.
SOURCE_LIST = "sources.txt"
SLURM_PROGRAMS = ("slurmd", "slurmctld", "srun")


def file_sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def plugin_files(src):
    """The files the plugin is built from: the Makefile, the source list and
    the sources it names."""
    with open(os.path.join(src, SOURCE_LIST), encoding="utf-8") as f:
        return ("Makefile", SOURCE_LIST, *f.read().split())


def source_sha256(src, files):
    """Hash of the files the plugin is built from (names and contents, in order)."""
    digest = hashlib.sha256()
    for name in files:
        digest.update(name.encode() + b"\0" + bytes.fromhex(file_sha256(os.path.join(src, name))))
    return digest.hexdigest()


def header_version(include):
    path = os.path.join(include, "slurm", "slurm_version.h")
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise ValueError(f"slurm_include: cannot read {path}: {e.strerror}") from e
    match = re.search(r"^#define\s+SLURM_VERSION_NUMBER\s+0x([0-9a-fA-F]{6})\b", text, re.M)
    if not match:
        raise ValueError(f"slurm_include: no SLURM_VERSION_NUMBER in {path}")
    number = int(match.group(1), 16)
    # Slurm writes its versions as 22.05.8
    return f"{number >> 16}.{(number >> 8) & 0xff:02d}.{number & 0xff}"


def reported_version(module, binary):
    """(version, None) from `binary -V`, or (None, what it said instead)."""
    rc, out, err = module.run_command([binary, "-V"])
    match = re.match(r"slurm(?:-wlm)?\s+(\S+)", out.strip())
    if rc != 0 or not match:
        return None, f"'{binary} -V' did not name a Slurm version: {(out + err).strip()}"
    return match.group(1), None


def installed_version(module, binary):
    """The installed Slurm's version and the program that told it."""
    if binary:
        version, problem = reported_version(module, binary)
        if problem:
            module.fail_json(msg=f"slurm_binary: {problem}")
        return version, binary
    # srun -V needs a reachable configuration (not so on a configless login
    # node without DNS SRV records): the daemons come first.
    problems = []
    for name in SLURM_PROGRAMS:
        path = module.get_bin_path(name, opt_dirs=["/usr/sbin", "/usr/bin"])
        if path:
            version, problem = reported_version(module, path)
            if version:
                return version, path
            problems.append(problem)
    module.fail_json(msg="cannot tell the installed Slurm version: "
                     + ("; ".join(problems) or f"none of {', '.join(SLURM_PROGRAMS)} found")
                     + "; set slurm_binary")


def read_stamp(stamp):
    try:
        with open(stamp, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def stamp_text(stamp):
    return "".join(f"{k}: {stamp[k]}\n" for k in sorted(stamp))


def rebuild_reason(previous, wanted, dest):
    if not os.path.exists(dest):
        return f"{dest} is missing"
    if previous.get("plugin_sha256") != file_sha256(dest):
        return f"{dest} is not the plugin recorded in its stamp"
    if previous.get("slurm_version") != wanted["slurm_version"]:
        return f"slurm version {previous.get('slurm_version')} -> {wanted['slurm_version']}"
    if previous.get("source_sha256") != wanted["source_sha256"]:
        return "plugin sources changed"
    return ""


def fsync_dir(path):
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def install_file(write, dest, mode):
    """Put a new `dest` in place whole or not at all. `write(file)` fills
    dest.new, which is synced to disk, renamed over dest, and the directory
    synced: after a crash dest is the old file or the new one, never a part
    of one. An error before the rename removes dest.new and leaves dest as
    it was. Processes that have the old file open or mapped keep it: the
    rename gives dest a new inode and leaves theirs alone."""
    staged = dest + ".new"
    try:
        with open(staged, "wb") as f:
            write(f)
            f.flush()
            os.fchmod(f.fileno(), mode)
            os.fsync(f.fileno())
        os.replace(staged, dest)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(staged)
        raise
    fsync_dir(os.path.dirname(dest))


def build_and_install(module, src, files, include, dest):
    """Build in a temporary copy; install atomically; return the plugin's hash.
    A failed build or install leaves the installed plugin as it was."""
    with tempfile.TemporaryDirectory(prefix="berth-spank-") as tmp:
        build_src = os.path.join(tmp, "src")
        out = os.path.join(tmp, "out")
        os.mkdir(build_src)
        for name in files:
            shutil.copy(os.path.join(src, name), build_src)
        rc, stdout, stderr = module.run_command(
            ["make", "-C", build_src, f"O={out}", f"SLURM_INCLUDE={include}", "all"])
        if rc != 0:
            module.fail_json(msg=f"building spank_berth.so failed: {(stderr or stdout).strip()}")
        built = os.path.join(out, "spank_berth.so")
        try:
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            with open(built, "rb") as so:
                install_file(lambda f: shutil.copyfileobj(so, f), dest, 0o755)
        except OSError as e:
            # only syncing the directory comes after the rename
            placed = os.path.exists(dest) and file_sha256(dest) == file_sha256(built)
            module.fail_json(msg=f"installing {dest} failed: {e}; "
                             + ("the new plugin is in place" if placed
                                else "the plugin in place is unchanged"))
    return file_sha256(dest)


def write_stamp(stamp, values):
    text = json.dumps(values, indent=1, sort_keys=True) + "\n"
    install_file(lambda f: f.write(text.encode()), stamp, 0o644)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            src=dict(type="path", required=True),
            dest=dict(type="path", required=True),
            slurm_include=dict(type="path", default="/usr/include"),
            slurm_binary=dict(type="path"),
        ),
        supports_check_mode=True,
    )
    src, dest, include = (module.params[k] for k in ("src", "dest", "slurm_include"))
    if not os.path.isfile(os.path.join(src, SOURCE_LIST)):
        module.fail_json(msg=f"src: {src} lacks {SOURCE_LIST}")
    files = plugin_files(src)
    missing = [n for n in files if not os.path.isfile(os.path.join(src, n))]
    if missing:
        module.fail_json(msg=f"src: {src} lacks {', '.join(missing)}")
    try:
        headers = header_version(include)
    except ValueError as e:
        module.fail_json(msg=str(e))
    slurm, binary = installed_version(module, module.params["slurm_binary"])
    if slurm != headers:
        module.fail_json(
            msg=f"Slurm headers in {include} are version {headers} but {binary} is version "
                f"{slurm}: install the headers of the running Slurm (Debian: libslurm-dev "
                f"{slurm}) or point slurm_include at them",
            slurm_version=slurm, header_version=headers)

    stamp = dest + ".stamp"
    previous = read_stamp(stamp)
    wanted = dict(source_sha256=source_sha256(src, files), slurm_version=slurm)
    reason = rebuild_reason(previous, wanted, dest)
    after = dict(wanted, plugin_sha256=previous.get("plugin_sha256", ""))
    if reason and not module.check_mode:
        after["plugin_sha256"] = build_and_install(module, src, files, include, dest)
        try:
            write_stamp(stamp, after)
        except OSError as e:
            # the next run finds the plugin unlike its stamp and builds again
            module.fail_json(msg=f"writing {stamp} failed: {e}")
    elif reason:
        after["plugin_sha256"] = "(rebuilt)"
    module.exit_json(
        changed=bool(reason),
        path=dest,
        slurm_version=slurm,
        header_version=headers,
        source_sha256=wanted["source_sha256"],
        rebuilt_because=reason,
        diff=dict(before=stamp_text(previous), after=stamp_text(after),
                  before_header=stamp, after_header=stamp),
    )


if __name__ == "__main__":
    main()
