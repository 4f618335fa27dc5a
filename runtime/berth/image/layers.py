"""Apply image layers (tar archives) to a root directory, as overlayfs would.

Whiteouts: `.wh.NAME` deletes NAME from the layers below, `.wh..wh..opq`
empties its directory of what the layers below put there.

Layers come from anywhere, so nothing in one may write outside the root:
entry and hard-link names with `..` or a leading `/` are refused, and every
path is resolved inside the root as if the root were `/` (a symlink to
`/etc` or `../../..` leads back into the root, never out of it). Device
nodes are skipped, setuid/setgid bits dropped, ownership ignored (an
unprivileged user cannot chown). Owners keep read access to files and full
access to directories, so the user can pack and later unpack the tree.
No path may lie more than MAX_DEPTH directories below the root (Python's
own tree walks recurse, and nothing real comes close), and whatever a
layer holds, a failure is a BerthError naming the layer.

Unpacking for the shared store (its service's temporary tree is on the
node's own disk) keeps that filesystem's free floor (squash.free_floor):
each entry is counted against the room measured before it, and measured
again when the count runs out, so a layer that unpacks to far more than its
compressed size is refused before it fills the disk. A user's own import
writes until her own space ends (ENOSPC, said as such).

Layers are unpacked in a temporary tree `berth-import-<pid>-XXXXXXXX`,
locked (flock) by the import for its whole life: a tree left by an import
killed with SIGKILL is removed by a later import or `berth cache prune` of
the same user, once its owner pid is gone and its lock free.
"""

import contextlib
import errno
import fcntl
import os
import posixpath
import re
import shutil
import signal
import stat
import subprocess
import tarfile
import tempfile

from berth.errors import BerthError
from berth.image.squash import free_floor
from berth.rootpath import resolve
from berth.syscalls import pid_alive

WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"
_GZIP_MAGIC = b"\x1f\x8b"
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
# tarfile reads a stream in pieces of this size (default 10 KiB); larger
# pieces unpack a real image about a quarter faster, much larger ones slower.
TAR_BUFFER = 1 << 16
MAX_DEPTH = 512
ROOT_MODE = 0o755
_UNPACK_PREFIX = "berth-import-"
_UNPACK_NAME = re.compile(r"berth-import-([1-9][0-9]{0,9})-[a-z0-9_]{8}")
# What a Room counts for each entry besides a file's data: its inode and
# directory slot, about one block.
_ENTRY_BYTES = 4096


def compression(magic):
    """What a layer or an image archive whose first four bytes are `magic` is
    compressed with: "gzip" or "zstd"; None for a plain tar."""
    if magic.startswith(_GZIP_MAGIC):
        return "gzip"
    return "zstd" if magic == _ZSTD_MAGIC else None


def decompressor(magic, gzip_program):
    """The command that writes out decompressed what compression(magic)
    names; None for a plain tar."""
    return {"gzip": [gzip_program, "-d", "-c"], "zstd": ["zstd", "-d", "-c", "-q"],
            None: None}[compression(magic)]


class Room:
    """The bytes that may still be written under `root` and leave its
    filesystem its free floor, counted down entry by entry."""

    def __init__(self, root):
        self.root = root
        self.left = self._measure()

    def _measure(self):
        st = os.statvfs(self.root)
        self.floor = free_floor(st)
        return st.f_bavail * st.f_frsize - self.floor

    def take(self, name, size, digest):
        """Count entry `name` with `size` bytes of data, or refuse it."""
        needed = _ENTRY_BYTES + size
        if needed > self.left:
            self.left = self._measure()  # what others freed or took meanwhile counts
            if needed > self.left:
                raise BerthError(f"layer {digest}: '{_shorten(name)}' ({size} bytes) would "
                                 f"leave the filesystem of {self.root} under the "
                                 f"{self.floor} bytes kept free there; refusing the layer")
        self.left -= needed


def apply_layer(root, path, digest, gzip_program, room=None, guard=None):
    """Apply the layer file `path` (tar, gzip or zstd) to `root`, within
    `room` (a Room) where one is given; guard(path, digest), where given,
    is called with each path the layer would make, change, remove or link
    to, before it does (it raises to refuse the layer)."""
    read_layer(path, digest, gzip_program,
               lambda stream: _apply_tar(root, stream, digest, room, guard))


