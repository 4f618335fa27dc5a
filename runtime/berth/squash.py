"""squashfs images made with mksquashfs, and the free-space checks around them."""

import os
import shlex
import shutil
import subprocess
import sys

from berth.errors import BerthError


def free_bytes(path):
    """Free bytes on the filesystem that holds `path` (or would, once created)."""
    path = os.path.abspath(path)
    while not os.path.exists(path):
        path = os.path.dirname(path)
    return shutil.disk_usage(path).free


def require_space(path, needed, purpose):
    """Fail before starting work that cannot fit (PAINPOINTS #3)."""
    free = free_bytes(path)
    if free < needed:
        raise BerthError(f"not enough space in {path} for {purpose}: {free} bytes free, "
                         f"at least {needed} needed")


def make_squashfs(root, output, cfg, replace, show_progress):
    """Pack `root` into `output` through a temporary file next to it."""
    try:
        options = shlex.split(cfg["ENROOT_SQUASH_OPTIONS"])
    except ValueError as e:
        raise BerthError(f"ENROOT_SQUASH_OPTIONS: {e}") from None
    partial = f"{output}.tmp-{os.getpid()}"
    # Layers are unpacked without their owners, so every file is the
    # importer's: store them as root's, so the image is the same whoever
    # imported it, and its directories stay writable to root in a container.
    command = ["mksquashfs", root, partial, "-noappend", "-all-root", *options,
               "-processors", str(cfg.number("ENROOT_MAX_PROCESSORS"))]
    if not show_progress:  # (-quiet would be nicer, but squashfs-tools 4.4 lacks it)
        command.append("-no-progress")
    try:
        result = subprocess.run(command, stdout=sys.stderr if show_progress else subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, check=False)
        if result.returncode != 0:
            lines = (result.stderr or result.stdout or "").strip().splitlines()
            raise BerthError(f"mksquashfs failed for {output}: "
                             f"{lines[-1] if lines else f'exit {result.returncode}'} "
                             f"({free_bytes(output)} bytes free in {os.path.dirname(output)})")
        if not replace and os.path.lexists(output):
            raise BerthError(f"{output} already exists; remove it or set "
                             "ENROOT_FORCE_OVERRIDE=yes")
        os.rename(partial, output)
    except FileNotFoundError as e:
        if e.filename == "mksquashfs":
            raise BerthError("mksquashfs not found: install squashfs-tools") from None
        raise
    finally:
        if os.path.lexists(partial):
            os.unlink(partial)
