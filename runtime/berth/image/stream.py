"""An image's layers packed into a squashfs without unpacking them.

The layers are read top layer first, each once, and every entry that the
layers above leave visible is passed on, in one tar stream, to `mksquashfs
-tar` (squashfs-tools 4.5 and later; its `sqfstar` is the same, but 4.5's
takes no compressor options), which packs it as it comes: no tree of the
image is written to disk and read back, and the image's bytes are
decompressed once. Berth's own files (image.json, /etc/environment,
/etc/rc) come first, above every layer.

An entry is hidden when a layer above has an entry of the same name, a
whiteout of it or of a directory above it, an opaque marker in a directory
above it, or a file where one of its directories would be. That is what
applying the layers in order gives (layers.apply_layer) as long as no
entry's path leads through a symbolic link and no layer contradicts itself.
Where a layer could make the two differ, the merge stops (NotStreamable)
and the caller applies the layers in order instead: a path through a name
that some layer makes a symbolic link, a file or link where a layer put
entries below, one name twice in a layer, a whiteout or opaque marker
after entries of its own layer that it would remove, a hard link to
anything but a file of its own layer, an entry of an unknown type, a name
that is not UTF-8 or lies deeper than layers.MAX_DEPTH. The same rules as
apply_layer's hold for every entry of every layer, hidden or not: names
with `..` or a leading `/` are refused, devices skipped, ownership dropped,
setuid and setgid bits dropped, and the guard (parts.guard) and the Room
see every path.
"""

import contextlib
import errno
import functools
import io
import os
import subprocess
import sys
import tarfile
import tempfile
import time
import zlib

from tqdm import tqdm

from berth.errors import BerthError
from berth.image import squash
from berth.image.layers import (
    MAX_DEPTH,
    OPAQUE,
    ROOT_MODE,
    WHITEOUT,
    compression,
    dir_mode,
    entry_name,
    file_mode,
    read_layer,
)

_PACKER = "mksquashfs"
_NAME_MAX = 255
# The pieces a file's bytes are copied in from a layer to the packer.
_COPY_BUFFER = 1 << 17
# What a layer's stream is read ahead by, what the packer is written in,
# and the smallest file whose bytes the kernel moves between them.
_CHUNK = _FLUSH = 1 << 16
_SPLICE_MIN = 1 << 16
_MTIME_MAX = (1 << 32) - 1  # squashfs keeps 32-bit times
_PEEK = 1 << 16  # what is read of a layer for its first entry


class NotStreamable(Exception):
    """These layers must be applied in order to know their tree."""


@functools.cache
def available():
    """Whether this node's mksquashfs packs a tar stream (-tar: 4.5 on)."""
    try:
        said = subprocess.run([_PACKER, "-help"], capture_output=True, text=True, check=False)
    except OSError:
        return False
    return "\n-tar" in said.stdout + said.stderr


