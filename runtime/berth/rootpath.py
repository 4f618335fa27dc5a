"""Paths inside a container root, resolved the way the container sees them.

A symlink in an image is read with the root as `/`, so following one never
leaves the root: layer unpacking, mount targets and image files all rely on it.
"""

import collections
import errno
import os
import stat

from berth.errors import BerthError

_MAX_SYMLINKS = 40


def resolve(root, name, follow_last=False, what=None):
    """Host path of `name` in `root`, following symlinks with `root` as `/`.
    A `..` above `/` stays at `/`, as in the container; with `what` (a mount
    destination, say) it is refused instead, naming `what` and `name`, with
    the words of EXDEV, which enroot's realpathat() fails such a path with
    (and scripts grep for)."""
    pending = collections.deque(p for p in name.split("/") if p not in ("", "."))
    parts = []
    followed = 0
    while pending:
        part = pending.popleft()
        if part == "..":
            if parts:
                parts.pop()
            elif what:
                raise BerthError(f"{what} {name} escapes the container root: "
                                 f"{os.strerror(errno.EXDEV)}")
            continue
        path = os.path.join(root, *parts, part)
        if not pending and not follow_last:
            parts.append(part)
            break
        try:
            is_link = stat.S_ISLNK(os.lstat(path).st_mode)
        except FileNotFoundError:
            is_link = False
        if not is_link:
            parts.append(part)
            continue
        followed += 1
        if followed > _MAX_SYMLINKS:
            raise BerthError(f"too many levels of symbolic links in '{name}'")
        target = os.readlink(path)
        if target.startswith("/"):
            parts = []
        pending.extendleft(reversed([p for p in target.split("/") if p not in ("", ".")]))
    return os.path.join(root, *parts)
