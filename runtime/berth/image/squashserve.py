"""The FUSE server that serves every squashfs Berth mounts: a start's root,
a `sqsh` mount (a squashfs or a SIF file's partition), the parts of an
image kept as parts (parts.py); chosen here and nowhere else.

squashfuse ships two servers. `squashfuse` speaks libfuse's high-level
API, on one thread: every request names a path that it looks up again
from the root, and each open drops the file's pages from the kernel's
cache; on a Python tree it reads 8-19x slower than the kernel's own
squashfs warm (bench/read.py). `squashfuse_ll` speaks the low-level API:
inodes, entries and pages cached by the kernel for as long as the mount
lives, and from squashfuse 0.5 several threads. It is used wherever it
can show what the caller needs:

  - In a user namespace that maps one uid (a container's), every file is
    shown as that uid and gid, as an unpacked image's files are the
    caller's: the image's owners (root, mostly) do not exist there, and the
    kernel's overlay refuses to copy up a file whose owner is unmapped.
    squashfuse_ll 0.2 and later take `-o uid=N,gid=N` (Debian 13's 0.5.2
    does); where it does not (Debian 12's 0.1.105) such a root is served
    by the high-level server, told to keep entries, attributes and pages
    in the kernel's cache (the image never changes while it is mounted).
  - Elsewhere (a namespace that maps root, as parts.py's; none at all)
    squashfuse_ll as it is.

Either runs in a mount namespace of its own (mounts.mount_fuse), which the
container's pivot_root leaves alone: squashfuse_ll 0.5 ending its threads
has glibc load libgcc_s, and from the container's root that path would be
looked up through the mount the server serves, by itself, after it has
stopped answering: D state for good, and the start with it.

What each program offers is read from its executable (the help text it
prints, the libfuse loop it links), not by running it: a start would pay
for a process.
"""

import functools
import shutil
from typing import NamedTuple

LOW_LEVEL, HIGH_LEVEL = "squashfuse_ll", "squashfuse"
# The high-level server's libfuse options that keep what the kernel learnt
# (a day: "forever" for a mount that lives as long as a job).
CACHE_OPTIONS = "kernel_cache,entry_timeout=86400,attr_timeout=86400,negative_timeout=86400"


class Server(NamedTuple):
    program: str     # LOW_LEVEL or HIGH_LEVEL, as found on PATH
    owner: bool      # takes -o uid=N,gid=N
    threads: bool    # serves requests on several threads
    options: str     # the -o options it always gets, or ""


def argv(image, owner=None, foreground=True):
    """The server's command for the imagefile.Squashfs `image`, less the
    mount point: every file shown as owner's (uid, gid) when given; in the
    foreground (a process to watch and stop) unless told otherwise."""
    server = choose(owner is not None)
    options = [server.options] if server.options else []
    if owner is not None and server.owner:
        options.append(f"uid={owner[0]},gid={owner[1]}")
    if image.offset:
        options.append(f"offset={image.offset}")
    return [server.program, *(["-f"] if foreground else []),
            *(["-o", ",".join(options)] if options else []), image.path]


@functools.cache
def choose(owner):
    """The Server for a mount that must show every file as one owner
    (`owner`) or as the image has it: see the module's doc."""
    low = _offers(LOW_LEVEL)
    if low and (low.owner or not owner):
        return low
    high = _offers(HIGH_LEVEL)
    if high:  # (libfuse's high-level API itself takes uid= and gid=)
        return high._replace(owner=True, options=CACHE_OPTIONS)
    # neither: mount_fuse says so
    return low or Server(program=HIGH_LEVEL, owner=False, threads=False, options="")


def _offers(program):
    """What `program` on PATH offers, as a Server, or None where it is missing."""
    path = shutil.which(program)
    if not path:
        return None
    try:
        with open(path, "rb") as f:
            executable = f.read()
    except OSError:
        return Server(program=program, owner=False, threads=False, options="")
    # b"uid=N": its help's line for the option. Threads: libfuse's multi-threaded
    # loop linked (squashfuse_ll 0.5); the high-level squashfuse, which links
    # fuse_main, still serves on one thread (one task, however many readers).
    return Server(program=program, owner=b"uid=N" in executable,
                  threads=b"fuse_session_loop_mt" in executable, options="")


def describe():
    """One line for `berth --verbose version`: what serves a start's root
    and a mount that keeps the image's owners."""
    def said(server):
        threads = "threads" if server.threads else "one thread"
        return f"{server.program} ({threads}{', ' + server.options if server.options else ''})"
    return f"squashfs: a container's root by {said(choose(True))}; others by {said(choose(False))}"
