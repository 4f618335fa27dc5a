"""Where a build keeps each step's result: the layer of its change
(layers.py), its blob in the image cache's blobs/sha256 and its record
under the step's key, and for the image a build ends with, a squashfs in
images/ under its key (cachelayout.py), so `berth cache` counts them and
`berth cache prune` removes the least recently used as it does imported
images' (a use touches the blob or the squashfs).

A step's key is BuildKit's rule: the key of the step before it, the
instruction as it reads once its variables are expanded, the build
arguments and environment it sees, and for COPY and ADD the checksum of
what it copies (context.checksum: contents and modes, never times).
"""

import contextlib
import hashlib
import json
import os
import typing

from berth import safedir
from berth.build import layers
from berth.errors import BerthError
from berth.image.buildrecords import read_record
from berth.image.cachelayout import CacheLayout

_PREFIX = "berth build step v1"  # (a key of an import never starts so)


def key(parent, what):
    """The key of the step `what` (JSON-able) after the step `parent` (a key)."""
    text = json.dumps([_PREFIX, parent, what], sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(text.encode(errors="surrogateescape")).hexdigest()


def file_key(path):
    """The key of a local image file: its content's sha256."""
    with open(path, "rb") as f:
        return key(None, ["image file", hashlib.file_digest(f, "sha256").hexdigest()])


def path(cfg, step_key):
    """The squashfs of `step_key`'s result, under the image cache."""
    safedir.ensure(cfg["ENROOT_CACHE_PATH"], "ENROOT_CACHE_PATH")
    layout = CacheLayout(cfg["ENROOT_CACHE_PATH"])
    os.makedirs(layout.dir("images"), mode=0o700, exist_ok=True)
    return layout.image(step_key)


def found(cfg, step_key):
    """The squashfs of `step_key`, marked used now; None when the cache has none."""
    where = path(cfg, step_key)
    try:
        os.utime(where)
    except FileNotFoundError:
        return None
    return where


def found_step(cfg, step_key):
    """found()'s squashfs of a changing step, when the layer of its change is kept too."""
    where = found(cfg, step_key)
    return where if where and layers.kept(cfg, step_key) else None


def found_layer(cfg, step_key):
    """Whether the layer of the changing step `step_key` is kept; its blob marked used now."""
    layer = layers.kept(cfg, step_key)
    if layer is None:
        return False
    try:
        os.utime(layers.blob_path(cfg, layer))
    except FileNotFoundError:
        return False
    return True


class Memo(typing.NamedTuple):
    """Where a COPY --from's checksum is kept, and what the root it was taken
    in is made of, so that `berth cache prune` forgets it once that is gone."""

    key: str
    layers: tuple  # the digests of the root's layers, in order
    image: str     # the name of its base's squashfs in images/; None: not in the cache


def sums_memo(cfg, *, root_at, image, specs):
    """The Memo of the checksum of `specs` in the root that `root_at` (a
    State's: its base's key, its steps' keys) and `image` (its base's
    squashfs) make: keyed by the digests of the layers, so a step run again
    that made other bytes is another root. None when a layer is gone."""
    base_key, keys = root_at
    digests = []
    for step_key in keys:
        layer = layers.kept(cfg, step_key)
        if layer is None:
            return None
        digests.append(layer.diff_id)
    layout = CacheLayout(cfg["ENROOT_CACHE_PATH"])
    cached = image is not None and os.path.dirname(image) == layout.dir("images")
    return Memo(key=key(None, ["sources", base_key, digests, list(specs)]),
                layers=tuple(digests), image=os.path.basename(image) if cached else None)


def _is_hex(text):
    return isinstance(text, str) and len(text) == 64 and all(c in "0123456789abcdef" for c in text)


def found_sum(cfg, memo):
    """The checksum kept for `memo`, its record marked used now; or None."""
    where = CacheLayout(cfg["ENROOT_CACHE_PATH"]).build_sum(memo.key)
    record = read_record(where)
    checksum = record.get("checksum") if isinstance(record, dict) else None
    if not _is_hex(checksum):
        return None
    with contextlib.suppress(OSError):
        os.utime(where, follow_symlinks=False)
    return checksum


def keep_sum(cfg, memo, checksum):
    """Record `checksum` for `memo`, with the layers and image it was taken on."""
    final = CacheLayout(cfg["ENROOT_CACHE_PATH"]).build_sum(memo.key)
    where = os.path.dirname(final)
    os.makedirs(where, mode=0o700, exist_ok=True)
    partial = f"{final}.tmp-{os.getpid()}"
    try:
        with open(partial, "w", encoding="ascii") as f:
            json.dump({"checksum": checksum, "layers": list(memo.layers), "image": memo.image},
                      f, sort_keys=True)
        os.rename(partial, final)
    except OSError as e:
        raise BerthError(f"{e.filename or where}: COPY --from's checksum: {e.strerror}") from None
    finally:  # (stopped meanwhile: no partial file left)
        if os.path.lexists(partial):
            os.unlink(partial)