def squash_layers(layers, output, cfg, files=(), room=None, guard=None, show_progress=False,
                  verbose=False, ready=None):
    """Pack `layers` ((path, digest) each, bottom layer first) and above
    them `files` (imageconfig.image_files) into the squashfs `output`
    (0644 less the umask), through a temporary file beside it. room and
    guard as apply_layer takes them, the guard called with each path as
    `/NAME` (parts.guard("/") checks it).
    ready(digest), where given, returns once that layer's file is whole
    (one being downloaded meanwhile). NotStreamable: nothing was written;
    apply the layers in order."""
    if not available():
        raise NotStreamable(f"{_PACKER} has no -tar (squashfs-tools before 4.5)")
    merge = _Merge(guard)
    root_mode = _root_mode(layers)
    partial = f"{output}.tmp-{os.getpid()}"
    said = tempfile.TemporaryFile()
    packer = None
    try:
        packer = subprocess.Popen(
            # (-exports: as an image packed from a tree is, for the parts appended to it)
            [_PACKER, "-", partial, "-tar", "-exports", *squash.packer_options(cfg), "-all-root",
             "-root-mode", f"{root_mode:o}", "-no-progress",
             # (its statistics, as enroot shows them, only with --verbose)
             *([] if verbose else ["-quiet"])],
            stdin=subprocess.PIPE, stdout=said, stderr=subprocess.STDOUT)
        try:
            merge.out = _TarOut(packer.stdin.fileno())
            merge.add_files(files)
            for path, digest in tqdm(layers[::-1], desc="packing", unit="layer",
                                     disable=not show_progress):
                if ready is not None:
                    ready(digest)
                read_layer(path, digest, cfg["ENROOT_GZIP_PROGRAM"],
                           lambda stream, digest=digest: merge.add_layer(stream, digest,
                                                                         room))
                if merge.linked_to_hidden:  # (its files' bytes went by: read it again)
                    read_layer(path, digest, cfg["ENROOT_GZIP_PROGRAM"],
                               lambda stream, digest=digest: merge.add_links(stream, digest))
            merge.finish()
            merge.out.end()
            packer.stdin.close()
        except BrokenPipeError:
            pass  # the packer stopped: its status says why
        except BaseException:
            packer.kill()
            raise
        finally:
            # (what is left in the pipe's buffer goes nowhere: not even at exit)
            with contextlib.suppress(BrokenPipeError):
                packer.stdin.close()
            status = packer.wait()
        said.seek(0)
        text = said.read().decode(errors="replace").strip()
        if verbose and text:
            print(text, file=sys.stderr)
        if status != 0:
            raise BerthError(f"{_PACKER} failed for {output}: "
                             f"{squash.failure(text, status, output)}")
        if (merge.root_mode or ROOT_MODE) != root_mode:
            raise NotStreamable("the root's mode is set past a layer's first entry")
        os.chmod(partial, 0o644 & ~squash.umask())
        os.rename(partial, output)
    except FileNotFoundError as e:
        if e.filename == _PACKER:
            raise NotStreamable(f"{_PACKER} not found") from None
        raise
    finally:
        said.close()
        if packer is not None and packer.poll() is None:
            packer.kill()
            packer.wait()
        if os.path.lexists(partial):
            os.unlink(partial)


def _root_mode(layers):
    """The root's mode as the topmost layer that begins with a root entry
    sets it, of those whole now (the packer takes it before the first
    entry: a root entry later in a layer, or in one still being
    downloaded, that sets another is NotStreamable at the end)."""
    for path, _ in layers[::-1]:
        if not os.path.isfile(path):
            break
        first = _first_entry(path)
        if first is not None and first.isdir() and \
                not [part for part in first.name.split("/") if part not in ("", ".")]:
            return dir_mode(first.mode)
    return ROOT_MODE


def _first_entry(path):
    """The first entry of a plain or gzip layer, from its first bytes; None
    when they hold none (a zstd layer, a long name, a broken stream)."""
    with open(path, "rb") as f:
        head = f.read(_PEEK)
    kind = compression(head[:4])
    try:
        if kind == "gzip":
            head = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(head, _PEEK)
        elif kind is not None:
            return None
        with tarfile.open(fileobj=io.BytesIO(head), mode="r|") as archive:
            return archive.next()
    except (zlib.error, tarfile.TarError, EOFError, ValueError, OverflowError):
        return None


def _ancestors(path):
    """The directories above `path` ("a/b/c": "a/b", "a", and "" the root)."""
    while path:
        cut = path.rfind("/")
        path = path[:cut] if cut > 0 else ""
        yield path


