"""squashfs images made with mksquashfs, copied into place, checked for
truncation, and the free-space checks around them."""

import json
import os
import shlex
import shutil
import struct
import subprocess
import sys

from berth.errors import BerthError
from berth.image import parts, sif
from berth.image.imageconfig import IMAGE_JSON, SQUASHFS_MAGIC
from berth.image.reference import DIGEST  # (the form of image.json's "digest")

# What the store's imports and node-local copies leave free on the node's
# filesystem they write: a share of it, and at least so many bytes (any
# user can ask the store for any image, and a layer may unpack to far more
# than its compressed size).
FREE_FLOOR_SHARE = 0.10
FREE_FLOOR_BYTES = 1 << 30


def free_floor(st):
    """The bytes kept free on a filesystem, from its statvfs result."""
    return max(int(st.f_blocks * st.f_frsize * FREE_FLOOR_SHARE), FREE_FLOOR_BYTES)


def free_bytes(path):
    """Free bytes on the filesystem that holds `path` (or would, once created)."""
    path = os.path.abspath(path)
    while not os.path.exists(path):
        path = os.path.dirname(path)
    return shutil.disk_usage(path).free


def require_space(path, needed, purpose):
    """Fail before starting work that cannot fit, not half way through it."""
    free = free_bytes(path)
    if free < needed:
        raise BerthError(f"not enough space in {path} for {purpose}: {free} bytes free, "
                         f"at least {needed} needed")


def options(cfg):
    """ENROOT_SQUASH_OPTIONS as mksquashfs arguments."""
    try:
        return shlex.split(cfg["ENROOT_SQUASH_OPTIONS"])
    except ValueError as e:
        raise BerthError(f"ENROOT_SQUASH_OPTIONS: {e}") from None


# mksquashfs's memory, unless ENROOT_SQUASH_OPTIONS says (-mem): its default,
# a quarter of the node's, made its resident set 1.8 GB packing a 2 GiB image
# (bench/import.py); this much packs it as fast in a tenth of that.
MKSQUASHFS_MEMORY = "256M"


def packer_options(cfg):
    """What mksquashfs is given of the site's, packing a tree or a tar
    stream: its options, the memory it may take, the processors it may use."""
    site_options = options(cfg)
    memory = [] if "-mem" in site_options else ["-mem", MKSQUASHFS_MEMORY]
    return [*site_options, *memory, "-processors", str(cfg.number("ENROOT_MAX_PROCESSORS"))]


# mksquashfs's action: no setuid or setgid bit on anything but a directory
# (where setgid only passes the group on)
_STRIP_SETUID = "chmod(ug-s)@!type(d) && perm(/u+s,g+s)"


def make_squashfs(root, output, cfg, show_progress, all_root=True, strip_setuid=False,
                  verbose=False, append_to=None, move_base=False, pseudo=()):
    """Pack `root` into `output` (0644 less the umask) through a temporary
    file next to it, replacing any `output` there; with `append_to` (a
    squashfs made with the same options), into a copy of that file, as a
    directory named as `root` beside what it holds (parts.py), with the
    mksquashfs `pseudo` definitions (move_base: that file is a temporary
    one of ours, taken rather than copied). show_progress: its
    progress bar on stderr; verbose: all it prints (the thirty lines of
    statistics enroot shows), else nothing but the bar. all_root stores every
    file as root's: a tree an unprivileged process unpacked (layers, or a
    container made by `berth create`) is all that user's, so the image is the
    same whoever made it, and its directories stay writable to root in a
    container. strip_setuid drops the setuid and setgid bits of files: in
    an image all root's, they would be root's."""
    partial = f"{output}.tmp-{os.getpid()}"
    # (appending, mksquashfs would write a recovery file into the current directory)
    where = ["-keep-as-directory", "-no-recovery", *pseudo] if append_to else ["-noappend"]
    command = ["mksquashfs", root, partial, *where, *(["-all-root"] if all_root else []),
               *packer_options(cfg), *(["-action", _STRIP_SETUID] if strip_setuid else [])]
    if not show_progress and not verbose:  # (-quiet would do, but squashfs-tools 4.4 lacks it)
        command.append("-no-progress")
    try:
        if append_to:
            (os.rename if move_base else shutil.copyfile)(append_to, partial)
        if verbose:
            result = subprocess.run(command, stdout=sys.stderr, stderr=subprocess.PIPE,
                                    text=True, check=False)
            said = result.stderr
        else:
            result = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            try:
                said = _relay_progress(result.stdout, show_progress)
                result.wait()
            except BaseException:  # (SIGTERM, say): no waiting for it to finish
                result.kill()
                result.wait()
                raise
            finally:
                result.stdout.close()
        if result.returncode != 0:
            raise BerthError(f"mksquashfs failed for {output}: "
                             f"{failure(said, result.returncode, output)}")
        os.chmod(partial, 0o644 & ~umask())
        os.rename(partial, output)
    except FileNotFoundError as e:
        if e.filename == "mksquashfs":
            raise BerthError("mksquashfs not found: install squashfs-tools") from None
        raise
    finally:
        if os.path.lexists(partial):
            os.unlink(partial)


