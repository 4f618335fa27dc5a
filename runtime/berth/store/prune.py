"""`berth store prune`: the shared image store's least recently used files
go, as the store's account, beside imports that may run at the same time on
any node (docs/architecture/store.md).

In this order:

1. images and layers, least recently used first: those unused for
   --older-than, then more until images and layers together hold at most
   --max-size. Last use is image.cachescan.last_use, the order of `berth store list`
   (image.cachescan.scan): a serve marks the image it hands out, an import the
   layers it uses. A built image needs no layer and records none, so layers
   are only an import's cache and go by the same rule.
2. partial files not written for an hour: the squashfs of a killed build
   (with that image's lock held: ImageCache.remove_partials) and the file of
   a killed download.
3. uris/ links that name no image of the store (one removed, one missing, or
   anything but ../images/<key>.sqsh), and links of a killed `remember`.

An image or layer goes only with the lock an import of it takes held (flock
in locks/, across nodes) and only if unused since the scan. Nothing used or
written in the last hour goes, whatever the options: a client may be about
to mount the image a serve just handed out, and an import under way still
unpacks the layers it marked when it began. An entry's lock file goes with
it, the lock held: an import that waited on it finds it gone once it gets
it, and takes the file a later import made instead (blobs.locked), so the
two never build the same image side by side.

The store's directories are opened once, none through a symbolic link
(image.cachescan.CacheDirs), and every unlink goes through them: a link in the
store is removed as a link, never followed.
"""

import collections
import os
import re
import time

from berth import safedir
from berth.errors import BerthError
from berth.image.blobs import PARTIAL_PREFIX
from berth.image.cache import ImageCache
from berth.image.cachelayout import IMAGE_NAME, LAYERS_LINK, CacheLayout
from berth.image.cachescan import (
    CacheDirs,
    Entry,
    files,
    holding,
    holds_file,
    open_followed,
    remove_unused,
    scan,
    unlink_unchanged,
)
from berth.image.verbs import parse_duration, parse_size
from berth.store.paths import entry_line, owned_store, source
from berth.units import human_size

RECENT = 3600  # seconds: what was used or written this recently stays
# squash.make_squashfs's file beside the entry it builds, and
# ImageCache.remember's link before its rename
_BUILD_PARTIAL = re.compile(r"([0-9a-f]{64})\.sqsh\.tmp-.+")
_LINK_PARTIAL = re.compile(rf"({re.escape(LAYERS_LINK)})?[0-9a-f]{{64}}\.\d+")


class _StoreDirs(CacheDirs):
    PRUNE, PLACE = "berth store prune", "the store"


def cmd_prune(request, cfg):
    """`berth store prune`: a verbs.StoreRequest."""
    older, limit = parse_duration(request.older_than), parse_size(request.max_size)
    if older is None and limit is None:
        raise BerthError("store prune: give --older-than DURATION, --max-size SIZE or both")
    store = owned_store(cfg, "berth store prune")
    safedir.check_if_present(store, "BERTH_IMAGE_STORE")
    tally = _Tally(request.dry_run, request.quiet)
    with _StoreDirs(store, open_followed(store), strict=True) as dirs:
        entries, now = scan(dirs), time.time()
        gone = _prune_lru(dirs, entries, now=now, older=older, limit=limit, tally=tally)
        _prune_builds(dirs, entries, store=store, now=now, tally=tally)
        _prune_downloads(dirs, entries, now=now, tally=tally)
        _prune_links(dirs, gone, now=now, tally=tally)
    tally.total(limit)
    return 0


def _prune_lru(dirs, entries, *, now, older, limit, tally):
    """Images and layers, least recently used first, while unused for `older`
    seconds or more than `limit` bytes are left; the names of the images gone."""
    lru = [entry for entry in entries if entry.kind != "partial"]
    tally.left = sum(entry.size for entry in lru)
    gone = set()
    for entry in lru:
        if entry.used >= now - RECENT:
            break  # and so is every one after it
        old = older is not None and entry.used < now - older
        if not (old or limit is not None and tally.left > limit):
            continue
        # the URI first: image.json is read from the file
        what = None if tally.quiet else _describe(entry)
        if not (tally.dry_run or remove_unused(dirs, entry)):
            tally.busy += 1
            continue
        tally.removed(entry, what)
        if entry.kind == "images":
            gone.add(entry.name)
    return gone


