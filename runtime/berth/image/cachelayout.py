"""Where an image cache keeps what it holds: the one spelling of its paths
and names, for the cache (cache.py, blobs.py), its scanner (cachescan.py),
`berth cache` and the shared image store, which is an image cache too.

    blobs/sha256/<hex>        a layer, by its digest
    images/<key>.sqsh         an image (cache.py: its key)
    locks/image-<key>         the lock of an image's build
    locks/sha256-<hex>        the lock of a layer's download
    uris/<hash>               -> ../images/<key>.sqsh, the latest of a URI
    uris/layers-<hash>        -> ../images/<key>.sqsh, the latest of a run of layers
    build-layers/<key>.json   the layer a build step's change made (its blob in blobs/)
    build-layers/<key>.owners.json  the owners COPY --chown gave in that step
    build-sums/<key>          a COPY --from's checksum, with the layers and image it read
    build-urls/<hash>.json    an ADD URL's ETag and digest (its file in blobs/), by the URL's hash
    build-cache/<hash>/       a RUN --mount=type=cache directory, by its id's hash

A named tuple, frozen as reference.py's are (no dataclasses: their import
costs each `berth import` about 7 ms).
"""

import collections
import os
import re

IMAGE_SUFFIX = ".sqsh"
IMAGE_NAME = re.compile(r"([0-9a-f]{64})\.sqsh")
LAYER_NAME = re.compile(r"[0-9a-f]{64}")
LAYERS_LINK = "layers-"  # the name's start of a record by layers, in uris/


class CacheLayout(collections.namedtuple("CacheLayout", "root")):
    """The paths below an image cache's `root`, and the names of its files."""

    __slots__ = ()

    # Each directory of the cache, below its root, by what it holds.
    PLACES = {"layers": ("blobs", "sha256"), "images": ("images",), "locks": ("locks",),
              "uris": ("uris",), "build-layers": ("build-layers",),
              "build-sums": ("build-sums",), "build-urls": ("build-urls",),
              "build-cache": ("build-cache",)}

    def dir(self, kind):
        return os.path.join(self.root, *self.PLACES[kind])

    def image(self, key):
        return os.path.join(self.dir("images"), self.image_name(key))

    def build_layer(self, key):
        """The record of the layer of build step `key`: not a place the
        scanner counts (a few bytes; its blob is pruned as a layer)."""
        return os.path.join(self.dir("build-layers"), f"{key}.json")

    def build_sum(self, key):
        """The record of a COPY --from's checksum under `key` (stepcache.sums_memo)."""
        return os.path.join(self.dir("build-sums"), key)

    def build_url(self, url_hash):
        """The record of what an ADD fetched from the URL of sha256 `url_hash` (urlcache.py)."""
        return os.path.join(self.dir("build-urls"), f"{url_hash}.json")

    def image_lock(self, key):
        return os.path.join(self.dir("locks"), self.image_lock_name(key))

    def layer_lock(self, digest):
        return os.path.join(self.dir("locks"), self.layer_lock_name(digest))

    @staticmethod
    def image_name(key):
        return f"{key}{IMAGE_SUFFIX}"

    @staticmethod
    def key_of(name):
        """The key of an image's file `name` (<key>.sqsh), or None for any
        other name."""
        match = IMAGE_NAME.fullmatch(name)
        return match[1] if match else None

    @staticmethod
    def image_link(key):
        """What a record in uris/ points to: the image of `key`."""
        return f"../images/{key}{IMAGE_SUFFIX}"

    @staticmethod
    def image_lock_name(key):
        return f"image-{key}"

    @staticmethod
    def layer_lock_name(digest):
        return digest.replace(":", "-")