def failure(said, returncode, output):
    """Why mksquashfs failed, from what it said: its error lines (stderr)
    come before its buffered stdout's (`Creating 4.0 filesystem ...`), so
    its last line is no reason; a full file system is named as such."""
    lines = (said or "").strip().splitlines()
    directory = os.path.dirname(os.path.abspath(output))
    if any("No space left on device" in line for line in lines):
        mount_point = directory
        while not os.path.ismount(mount_point):
            mount_point = os.path.dirname(mount_point)
        return (f"the file system mounted at {mount_point} is full "
                f"({free_bytes(output)} bytes free in {directory})")
    reasons = [line for line in lines if line.startswith("FATAL ERROR")] or lines
    return (f"{reasons[-1] if reasons else f'exit {returncode}'} "
            f"({free_bytes(output)} bytes free in {directory})")


def _relay_progress(stream, show):
    """mksquashfs's output, read to its end and returned as text (its errors
    are the last line); with show, its progress bar (from the first carriage
    return to the statistics, which begin "Exportable") copied to stderr as
    it comes."""
    seen, sent, start, done = bytearray(), 0, -1, not show
    while chunk := stream.read1(1 << 12):
        before = len(seen)
        seen += chunk
        if done:
            continue
        if start < 0:
            start = seen.find(b"\r")
            if start < 0:
                continue
            sent = start
        end = seen.find(b"Exportable", max(start, before - len(b"Exportable")))
        if end < 0:  # (a newline may end the bar, or begin the statistics: held back)
            upto = len(seen)
            while upto > sent and seen[upto - 1] == ord("\n"):
                upto -= 1
        else:  # the bar's last line, with its newline
            upto, done = seen.find(b"\n", seen.rfind(b"\r", 0, end)) + 1 or end, True
        if upto > sent:
            sys.stderr.buffer.write(bytes(seen[sent:upto]))
            sys.stderr.flush()
            sent = upto
    if start >= 0 and sent > start and seen[sent - 1] != ord("\n"):
        sys.stderr.write("\n")
    return seen.decode(errors="replace")


def copy_image(image, output, replace):
    """Copy `image` to `output` through a temporary file next to it: a copy,
    never a link, so writing to `output` cannot change `image`."""
    partial = f"{output}.tmp-{os.getpid()}"
    try:
        shutil.copyfile(image, partial)
        if not replace and os.path.lexists(output):
            raise BerthError(f"{output} already exists; remove it or set "
                             "ENROOT_FORCE_OVERRIDE=yes")
        os.rename(partial, output)
    finally:
        if os.path.lexists(partial):
            os.unlink(partial)


# The superblock starts with the magic; bytes_used, at offset 40, is how
# much of the file the filesystem fills (mksquashfs pads the rest).
_SUPERBLOCK = struct.Struct("<4s36xQ")


def looks_whole(path):
    """Whether `path` is a squashfs no shorter than its superblock says:
    cheap, and catches the truncated file a full disk or a crash leaves."""
    with open(path, "rb") as f:
        return looks_whole_fd(f.fileno())


def looks_whole_fd(fd):
    """looks_whole of a file open for reading as `fd`: a whole squashfs, or a
    SIF file whose system partition is one (what the cache keeps of a SIF
    image pulled from a registry)."""
    head = os.pread(fd, _SUPERBLOCK.size, 0)
    size = os.fstat(fd).st_size
    if len(head) < _SUPERBLOCK.size:
        return False
    if sif.has_magic(head):
        try:
            sif.read(fd, "")
        except BerthError:
            return False
        return True
    magic, used = _SUPERBLOCK.unpack(head)
    return magic == SQUASHFS_MAGIC and 0 < used <= size


def recorded(image, key):
    """The string `key` of the image's etc/berth/image.json, read without
    mounting it (of a SIF file, Berth's record in it); None when there is
    no such file or string."""
    text = _sif_record(image)
    if text is None:
        top = parts.top_of_file(image)  # an image kept as parts: its top's file
        result = subprocess.run(["unsquashfs", "-cat", image,
                                 f"{top}/{IMAGE_JSON}" if top else IMAGE_JSON],
                                capture_output=True)
        text = result.stdout if result.returncode == 0 else None
    try:
        value = json.loads(text)[key] if text is not None else None
    except (ValueError, TypeError, KeyError):
        value = None
    return value if isinstance(value, str) else None


def _sif_record(image):
    """The text of Berth's record in the SIF file `image`; None for a
    squashfs, an unreadable file or a SIF file without one."""
    try:
        fd = os.open(image, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not sif.has_magic(os.pread(fd, 64, 0)):
            return None
        return sif.read_record(fd, sif.read(fd, image))
    except (OSError, BerthError):
        return None
    finally:
        os.close(fd)


def recorded_digest(image):
    """The digest the image was pulled by, as its image.json records it."""
    digest = recorded(image, "digest")
    if digest is None or not DIGEST.fullmatch(digest):
        raise BerthError(f"{image}: no digest in its {IMAGE_JSON}")
    return digest


def umask():
    """This process's umask: from /proc (setting it and back would leave it
    0 for a moment to the import's download threads), else by setting it
    back."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0)
    os.umask(mask)
    return mask
