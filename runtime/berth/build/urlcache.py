"""What an ADD of a URL fetched before, kept in the image cache so that a
rebuild revalidates it as BuildKit does: the file in blobs/sha256 under
its digest (counted and pruned as a layer is), and under the URL's hash
in build-urls/ the record of it (cachelayout.py) with the answer's ETag.
The next fetch sends that ETag as If-None-Match; a 304 answer reuses the
file, read back through a descriptor opened before the request and
checked against its digest as it is copied, so neither a prune meanwhile
nor a changed blob becomes the step's file.

The server and the cache are both hostile: an ETag is kept only where it
is one (RFC 9110's entity-tag, printable, at most ETAG_MAX characters),
and a record only where each of its fields is what keep() writes."""

import contextlib
import hashlib
import json
import math
import os
import re
import shutil
import stat
import typing

from berth.errors import BerthError
from berth.image.buildrecords import read_record
from berth.image.cachelayout import CacheLayout

ETAG_MAX = 256
_ETAG = re.compile(r'(W/)?"[\x21\x23-\x7e]*"')
_DIGEST = re.compile(r"sha256:([0-9a-f]{64})")
_CHUNK = 1 << 20


class Kept(typing.NamedTuple):
    """A URL's file fetched before, as its record says."""

    etag: str
    digest: str       # sha256:... of the file
    size: int
    mtime: float      # its Last-Modified, or None
    blob: int         # a descriptor of the file in blobs/sha256, open for reading


def etag_of(response):
    """The answer's ETag where it is a well-formed one, else None."""
    value = response.headers.get("ETag")
    return value if _is_etag(value) else None


def _is_etag(value):
    return isinstance(value, str) and len(value) <= ETAG_MAX and _ETAG.fullmatch(value) is not None


def _record_path(cfg, url):
    name = hashlib.sha256(url.encode(errors="surrogateescape")).hexdigest()
    return CacheLayout(cfg["ENROOT_CACHE_PATH"]).build_url(name)


def _blob_path(cfg, digest):
    return os.path.join(CacheLayout(cfg["ENROOT_CACHE_PATH"]).dir("layers"),
                        digest.removeprefix("sha256:"))


def found(cfg, url):
    """The Kept of `url` (its blob open: the caller closes it), or None."""
    record = read_record(_record_path(cfg, url))
    if not isinstance(record, dict) or record.get("url") != url:
        return None
    etag, digest, size, mtime = (record.get(k) for k in ("etag", "digest", "size", "mtime"))
    if not (_is_etag(etag) and isinstance(digest, str) and _DIGEST.fullmatch(digest)
            and type(size) is int and size >= 0
            and (mtime is None or type(mtime) in (int, float) and math.isfinite(mtime))):
        return None
    try:
        blob = os.open(_blob_path(cfg, digest), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK
                       | os.O_CLOEXEC)
    except OSError:
        return None
    if not stat.S_ISREG(os.fstat(blob).st_mode):
        os.close(blob)
        return None
    return Kept(etag=etag, digest=digest, size=size, mtime=mtime, blob=blob)


def copy_out(kept, out):
    """The kept file into the file `out` (open for writing), from its
    start: whether it was whole and its digest the record's."""
    out.seek(0)
    out.truncate()
    hasher, written = hashlib.sha256(), 0
    with open(os.dup(kept.blob), "rb") as blob:
        blob.seek(0)
        while chunk := blob.read(_CHUNK):
            out.write(chunk)
            hasher.update(chunk)
            written += len(chunk)
    with contextlib.suppress(OSError):  # (a use, for prune's least recently used)
        os.utime(kept.blob)
    return written == kept.size and f"sha256:{hasher.hexdigest()}" == kept.digest


def keep(cfg, url, *, path, fetched):
    """Keep the file `path` fetched from `url` (fetch.Fetched, with its
    ETag) for the next build: its blob where it is not there yet, then
    the record naming it."""
    blob = _blob_path(cfg, fetched.digest)
    record = _record_path(cfg, url)
    try:
        for where in (os.path.dirname(blob), os.path.dirname(record)):
            os.makedirs(where, mode=0o700, exist_ok=True)
        if not os.path.isfile(blob):
            _put(blob, lambda partial: shutil.copyfile(path, partial))
        text = json.dumps({"url": url, "etag": fetched.etag, "digest": fetched.digest,
                           "size": fetched.size, "mtime": fetched.mtime}, sort_keys=True)
        _put(record, lambda partial: _write_text(partial, text))
    except OSError as e:
        raise BerthError(f"{e.filename or record}: the record of {url}: {e.strerror}") from None


def _write_text(where, text):
    with open(where, "w", encoding="utf-8", errors="surrogateescape") as f:
        f.write(text)


def _put(final, write):
    """`write(partial)` a file beside `final`, then renamed to it."""
    partial = f"{final}.tmp-{os.getpid()}"
    try:
        write(partial)
        os.rename(partial, final)
    finally:  # (stopped meanwhile: no partial file left)
        if os.path.lexists(partial):
            os.unlink(partial)
