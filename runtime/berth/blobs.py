"""The content-addressed layer cache: $ENROOT_CACHE_PATH/blobs/sha256/<hex>.

A blob appears under its name only after its digest was verified (it is
written to a temporary file in the same directory, then renamed), so a
reader never sees a partial layer. One lock per digest keeps concurrent
imports on a node from downloading the same layer twice.
"""

import contextlib
import fcntl
import os
import re
import sys
import tempfile

from berth.errors import BerthError

_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


class BlobCache:
    def __init__(self, cache_path):
        self.blob_dir = os.path.join(cache_path, "blobs", "sha256")
        self.lock_dir = os.path.join(cache_path, "locks")

    def path(self, digest):
        # The digest comes from a manifest: never let it name another path.
        if not _DIGEST.fullmatch(digest):
            raise BerthError(f"unsupported layer digest '{digest}' (expected sha256:<64 hex>)")
        return os.path.join(self.blob_dir, digest.split(":", 1)[1])

    def has(self, digest):
        return os.path.isfile(self.path(digest))

    def fetch(self, digest, registry, on_bytes, quiet=True):
        """Download `digest` unless cached; returns True when it downloaded."""
        if self.has(digest):
            return False
        for directory in (self.blob_dir, self.lock_dir):
            try:
                os.makedirs(directory, mode=0o700, exist_ok=True)
            except OSError as e:
                raise BerthError(f"cannot create cache directory {directory}: "
                                 f"{e.strerror}") from None
        with self._locked(digest, quiet):
            if self.has(digest):  # another import fetched it while we waited
                return False
            fd, partial = tempfile.mkstemp(dir=self.blob_dir, prefix=".partial-")
            try:
                with os.fdopen(fd, "wb") as out:
                    got = registry.download(digest, out, on_bytes)
                    out.flush()
                    os.fsync(out.fileno())
                if got != digest:
                    raise BerthError(f"layer digest mismatch: expected {digest}, got {got}")
                os.rename(partial, self.path(digest))
            except BaseException:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(partial)
                raise
        return True

    @contextlib.contextmanager
    def _locked(self, digest, quiet):
        lock_path = os.path.join(self.lock_dir, digest.replace(":", "-"))
        with open(lock_path, "a") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if not quiet:
                    print(f"berth: waiting for another import downloading {digest}",
                          file=sys.stderr)
                fcntl.flock(lock, fcntl.LOCK_EX)
            yield
