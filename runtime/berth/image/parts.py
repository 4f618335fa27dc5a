"""Cached images of several layers kept as their lower layers and a top
part, so that a new tag that shares the lower layers of a cached image
costs what its own layers cost, not a whole import.

Such an image is still one squashfs file (the store, its node copies,
prune and the SPANK plugin see nothing new). Its root is the tree of its
lower layers, packed as any import packs them (stream.py, or applied in
order). Beside it, the directory
`.berth-top.N` holds what the remaining layers and Berth's image files
(imageconfig.py) change, as an overlayfs upper directory made by the kernel
itself: the layers are applied through an overlay of the lower tree in a
user namespace, so their whiteouts, opaque directories, hard links to lower
files and paths through lower symbolic links end exactly as in a flat
import. Removals are character devices 0/0, a directory made anew carries
`user.overlay.opaque` (hence `userxattr` at start). Each `.berth-top.*`
name has a whiteout in the top part, so none shows in the container; the
whiteout of its own name marks the part as ours (an import makes no
device files). A start stacks the highest `.berth-top.N` over the root.

A new tag: the cached image whose root holds the longest run of the same
layers from the bottom (ImageCache.base) is copied and the new top part
appended to the copy with mksquashfs (its compressed blocks are not made
again); the parts the copy held below stay unused in it. Past MAX_TOPS
parts, or where the kernel's overlay in a user namespace or user xattrs are
not to be had, the image is imported whole (the caller's fallback).
"""

import contextlib
import os
import re
import shutil
import signal
import stat

from berth import syscalls as sc
from berth.errors import BerthError
from berth.image import imagefile, squashserve
from berth.image.imageconfig import IMAGE_JSON

PREFIX = ".berth-top."
MAX_TOPS = 8  # parts a file may gather through new tags before a whole import
_DIGIT = "[1-9]"  # a part's number: one digit, MAX_TOPS at most
_NAME = re.compile(rf"{re.escape(PREFIX)}({_DIGIT})")
# an entry at a marker's path in `unsquashfs -ls` (names only)
_MARKER_PATH = re.compile(
    rf"^squashfs-root/({re.escape(PREFIX)}{_DIGIT})/\1$".encode(), re.MULTILINE)


class Unavailable(Exception):
    """This image cannot be kept as parts here: import it whole."""


def wanted(cache_only, squash_options):
    """Whether an import keeps its image as parts: an image cache's entry
    (--cache-only: the plugin's, `berth start docker://`'s, the store's),
    never a file for the user (`berth import -o`: a plain squashfs), and
    only while mksquashfs keeps the xattrs that mark opaque directories."""
    return cache_only and "-no-xattrs" not in squash_options


def name(number):
    return f"{PREFIX}{number}"


def _is_part(root, number):
    """Whether `.berth-top.N` in the mounted `root` is a part of Berth's:
    it holds the whiteout of its own name, a character device 0/0. That
    is the one definition of a part: an import makes no device files (a
    layer's are skipped), so no image can make one, whatever it names."""
    try:
        marker = os.lstat(os.path.join(root, name(number), name(number)))
    except OSError:
        return False
    return stat.S_ISCHR(marker.st_mode) and marker.st_rdev == 0


def top_of_mounted(root):
    """The top part's name in the mounted squashfs `root`, or None for a
    plain image: the highest part (_is_part). (The kernel refuses lower
    directories of which one holds another: the top is stacked from a
    second mount of the same file.)"""
    try:
        names = os.listdir(root)
    except OSError:
        return None
    numbers = [int(m.group(1)) for m in map(_NAME.fullmatch, names) if m]
    numbers = [number for number in numbers if _is_part(root, number)]
    return name(max(numbers)) if numbers else None


def top_of_file(image):
    """The top part's name in the squashfs file `image`, or None
    (top_number_of_file); a BerthError where that cannot be told here."""
    try:
        number = top_number_of_file(image)
    except Unavailable as e:
        raise BerthError(f"cannot tell whether an image is kept as parts: {e}") from None
    return name(number) if number else None


