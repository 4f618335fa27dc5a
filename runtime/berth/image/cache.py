"""Imported squashfs images kept for reuse: a re-run imports nothing again.

$ENROOT_CACHE_PATH/images/<key>.sqsh is the image an import made, under a
key over everything that decides its content: the platform manifest, the
digest and URI its image config records, the squash options and FORMAT.
An import of the same key copies it instead of unpacking the layers again;
a moved tag has a new manifest digest, so a new key. An entry appears only
whole (built beside it, then renamed) and is checked before use, so a
damaged one is built again, never copied out.

Layers and images keep their last use as their mtime, or their atime where
that is later (cachescan.last_use); `berth cache prune` (verbs.py) removes
the least recently used first. Locks only save duplicate work: every entry
is written under a temporary name and renamed, so no writer corrupts
another. Where each file lies is cachelayout.py's.
"""

import contextlib
import copy
import hashlib
import json
import os
import sys

from berth.image import squash
from berth.image.blobs import locked, make_dirs, touch
from berth.image.cachelayout import LAYERS_LINK, CacheLayout

# Bump when the same inputs would make another image: the image config
# layout (imageconfig.py), the fixed mksquashfs flags (squash.py).
FORMAT = 1


class ImageCache:
    def __init__(self, cache_path, parted=False):
        self.layout = CacheLayout(cache_path)
        self.image_dir, self.lock_dir = self.layout.dir("images"), self.layout.dir("locks")
        # uris/<hash of URI and options>: the entry last imported for that
        # URI, for `import --reuse`; dropped by prune. uris/layers-<hash of a
        # run of layer digests>: the entry last made whose root holds that
        # run (parts.py, base()).
        self.uri_dir = self.layout.dir("uris")
        # Entries kept as parts (parts.py: --cache-only) have keys and
        # records of their own: `import -o` copies plain ones only.
        self.parted = parted

    def key(self, manifest_digest, digest, *, uri, squash_options):
        fields = [FORMAT, manifest_digest, digest, uri, squash_options, *self._parted()]
        return hashlib.sha256(json.dumps(fields).encode()).hexdigest()

    def _parted(self):
        return ["parts"] if self.parted else []

    def plain(self):
        """This cache, for an image never kept as parts (a SIF file)."""
        plain = copy.copy(self)
        plain.parted = False
        return plain

    def path(self, key):
        return self.layout.image(key)

    def lock_path(self, key):
        return self.layout.image_lock(key)

    def locked(self, key, ref, quiet):
        """One import of an image at a time: the second copies what the first built."""
        make_dirs(self.image_dir, self.lock_dir)
        return locked(self.lock_path(key), f"waiting for another import of {ref}", quiet)

    def _uri_link(self, uri, squash_options, arch):
        # The platform too: nodes of two architectures sharing a cache or a
        # store each have their own latest of a multi-arch URI.
        name = hashlib.sha256(json.dumps(
            [FORMAT, uri, squash_options, arch or os.uname().machine, *self._parted()]
        ).encode()).hexdigest()
        return os.path.join(self.uri_dir, name)

    def _layers_link(self, layer_digests, squash_options):
        name = hashlib.sha256(json.dumps(
            [FORMAT, "layers", list(layer_digests), squash_options]).encode()).hexdigest()
        return os.path.join(self.uri_dir, f"{LAYERS_LINK}{name}")

    def remember_layers(self, layer_digests, squash_options, key):
        """Record `key` as the latest entry whose root holds exactly these
        layers (parts.py)."""
        self._link(self._layers_link(layer_digests, squash_options), key)

    def base(self, layer_digests, squash_options, quiet):
        """(path, count): the cached entry, marked used, whose root holds
        the longest run of `layer_digests` from the bottom, and how many of
        them; None when no entry shares even the first layer."""
        for count in range(len(layer_digests), 0, -1):
            try:
                target = os.readlink(self._layers_link(layer_digests[:count], squash_options))
            except OSError:
                continue
            key = CacheLayout.key_of(os.path.basename(target))
            if key is not None:
                path = self.lookup(key, quiet)
                if path is not None:
                    return path, count
        return None

    def remember(self, uri, squash_options, *, arch, key):
        """Record `key` as the latest image of `uri` for `arch` (--arch; None:
        this machine's), replaced in one rename."""
        self._link(self._uri_link(uri, squash_options, arch), key)

    def _link(self, link, key):
        make_dirs(self.uri_dir)
        partial = f"{link}.{os.getpid()}"
        with contextlib.suppress(FileNotFoundError):
            os.unlink(partial)
        os.symlink(CacheLayout.image_link(key), partial)
        os.replace(partial, link)

    def remembered(self, uri, squash_options, arch):
        """The key last imported for `uri` and `arch` here, or None."""
        try:
            target = os.readlink(self._uri_link(uri, squash_options, arch))
        except OSError:
            return None
        return CacheLayout.key_of(os.path.basename(target))

    def remove_partials(self, key):
        """Remove what a killed build of `key` left beside its entry (the
        squashfs's temporary file). Called with the key's lock held, which
        every build of it holds: none is at work, on this node or another
        sharing the cache. (A pid in the name says nothing across nodes.)"""
        prefix = f"{CacheLayout.image_name(key)}.tmp-"
        with contextlib.suppress(FileNotFoundError):
            for name in os.listdir(self.image_dir):
                if name.startswith(prefix):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(os.path.join(self.image_dir, name))

    def lookup(self, key, quiet):
        """The entry of `key`, marked used, or None; a damaged one is removed."""
        path = self.path(key)
        try:
            whole = squash.looks_whole(path)
        except FileNotFoundError:
            return None
        if whole:
            touch(path)
            return path
        if not quiet:
            print(f"berth: the cached squashfs {path} is damaged; building it again",
                  file=sys.stderr)
        os.unlink(path)
        return None