def new_root(root):
    """Make the directory layers are applied to: 0755 unless a layer says
    otherwise, whatever the umask (the image is the same whoever made it)."""
    os.mkdir(root)
    os.chmod(root, ROOT_MODE)


def read_layer(path, digest, gzip_program, consume):
    """consume(stream) the layer file `path` as a plain tar stream: a
    gzip or zstd layer through its decompressing program, whose failure
    is the layer's (a BerthError naming it)."""
    with open(path, "rb") as f:
        command = decompressor(f.read(4), gzip_program)
    with open(path, "rb") as raw:
        if command is None:
            consume(raw)
            return
        try:
            proc = subprocess.Popen(command, stdin=raw, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE)
        except OSError as e:
            raise BerthError(f"cannot run {command[0]} for layer {digest}: {e.strerror}") \
                from None
        tar_error = None
        try:
            consume(proc.stdout)
            # tar ends with zero blocks; drain the rest so the program exits cleanly.
            while proc.stdout.read(1 << 16):
                pass
        except BerthError as e:
            tar_error = e  # a broken stream shows as a bad tar: the program says why
        except BaseException:
            proc.kill()  # (SIGTERM, say): no waiting for the program to finish
            raise
        finally:
            proc.stdout.close()
            stderr = proc.stderr.read().decode(errors="replace").strip()
            proc.stderr.close()
            status = proc.wait()
        # A program killed by the pipe we closed early did not fail itself.
        if tar_error and status in (0, -signal.SIGPIPE):
            raise tar_error
        if status != 0:
            raise BerthError(f"layer {digest}: {command[0]} -d failed: "
                             f"{stderr.splitlines()[-1] if stderr else f'exit {status}'}")


def _apply_tar(root, stream, digest, room, guard):
    created = set()  # host paths this layer made: an opaque marker spares them
    dir_times = {}
    try:
        with tarfile.open(fileobj=stream, mode="r|", bufsize=TAR_BUFFER) as archive:
            for member in archive:
                if room is not None:
                    room.take(member.name, member.size if member.isreg() else 0, digest)
                _apply_member(root, archive, member, created, dir_times, digest,
                              guard or _anything)
    except (tarfile.TarError, EOFError, ValueError, OverflowError) as e:
        # (a malformed header can surface as any of these from tarfile)
        raise BerthError(f"layer {digest} is not a valid tar archive: {e}") from None
    except RecursionError:
        raise BerthError(f"layer {digest}: paths nested too deeply") from None
    except OSError as e:
        if e.errno == errno.ENOSPC:
            free = shutil.disk_usage(root).free
            raise BerthError(f"no space left in {root} unpacking layer {digest} "
                             f"({free} bytes free)") from None
        raise BerthError(f"layer {digest}: {e.strerror}: "
                         f"{e.filename.removeprefix(root) if e.filename else ''}") from None
    for path, mtime in dir_times.items():
        # A later entry may have made a parent a symlink: set no time through it.
        if resolve(root, path[len(root):]) == path:
            _set_mtime(path, mtime)


def _set_mtime(path, mtime):
    """Set `path`'s times to a layer's mtime, unless no file system can hold it."""
    try:
        os.utime(path, (mtime, mtime), follow_symlinks=False)
    except (OverflowError, ValueError):
        pass  # (NaN, or past what time_t holds): the time of the unpack stays
    except (FileNotFoundError, NotADirectoryError):
        pass  # a later entry of the layer removed it, or made a parent a file


def entry_name(name, digest, what="entry"):
    if name.startswith("/") or ".." in name.split("/"):
        raise BerthError(f"layer {digest}: {what} '{name}' points outside the image root; "
                         "refusing the layer")
    return name


def _remove(path):
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISDIR(mode):
        shutil.rmtree(path)
    else:
        os.unlink(path)


def _anything(path, digest):
    """The guard of a layer applied with none: every path is the layer's."""