def _describe(entry):
    return source(entry.path) if entry.kind == "images" else "(layer)"


def _prune_builds(dirs, entries, *, store, now, tally):
    """The squashfs files of killed builds, per image: all of an image's once
    one was not written for an hour."""
    builds = collections.defaultdict(list)
    for entry in entries:
        match = _BUILD_PARTIAL.fullmatch(entry.name)
        if entry.kind == "partial" and entry.dir_fd == dirs.fds["images"] and match:
            builds[match[1]].append(entry)
    for key, partials in sorted(builds.items()):
        if all(entry.mtime >= now - RECENT for entry in partials):
            continue
        if not (tally.dry_run or _remove_build(dirs, store, key)):
            tally.busy += 1
            continue
        for entry in partials:
            tally.removed(entry, "(partial)")


def _remove_build(dirs, store, key):
    """Whether the partial files of `key` went: with its image's lock held
    no build of it is at work, on any node."""
    images = ImageCache(store)
    with holding(dirs, CacheLayout.image_lock_name(key)) as held:
        if held:
            images.remove_partials(key)
        return held


def _prune_downloads(dirs, entries, *, now, tally):
    """The files of killed downloads. Their names do not say which layer, so
    no lock tells: an hour without a write does (a live download writes on,
    and the registry's stall timeout ends a stalled one far sooner)."""
    for entry in entries:
        if entry.kind == "partial" and entry.dir_fd == dirs.fds["layers"] \
                and entry.name.startswith(PARTIAL_PREFIX) and entry.mtime < now - RECENT \
                and (tally.dry_run or unlink_unchanged(entry)):
            tally.removed(entry, "(partial)")


def _prune_links(dirs, gone, *, now, tally):
    """uris/ links that name no image of the store, and links a killed
    remember left. A serve may remember a URI anew meanwhile: a link changed
    since its stat stays, and one lost costs the next `import --reuse` of
    that URI a request to the socket."""
    uris = dirs.fds["uris"]
    for item in files(uris, links=True):
        try:
            st = item.stat(follow_symlinks=False)
            target = os.readlink(item.name, dir_fd=uris)
        except FileNotFoundError:
            continue
        if _LINK_PARTIAL.fullmatch(item.name):
            stale = st.st_mtime < now - RECENT
        else:
            stale = not _names_image(dirs, target, gone)
        link = Entry(kind="link", path=os.path.join(dirs.dir_path("uris"), item.name),
                     dir_fd=uris, name=item.name, lock=None, size=st.st_size,
                     mtime=st.st_mtime, used=st.st_mtime)
        if stale and (tally.dry_run or unlink_unchanged(link)):
            shown = target if target.isprintable() else ascii(target)
            tally.removed(link, f"(link to {shown})")


def _names_image(dirs, target, gone):
    """Whether a uris/ link's target, as ImageCache.remember writes it
    (../images/<key>.sqsh), is an image of the store that stays."""
    parent, name = os.path.split(target)
    if parent != "../images" or not IMAGE_NAME.fullmatch(name) or name in gone:
        return False
    return holds_file(dirs.fds["images"], name)


class _Tally:
    """What prune removed, or would with --dry-run: a line each unless quiet
    (as `berth store list` prints entries), then the total."""

    def __init__(self, dry_run, quiet):
        self.dry_run, self.quiet = dry_run, quiet
        self.counts, self.freed, self.busy, self.left = collections.Counter(), 0, 0, 0

    def removed(self, entry, what):
        self.counts[entry.kind] += 1
        if entry.kind != "link":  # (a link's size is its target's name)
            self.freed += entry.size
        if entry.kind in ("images", "layers"):
            self.left -= entry.size
        if not self.quiet:
            print(entry_line(entry, what))

    def total(self, limit):
        counts = ", ".join(f"{label} {self.counts[kind]}" for kind, label in (
            ("images", "images"), ("layers", "layers"), ("partial", "partial files"),
            ("link", "uris/ links")))
        would = "would be " if self.dry_run else ""
        over = " (over --max-size: the rest is in use or was used in the last hour)" \
            if limit is not None and self.left > limit else ""
        print(f"{'would free' if self.dry_run else 'freed'} {human_size(self.freed)} "
              f"({self.freed} bytes: {counts}); {self.busy} in use kept; "
              f"{human_size(self.left)} ({self.left} bytes) of images and layers {would}left"
              f"{over}")