class _Merge:
    """What the layers read so far (the upper ones) have decided, and the
    tar stream of what they let through."""

    def __init__(self, guard):
        self.guard = guard
        self.out = None
        self.decided = {}       # name -> is a directory: the first entry of a name wins
        self.lowest = _Lowest()
        self.traversed = set()  # names some entry's path led through, as directories
        self.below = set()      # directories above entries passed on
        self.number = 0
        self.root_mode = None
        self.linked_to_hidden = {}  # in the layer read: a hidden file -> its links' names
        self.berth_files = set()  # (written over a file, never over a directory)
        self.umask = squash.umask()  # (apply_layer's mkdir and mkfifo take it)

    # -- a layer ----------------------------------------------------------

    def add_layer(self, stream, digest, room):
        """Pass on what the tar `stream` of a layer below those read so far
        leaves visible."""
        self.layer = _Layer()
        self.linked_to_hidden = {}

        def visit(archive, member):
            if room is not None:
                room.take(member.name, member.size if member.isreg() else 0, digest)
            self._member(archive, member, digest)

        _each_member(stream, digest, visit)
        self._end_layer()

    def _end_layer(self):
        """What the layer read did, for the layers below it: its whiteouts
        and opaque markers hide what they hold."""
        self.number += 1
        self.lowest.note(self.layer, self.number)
        if self.root_mode is None:
            self.root_mode = self.layer.root_mode

    def _member(self, archive, member, digest):
        """Take the entry `member` of the layer being read: a marker, a
        whiteout, something skipped, the root, or an entry of the image."""
        name = entry_name(member.name, digest)
        parent_name, base = name.rstrip("/").rpartition("/")[::2]
        if base == OPAQUE:
            self._opaque_marker(parent_name, digest)
        elif base.startswith(WHITEOUT):
            self._whiteout(name, parent_name, hidden=base[len(WHITEOUT):], digest=digest)
        elif member.ischr() or member.isblk():
            pass  # devices come from the host at start, never from an image
        elif base in ("", "."):
            if member.isdir():
                self.layer.root_mode = dir_mode(member.mode)
        else:
            self._entry(archive, member, path=self._path(name, digest), digest=digest)

    def _opaque_marker(self, parent_name, digest):
        directory = self._path(parent_name, digest)
        if directory in self.layer.under or not directory and self.layer.seen:
            raise NotStreamable(f"layer {digest}: an opaque marker after entries it empties")
        self._lead_through(directory, including=True)
        self.layer.opaque.add(directory)

    def _whiteout(self, name, parent_name, *, hidden, digest):
        if hidden in ("", ".", ".."):
            raise BerthError(f"layer {digest}: whiteout '{name}' names no file")
        path = self._path(f"{parent_name}/{hidden}", digest)
        self._lead_through(path)
        self._guard(path, digest)
        if path in self.layer.seen or path in self.layer.under:
            raise NotStreamable(f"layer {digest}: a whiteout after entries it removes")
        self.layer.whiteouts.add(path)

    def _entry(self, archive, member, *, path, digest):
        """A file, directory, link or FIFO at `path`: passed on, or hidden
        by the layers above."""
        self._guard(path, digest)
        self._lead_through(path)
        kind = _kind(member)
        source = self._admit(member, path, kind=kind, digest=digest)
        if self._hidden(path):
            self._hide(path, kind)
            return
        self.decided[path] = kind == "dir"
        self._needs_above(path)
        if source is not None and not self.layer.regular[source]:
            # a layer above replaced the file it shares its bytes with: they
            # stay its own (add_links), as os.link made them
            self.linked_to_hidden.setdefault(source, []).append((path, member.mtime))
            return
        self._write(archive, member, path=path, kind=kind, source=source, digest=digest)
        if kind == "file":
            self.layer.regular[path] = True

    def _admit(self, member, path, *, kind, digest):
        """Note the entry in its layer; NotStreamable where applying the
        layers in order could give another tree. A hard link's source, else None."""
        layer = self.layer
        if path in layer.seen or (kind != "dir" and path in layer.under):
            raise NotStreamable(f"layer {digest}: '{path}' twice, or replacing its own entries")
        layer.seen.add(path)
        if kind == "dir" and path in self.berth_files:
            raise NotStreamable(f"layer {digest}: a directory where Berth writes '{path}'")
        if kind == "symlink" and path in self.traversed:
            raise NotStreamable(f"layer {digest}: a path leads through the link '{path}'")
        if kind != "dir":
            layer.files.add(path)
        source = self._link_source(member, digest) if kind == "hardlink" else None
        if kind != "dir" and self._led_through(path):
            raise NotStreamable(f"layer {digest}: '{path}' where a layer above leads through "
                                "it")
        return source

    def _hide(self, path, kind):
        if kind == "file":
            self.layer.regular[path] = False
        if kind != "dir":
            # (applied, it took the place of all the layers below had
            # there, even where a layer above makes it a directory again)
            self.layer.opaque.add(path)
        # (apply_layer made its directories then; those no layer above hides stay)
        self._needs_above(path, self._hidden)

    def _write(self, archive, member, *, path, kind, source, digest):
        """The entry's header (and a file's bytes) on the tar stream, as
        apply_layer would have made it."""
        info = tarfile.TarInfo(path)
        info.mtime = _mtime(member.mtime)
        if kind == "dir":
            info.type, info.mode = tarfile.DIRTYPE, dir_mode(member.mode)
            self.out.add(info)
        elif kind == "file":
            info.size, info.mode = member.size, file_mode(member.mode)
            self.out.add(info, archive, member)
        elif kind == "symlink":
            info.type, info.linkname, info.mode = tarfile.SYMTYPE, member.linkname, 0o777
            _check_text(info.linkname, digest)
            self.out.add(info)
        elif kind == "hardlink":
            info.type, info.linkname = tarfile.LNKTYPE, source
            self.out.add(info)
        else:
            # (apply_layer's mkfifo: the umask applies)
            info.type, info.mode = tarfile.FIFOTYPE, file_mode(member.mode) & ~self.umask
            self.out.add(info)

    def add_links(self, stream, digest):
        """The hard links of the layer just read whose file a layer above
        replaced, from the tar `stream` of that layer read again: the first
        of each file's links as a file of its bytes, the others linked to it."""
        wanted = self.linked_to_hidden

        def visit(archive, member):
            source = self._path(entry_name(member.name, digest), digest)
            if member.isreg() and source in wanted:
                self._add_linked(archive, member, wanted.pop(source))
            return not wanted

        if not _each_member(stream, digest, visit):
            raise BerthError(f"layer {digest} changed while it was read")

    def _add_linked(self, archive, member, links):
        """The file `member` as the first of `links` ((name, mtime) each),
        the others linked to it."""
        first = links[0][0]
        info = tarfile.TarInfo(first)
        info.size, info.mode = member.size, file_mode(member.mode)
        info.mtime = _mtime(links[-1][1])  # (each link applied set it)
        self.out.add(info, archive, member)
        for path, _ in links[1:]:
            link = tarfile.TarInfo(path)
            link.type, link.linkname = tarfile.LNKTYPE, first
            self.out.add(link)

    def _link_source(self, member, digest):
        """The name a hard link entry links to: a file of its own layer."""
        source = self._path(entry_name(member.linkname, digest, "hard link target"), digest)
        self._lead_through(source)
        self._guard(source, digest)
        if source not in self.layer.regular:
            raise NotStreamable(f"layer {digest}: a hard link to '{source}', not a file of "
                                "its own layer")
        return source

    # -- the paths --------------------------------------------------------

    def _path(self, name, digest):
        """`name` as the merge keeps it: its components joined by "/" ("" the
        root); NotStreamable where apply_layer's file system decides."""
        components = name.split("/")
        if "" in components or "." in components:
            components = [part for part in components if part not in ("", ".")]
        if len(components) > MAX_DEPTH:
            raise NotStreamable(f"layer {digest}: a path deeper than {MAX_DEPTH}")
        path = "/".join(components)
        _check_text(path, digest)
        if max(map(len, components), default=0) > _NAME_MAX // 4 and \
                max(len(part.encode()) for part in components) > _NAME_MAX:
            raise NotStreamable(f"layer {digest}: a name longer than {_NAME_MAX} bytes")
        return path

    def _lead_through(self, path, including=False):
        """Note the directories apply_layer resolves `path` through (and the
        path itself, `including`); NotStreamable where this layer made one
        of them a link or a file before."""
        layer = self.layer
        names = [path] if including and path else []
        names += [above for above in _ancestors(path) if above]
        for above in names:
            if above in layer.under:
                break  # (and so were the directories above it, in this layer)
            if above in layer.files:
                raise NotStreamable(f"a path through '{above}', a link or file of its own layer")
            self.traversed.add(above)
            layer.under.add(above)
            if above not in layer.seen:
                layer.bare.add(above)

    def _led_through(self, path):
        """Whether a layer above led a path through `path` with nothing of
        that name or above it entered, whited out or emptied in between
        (so it found what this layer leaves there)."""
        lowest = self.lowest
        through = lowest.bare.get(path)
        if through is None:
            return False
        shields = [lowest.entered.get(path), lowest.hiding.get(path)]
        for above in _ancestors(path):
            shields += [lowest.hiding.get(above), lowest.emptied.get(above)]
        return max((number for number in shields if number is not None), default=0) <= through

    def _guard(self, path, digest):
        if self.guard is not None:
            self.guard(f"/{path}", digest)

    def _hidden(self, path):
        if path in self.decided or path in self.lowest.hiding:
            return True
        return self._covered(path.rpartition("/")[0])

    def _covered(self, directory):
        """Whether a layer above hides what lies below `directory`: it or a
        directory above it whited out, marked opaque, or made a file. Kept
        for the layer being read, whose own entries change none of it (one
        that made such a directory a file is NotStreamable)."""
        known = self.layer.covered
        lowest = self.lowest
        walked = []
        while directory not in known:
            walked.append(directory)
            if directory in lowest.hiding or directory in lowest.emptied or \
                    self.decided.get(directory) is False:
                known[directory] = True
                break
            if not directory:
                known[directory] = False
                break
            directory = directory.rpartition("/")[0]
        for name in walked:
            known[name] = known[directory]
        return known[directory]

    def _needs_above(self, path, hidden=None):
        """Note the directories above `path` as ones the image needs (those
        not `hidden`); finish() makes those that no layer does. Each
        directory noted had those above it noted too."""
        for above in _ancestors(path):
            if above in self.below:
                break
            if hidden is None or not hidden(above):
                self.below.add(above)

    # -- Berth's own files and the end -----------------------------------

    def add_files(self, files):
        """Berth's files, above every layer (write_image_config's paths)."""
        self.layer = _Layer()
        for name, text, mode in files:
            data = text.encode()
            path = self._path(name, "of Berth")
            self._lead_through(path)
            self.layer.seen.add(path)
            self.layer.files.add(path)
            self.decided[path] = False
            self._needs_above(path)
            info = tarfile.TarInfo(path)
            info.size, info.mtime = len(data), int(time.time())
            info.mode = mode if mode is not None else 0o644 & ~self.umask
            self.out.add(info, contents=data)
        self.berth_files = set(self.layer.seen)
        self._end_layer()

    def finish(self):
        """The directories that entries needed and no layer made: as
        apply_layer makes them. The root's mode goes to the packer."""
        made = 0o755 & ~self.umask  # (apply_layer's for a directory an entry needs)
        now = int(time.time())
        for path in sorted(self.below - {""}):
            if path not in self.decided:
                info = tarfile.TarInfo(path)
                info.type, info.mode, info.mtime = tarfile.DIRTYPE, made, now
                self.out.add(info)


