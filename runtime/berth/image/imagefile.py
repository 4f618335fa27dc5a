"""An image file named by path, as `start`, `create` and `-m SRC:DST:sqsh`
take it: a squashfs, or a SIF file whose system partition is one (read in
place at its offset)."""

import os
import stat
from typing import NamedTuple

from berth.errors import BerthError
from berth.image import sif
from berth.image.imageconfig import SQUASHFS_MAGIC

SUFFIXES = (".sqsh", ".sif")  # what makes a start's or create's target a file, not a name


class Squashfs(NamedTuple):
    path: str        # absolute
    offset: int = 0  # where the squashfs starts in the file: 0, or a SIF partition's offset
    sif: object = None  # the sif.Image it is the partition of, or None


def locate(path):
    """The Squashfs of the image file `path`; one line naming it when it is
    none (missing, a directory, a FIFO, another format, a bad SIF file)."""
    fd = open_regular(path)
    try:
        head = os.pread(fd, 64, 0)
        if head[:4] == SQUASHFS_MAGIC:
            return Squashfs(os.path.abspath(path))
        if sif.has_magic(head):
            image = sif.read(fd, path)
            return Squashfs(os.path.abspath(path), image.offset, image)
        raise BerthError(f"{path}: not a squashfs or SIF image")
    except OSError as e:  # a "regular" file that cannot be read: /proc/self/mem (EIO)
        raise BerthError(f"{path}: cannot read: {e.strerror}") from None
    finally:
        os.close(fd)


def open_regular(path):
    """`path` opened for reading, refused in one line unless it is a regular
    file (opening a FIFO would block; a directory would fail later)."""
    if not path:  # (else the line would start ": No such file")
        raise BerthError("'': an empty path is no image file")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as e:
        raise BerthError(f"{path}: {e.strerror}") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = "a directory" if stat.S_ISDIR(mode) else "not a regular file"
        raise BerthError(f"{path}: is {kind}, not a squashfs or SIF image")
    return fd