def top_number_of_file(image):
    """The number of the top part in the squashfs file `image` (0: a plain
    image), as _is_part() defines one: the markers' own inodes, lstat'ed
    in the file served by squashfuse in a namespace of this process's own.
    No text listing of the file is believed: `unsquashfs -lls` prints a
    symbolic link's target unescaped, and a target's newlines make lines
    of the image's choosing. Unavailable when the file cannot be served."""
    if not _posing_as_parts(image):
        return 0
    fd = os.open(image, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return int(_in_own_namespace(lambda: _served_top(fd, os.path.dirname(image) or ".")))
    except Unavailable as e:
        raise Unavailable(f"{image} cannot be looked into: {e}") from None
    finally:
        os.close(fd)


def _posing_as_parts(image):
    """Whether the squashfs file `image` has any entry at a marker's path
    (`.berth-top.N/.berth-top.N`): only then is it served to be looked at
    (a plain image, the usual one, costs one unsquashfs). `-ls` prints
    names alone, and the filter admits only names it spells in full."""
    import subprocess  # (kept off the path of start, which a step waits for)
    listing = subprocess.run(["unsquashfs", "-ls", image, f"{PREFIX}{_DIGIT}/{PREFIX}{_DIGIT}"],
                             capture_output=True, check=False)
    return listing.returncode == 0 and _MARKER_PATH.search(listing.stdout) is not None


def _served_top(fd, mount_point):
    """In a namespace of its own: the squashfs open as `fd` served at
    `mount_point` (hidden there, in this namespace only), and the number of
    its top part as text."""
    _serve(f"/proc/self/fd/{fd}", mount_point, pass_fds=(fd,))
    try:
        top = top_of_mounted(mount_point)
    finally:
        sc.umount2(mount_point, sc.MNT_DETACH)
    return str(int(top[len(PREFIX):]) if top else 0)


def _serve(image, mount_point, pass_fds=()):
    """Serve the squashfs `image` at `mount_point` with squashserve's server
    for the image's own owners (in a namespace where this process is root:
    squashfuse_ll wherever it is installed, which shows hard links as one
    inode, as `cp -a` in unpack() keeps them); OSError saying why not."""
    import subprocess  # (kept off the path of start, which a step waits for)
    server = squashserve.argv(imagefile.Squashfs(image), foreground=False)
    program = server[0]
    served = subprocess.run([*server, mount_point], capture_output=True,
                            check=False, pass_fds=pass_fds)
    if served.returncode != 0:
        lines = served.stderr.decode(errors="replace").strip().splitlines()
        raise OSError(f"{program} cannot serve {image}: "
                      f"{lines[-1] if lines else f'exit {served.returncode}'}")


def whiteouts(number):
    """mksquashfs pseudo definitions of top part `number`: a whiteout of
    every part's name, its own included."""
    args = []
    for below in range(1, number + 1):
        args += ["-p", f"{name(number)}/{name(below)} c 0000 0 0 0 0"]
    return args


def apply_over(lowers, merged, apply, upper=None, work=None, image=None, mount_points=()):
    """Run apply(merged) in a child, in a user namespace of its own where
    `merged` is a kernel overlay of `lowers` (lowerdir's list), writable
    into `upper` (with `work`) when given; with `image`, that squashfs
    served at each of `mount_points` first. Unavailable when the namespace,
    squashfuse or the overlay cannot be had; apply's BerthError comes back
    as one."""
    for directory in (*lowers.split(":"), upper or "", work or ""):
        if sc.overlay_unsafe(directory):
            raise Unavailable(f"{directory}: a path with ',', ':' or '\\' cannot be an "
                              "overlay's directory")
    options = f"lowerdir={lowers},userxattr"
    if upper is not None:
        # volatile: its unmount syncs nothing (else the whole file system the
        # upper directory is on, the unpacked lower layers too: seconds)
        options += f",upperdir={upper},workdir={work},volatile"
    for directory in (merged, *mount_points):
        os.makedirs(directory, exist_ok=True)

    def overlaid():
        for mount_point in mount_points:
            _serve(image, mount_point)
        sc.mount("overlay", merged, "overlay", 0, options)
        try:
            apply(merged)
        finally:  # unmounted here, so that each squashfuse ends with this process
            for mounted in (merged, *mount_points):
                sc.umount2(mounted, sc.MNT_DETACH)
        return ""

    _in_own_namespace(overlaid)


def _in_own_namespace(job):
    """What job() returns (text), run in a child in a user and mount
    namespace of its own (_own_namespace), which ends with it. Unavailable
    when the namespace or a mount cannot be had; job's BerthError comes
    back as one."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child says how it ended through the pipe
        os.close(read_fd)
        status, said = 1, b""
        try:
            sc.prctl(sc.PR_SET_PDEATHSIG, signal.SIGKILL)
            _own_namespace()
            said = b"done " + job().encode()
            status = 0
        except BerthError as e:
            said = b"error " + str(e).encode(errors="replace")
        except (Unavailable, OSError) as e:
            said = b"unavailable " + str(e).encode(errors="replace")
        except BaseException as e:  # noqa: B036 - the child must reach os._exit
            said = b"unavailable " + repr(e).encode(errors="replace")
        finally:
            with contextlib.suppress(BaseException):
                os.write(write_fd, said[:4000])
            os._exit(status)
    os.close(write_fd)
    try:
        with os.fdopen(read_fd, "rb") as f:
            said = f.read().decode(errors="replace")
        _, wait_status = os.waitpid(pid, 0)
    except BaseException:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        raise
    kind, _, message = said.partition(" ")
    if wait_status == 0 and kind == "done":
        return message
    if kind == "error":
        raise BerthError(message)
    raise Unavailable(message or f"exit status {wait_status}")


def remove_work(work):
    """Remove an overlay's work directory: the kernel leaves a directory in
    it that not even its owner may enter (mode 0)."""
    for top, dirs, _ in os.walk(work):
        for directory in dirs:
            with contextlib.suppress(OSError):
                os.chmod(os.path.join(top, directory), 0o700)
    shutil.rmtree(work, ignore_errors=True)


def _own_namespace():
    """A user and mount namespace where this process is root, mapped to its
    own uid and gid outside (a mount there makes nothing visible outside)."""
    uid, gid = os.getuid(), os.getgid()
    sc.unshare(sc.CLONE_NEWUSER | sc.CLONE_NEWNS)
    for file, text in (("setgroups", "deny"), ("uid_map", f"0 {uid} 1"),
                       ("gid_map", f"0 {gid} 1")):
        with open(f"/proc/self/{file}", "w", encoding="ascii") as f:
            f.write(text)
    sc.mount("none", "/", None, sc.MS_REC | sc.MS_PRIVATE)


def guard(root):
    """apply_layer's guard for a tree that holds parts or will: a layer
    that would make, change, remove or link to a `.berth-top.*` name at
    the root is Unavailable. Such an image is imported whole, where the
    name is one of the image's like any other (only a part's marker, which
    no layer can make, makes a directory of that name a part)."""
    def check(path, digest):
        first = os.path.relpath(path, root).split(os.sep, 1)[0]
        if first.startswith(PREFIX):
            raise Unavailable(f"layer {digest} touches /{first}")
    return check


def check_lower(root, number):
    """Refuse (Unavailable) the lower tree `root` of top part `number` when
    a `.berth-top.*` name at its root is not a part below `number` (an
    entry made before layers were guarded: its whiteouts would hide the
    name, an append of the same name would be renamed)."""
    for entry in os.listdir(root):
        match = _NAME.fullmatch(entry)
        below = match and int(match.group(1)) < number and _is_part(root, int(match.group(1)))
        if entry.startswith(PREFIX) and not below:
            raise Unavailable(f"the image has /{entry} at its root")


def check_top(upper):
    """Refuse (Unavailable) a top part that cannot be stacked as it is: one
    with a `.berth-top.*` name at the root (the layers are guarded; Berth's
    own image files are not, and a lower symbolic link could lead them
    there), or that has Berth's image.json elsewhere than at etc/berth (a
    symbolic link in the lower tree led it away: readers of the file look
    for it there)."""
    taken = [entry for entry in os.listdir(upper) if entry.startswith(PREFIX)]
    if taken:
        raise Unavailable(f"the image has /{taken[0]} at its root")
    try:
        found = os.lstat(os.path.join(upper, IMAGE_JSON))
    except OSError:
        found = None
    if found is None or not stat.S_ISREG(found.st_mode):
        raise Unavailable(f"its /{IMAGE_JSON} is not a file of the top part")


def unpack(image, target, top):
    """Copy the merged tree of the parted squashfs file `image`, whose top
    part is `top` (top_of_file, which the caller asked already), into the
    existing directory `target`, as unsquashfs copies a plain one (modes,
    times, links; every file the caller's)."""
    work = f"{target.rstrip('/')}.parts"
    os.mkdir(work, 0o700)
    mounted, again = os.path.join(work, "image"), os.path.join(work, "top")

    def copy(merged):
        import subprocess  # (kept off the path of start, which a step waits for)
        result = subprocess.run(["cp", "-a", "--no-preserve=ownership", f"{merged}/.",
                                 f"{target}/"], capture_output=True, check=False)
        if result.returncode != 0:
            lines = result.stderr.decode(errors="replace").strip().splitlines()
            raise BerthError(f"unpacking {image}: {lines[-1] if lines else 'cp failed'}")

    try:
        apply_over(f"{again}/{top}:{mounted}", os.path.join(work, "merged"),
                   copy, image=image, mount_points=(mounted, again))
    except Unavailable as e:
        raise BerthError(f"unpacking {image} (an image kept as parts): {e}") from None
    finally:
        for directory in ("merged", "image", "top", ""):
            with contextlib.suppress(OSError):
                os.rmdir(os.path.join(work, directory))