class _Lowest:
    """For each name, the number of the lowest layer read so far (numbered
    from the top, from 1) that did a thing to it, one map for each thing.
    _led_through and _covered read them; each layer's end adds to them."""

    __slots__ = ("hiding", "emptied", "entered", "bare")

    def __init__(self):
        self.hiding = {}   # whited it out: the name and all below it
        self.emptied = {}  # marked it opaque: all below it
        self.entered = {}  # had an entry of that name
        self.bare = {}     # led a path through it where no entry of its own had made it

    def note(self, layer, number):
        """What the _Layer `layer`, the number-th, did."""
        for names, kept in ((layer.whiteouts, self.hiding), (layer.opaque, self.emptied),
                            (layer.seen, self.entered), (layer.bare, self.bare)):
            kept.update(dict.fromkeys(names, number))


class _Layer:
    """What one layer has done so far: its own rules."""

    __slots__ = ("seen", "files", "under", "bare", "regular", "whiteouts", "opaque", "covered",
                 "root_mode")

    def __init__(self):
        self.seen = set()       # its entries' names
        self.files = set()      # those that are not directories
        self.under = set()      # directories its entries' paths led through
        self.bare = set()       # those it had made no entry of before
        self.regular = {}       # its files: passed on or hidden
        self.whiteouts = set()
        self.opaque = set()
        self.covered = {}       # directories: whether what lies below them is hidden
        self.root_mode = None