def _apply_member(root, archive, member, created, dir_times, digest, guard):
    name = entry_name(member.name, digest)
    parent_name, base = posixpath.split(name.rstrip("/"))
    if base == OPAQUE:
        directory = resolve(root, parent_name, follow_last=True)
        if os.path.isdir(directory):
            for child in os.listdir(directory):
                child_path = os.path.join(directory, child)
                if child_path not in created:
                    guard(child_path, digest)
                    _remove(child_path)
        return
    if base.startswith(WHITEOUT):
        hidden = base[len(WHITEOUT):]
        if hidden in ("", ".", ".."):
            raise BerthError(f"layer {digest}: whiteout '{name}' names no file")
        hidden_path = resolve(root, posixpath.join(parent_name, hidden))
        guard(hidden_path, digest)
        _remove(hidden_path)
        return
    if member.ischr() or member.isblk():
        return  # devices come from the host at start, never from an image
    target = resolve(root, name) if base not in ("", ".") else root
    guard(target, digest)
    if target[len(root):].count("/") > MAX_DEPTH:
        raise BerthError(f"layer {digest}: '{_shorten(name)}' lies more than {MAX_DEPTH} "
                         "directories deep; refusing the layer")
    if target == root:
        if member.isdir():
            os.chmod(root, dir_mode(member.mode))
        return
    created.add(target)
    parent = os.path.dirname(target)
    if not os.path.isdir(parent):
        os.makedirs(parent, mode=0o755)
    if member.isdir():
        if not os.path.isdir(target) or os.path.islink(target):
            _remove(target)
            os.mkdir(target, 0o700)
        os.chmod(target, dir_mode(member.mode))
        dir_times[target] = member.mtime
        return
    _remove(target)
    if member.isreg():
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as out:
            shutil.copyfileobj(archive.extractfile(member), out, TAR_BUFFER)
            os.fchmod(out.fileno(), file_mode(member.mode))
    elif member.issym():
        os.symlink(member.linkname, target)
    elif member.islnk():
        source = resolve(root, entry_name(member.linkname, digest, "hard link target"))
        guard(source, digest)
        if not os.path.lexists(source):
            raise BerthError(f"layer {digest}: hard link '{name}' to missing "
                             f"'{member.linkname}'")
        os.link(source, target, follow_symlinks=False)
    elif member.isfifo():
        os.mkfifo(target, file_mode(member.mode))
    else:
        return
    _set_mtime(target, member.mtime)


def _shorten(name, keep=60):
    return name if len(name) <= 2 * keep else f"{name[:keep]}...{name[-keep:]}"


def file_mode(mode):
    return (mode & 0o1777) | 0o400


def dir_mode(mode):
    return (mode & 0o1777) | 0o700


# -- the temporary trees layers are unpacked in --------------------------------

@contextlib.contextmanager
def unpack_dir(temp_path):
    """A new directory in `temp_path`, named after and locked by this
    process while in use, removed after."""
    try:
        path = tempfile.mkdtemp(prefix=f"{_UNPACK_PREFIX}{os.getpid()}-", dir=temp_path)
    except OSError as e:
        raise BerthError(f"ENROOT_TEMP_PATH {temp_path}: {e.strerror}") from None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            with contextlib.suppress(OSError):
                # A file system without locks: the pid in the name still
                # keeps this process's tree from its own namespace's sweeps,
                # and a sweep that cannot lock either leaves the tree alone.
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            yield path
        finally:
            os.close(fd)
    finally:
        shutil.rmtree(path, ignore_errors=True)


def remove_stale_unpack_dirs(temp_path):
    """Remove the unpack trees in `temp_path` that imports of this user left
    when killed: their owner pid is gone and their lock free (a live import
    in another pid namespace holds its lock). Returns the paths removed."""
    try:
        names = os.listdir(temp_path)
    except OSError:
        return []
    removed = []
    for name in names:
        match = _UNPACK_NAME.fullmatch(name)
        if not match or pid_alive(int(match.group(1))):
            continue
        path = os.path.join(temp_path, name)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError:
            continue  # gone, a symlink, not ours to read
        try:
            if os.fstat(fd).st_uid != os.geteuid():
                continue  # another user's: never ours to judge
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # its import is alive
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
        finally:
            os.close(fd)
    return removed