def _each_member(stream, digest, visit):
    """visit(archive, member) each entry of a layer's tar `stream` until it
    returns true (then True); a malformed tar is the layer's BerthError."""
    try:
        with tarfile.open(fileobj=_Forward(stream), mode="r:",
                          copybufsize=_COPY_BUFFER) as archive:
            while (member := archive.next()) is not None:
                archive.members.clear()  # (tarfile keeps every entry read: 250,000 of them)
                if visit(archive, member):
                    return True
    except (tarfile.TarError, EOFError, ValueError, OverflowError) as e:
        # (a malformed header can surface as any of these from tarfile)
        raise BerthError(f"layer {digest} is not a valid tar archive: {e}") from None
    return False


def _kind(member):
    if member.isdir():
        return "dir"
    if member.isreg():
        return "file"
    if member.issym():
        return "symlink"
    if member.islnk():
        return "hardlink"
    if member.isfifo():
        return "fifo"
    raise NotStreamable(f"an entry of tar type {member.type!r}")


def _check_text(text, digest):
    try:
        text.encode()
    except UnicodeEncodeError:
        raise NotStreamable(f"layer {digest}: a name that is not UTF-8") from None


def _mtime(value):
    try:
        whole = int(value)
    except (OverflowError, ValueError):
        return int(time.time())
    return whole if 0 <= whole <= _MTIME_MAX else int(time.time())


class _TarOut:
    """The tar stream to the packer, on its stdin's descriptor: each header
    as tarfile encodes it (TarInfo.tobuf), headers and small files gathered
    into writes of _FLUSH bytes, and a large file's bytes, past what was
    read ahead with its header, moved from the layer's stream by the
    kernel (splice) without passing through Python."""

    def __init__(self, fd):
        self.fd = fd
        self.pending = bytearray()
        self.can_splice = True

    def add(self, info, archive=None, member=None, contents=b""):
        """The entry `info`; a file's bytes are `contents`, or those of
        `member` read from `archive` (a tarfile reading a _Forward)."""
        self.pending += info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")
        if member is None:
            self.pending += contents
        elif member.sparse is not None:  # (its holes are tarfile's to fill)
            with archive.extractfile(member) as data:
                if self._copy(data.read, info.size):
                    raise tarfile.ReadError("unexpected end of data")
        else:
            self._move(archive.fileobj, member.offset_data, info.size)
        self.pending += bytes(-info.size % tarfile.BLOCKSIZE)
        self._flush_over(_FLUSH)

    def _move(self, source, offset, size):
        source.seek(offset)
        self.pending += source.buffered(size)
        left = size - (source.at - offset)
        if left >= _SPLICE_MIN and self.can_splice:
            self._flush_over(0)
            left = self._splice(source, left)
        self._copy(source.read, left)
        if source.at != offset + size:
            raise tarfile.ReadError("unexpected end of data")

    def _copy(self, read, left):
        """`left` bytes of read(n) into the stream, in pieces; returns how
        many of them did not come."""
        while left > 0:
            piece = read(min(left, _COPY_BUFFER))
            if not piece:
                break
            self.pending += piece
            left -= len(piece)
            self._flush_over(_FLUSH)
        return left

    def _splice(self, source, left):
        """Move `left` bytes from `source` to the packer in the kernel;
        returns how many are left to copy (the source's end, or a file
        system that cannot splice)."""
        while left:
            try:
                moved = os.splice(source.fd, self.fd, left)
            except OSError as e:
                if e.errno != errno.EINVAL:
                    raise
                self.can_splice = False  # (a plain layer on a file system without it)
                break
            if not moved:
                break
            source.at += moved
            left -= moved
        return left

    def end(self):
        """The two zero blocks that end a tar archive."""
        self.pending += bytes(2 * tarfile.BLOCKSIZE)
        self._flush_over(0)

    def _flush_over(self, limit):
        if len(self.pending) > limit:
            with memoryview(self.pending) as view:
                written = 0
                while written < len(view):
                    written += os.write(self.fd, view[written:])
            self.pending.clear()


class _Forward:
    """A layer's stream, read from its descriptor, as tarfile reads a file,
    seeking only forward. What tarfile reads (headers) comes from a buffer
    of _CHUNK; what it skips (a file's bytes) is passed through
    (_TarOut._move)."""

    def __init__(self, stream):
        self.fd = stream.fileno()
        self.held, self.start = b"", 0  # bytes read ahead, and how many of them are used
        self.at = 0  # the position in the stream of held[start]

    def read(self, size=-1):
        parts = [self.buffered(size if size >= 0 else len(self.held))]
        wanted = size - len(parts[0])
        while size < 0 or wanted > 0:
            piece = os.read(self.fd, max(_CHUNK, wanted))
            if not piece:
                break
            if size >= 0 and len(piece) > wanted:
                self.held, self.start = piece, wanted
                piece = piece[:wanted]
            parts.append(piece)
            self.at += len(piece)
            wanted -= len(piece)
        return b"".join(parts)

    def buffered(self, size):
        """Up to `size` bytes of what was read ahead."""
        piece = self.held[self.start:self.start + size]
        self.start += len(piece)
        self.at += len(piece)
        return piece

    def seek(self, position, whence=io.SEEK_SET):
        if whence != io.SEEK_SET or position < self.at:
            raise tarfile.ReadError("seeking back in a stream")
        self.buffered(position - self.at)
        while self.at < position:
            if not self.read(min(position - self.at, _CHUNK)):
                break
        return self.at

    def tell(self):
        return self.at
