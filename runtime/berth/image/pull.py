"""The registry side of `berth import`: the platform manifest (manifests.py),
then the cached squashfs of it, or the layers fetched in parallel and
verified, then packed with the image config straight from their streams
(stream.py), or where they must be, applied in order to a temporary root
and that packed (layers.py), into the image cache. Imported only when the
registry is asked: requests and the rest cost a step that reuses an image
100 ms.
"""

import contextlib
import json
import os
import queue
import shutil
import sys
import threading

from tqdm import tqdm

from berth.errors import BerthError, one_line
from berth.image import parts, registries, sif, squash, stream
from berth.image.blobs import BlobCache
from berth.image.imageconfig import from_oci, image_files, write_image_config
from berth.image.layers import Room, apply_layer, new_root, remove_stale_unpack_dirs, unpack_dir

# (first_answer: store/service.py takes it from here too)
from berth.image.manifests import descriptor, first_answer, malformed
from berth.image.registry import load_credentials
from berth.image.request import CachedImage


@contextlib.contextmanager
def cached_image(request, cfg, ref, images, options):
    """The CachedImage (request.py) of `ref` as the registry has it now, locked
    while in use: looked up by its manifest (a moved tag has a new one, so a
    new key), else built; remembered as the latest of its URI. The registry
    asked is the first endpoint of registries.conf's rules that answers
    (mirrors first); the layers come from the one that gave the manifest."""
    plan = registries.load(cfg["ENROOT_SYSCONF_PATH"]).endpoints(ref)
    credentials, credentials_path = load_credentials(cfg["ENROOT_CONFIG_PATH"])
    answer = first_answer(plan, ref, cfg, credentials, credentials_path, request.arch,
                          request.quiet)
    with build_cached(request, cfg, images, options, ref, answer.source, answer.manifest,
                      answer.digest, answer.manifest_digest) as image:
        yield image


@contextlib.contextmanager
def build_cached(request, cfg, images, options, ref, source, manifest, digest, manifest_digest,
                 building=contextlib.nullcontext, keep_free=False):
    """The image cache's entry of this manifest for a PullRequest, built
    from `source` (a Registry, or an archive with the same blob() and
    download()) when missing, locked while in use and remembered as the
    latest of request.uri; a CachedImage, found unless built. A build runs
    inside building(image) (the store counts its users' imports there)
    and, with keep_free, unpacks within the temporary filesystem's free
    floor (layers.Room)."""
    if images.parted and (_is_sif_artifact(manifest) or getattr(ref, "is_oras", False)):
        images = images.plain()  # a SIF file is kept as it came: one entry for every import
    key = images.key(manifest_digest, digest, request.uri, options)
    with images.locked(key, ref, request.quiet):
        image = images.lookup(key, request.quiet)
        found = image is not None
        if not found:
            images.remove_partials(key)
            image = images.path(key)
            with building(image):
                in_root = _build(request, cfg, source, ref, manifest, digest, image, keep_free,
                                 images, options)
            if in_root:
                images.remember_layers(in_root, options, key)
        elif not request.quiet:
            print(f"berth: using the cached squashfs of {ref}: {image}", file=sys.stderr)
        try:
            images.remember(request.uri, options, request.arch, key)
        except (OSError, BerthError):
            # A cache this user may not write still serves what it holds;
            # only `--reuse` misses the record.
            if os.access(cfg["ENROOT_CACHE_PATH"], os.W_OK):
                raise
        yield CachedImage(image, found)


def _build(args, cfg, registry, ref, manifest, digest, image, keep_free, images, options):
    """Fetch the missing layers and the image config, then make `image` of
    them; or, for a SIF image (an ORAS artifact), see _build_sif. Returns
    the digests of the layers its root holds where it was made of parts
    (parts.py: an entry of images.parted, found by `options` as its key),
    else None."""
    show_progress = not args.quiet and sys.stderr.isatty()
    if _is_sif_artifact(manifest) or getattr(ref, "is_oras", False):
        _build_sif(args, cfg, registry, ref, manifest, digest, image, show_progress)
        return
    try:
        config_digest, config_size = descriptor(manifest["config"])
        layers = [descriptor(layer) for layer in manifest["layers"]]
    except (KeyError, TypeError, ValueError, AttributeError):
        raise malformed(ref) from None
    try:
        config = json.loads(registry.blob(config_digest, config_size))
    except (ValueError, RecursionError):
        raise BerthError(f"the image config {config_digest} of {ref} is not JSON") from None
    image_config = from_oci(config, args.uri, digest)

    cache = BlobCache(cfg["ENROOT_CACHE_PATH"])
    # (a layer listed twice, as images of several empty steps list one, fetched once:
    # a second fetch would wait on the first's own lock); the top layer first,
    # as packing reads them
    missing = [(d, size) for d, size in dict.fromkeys(layers[::-1]) if not cache.use(d)]
    squash.require_space(cache.blob_dir, sum(size for _, size in missing), "the layers")
    with _downloading(cache, registry, missing, cfg, show_progress, args.quiet) as ready:
        return _make(args, cfg, image, layers, keep_free, images, options, ref, cache, ready,
                     image_config, show_progress)


def _make(args, cfg, image, layers, keep_free, images, options, ref, cache, ready,
          image_config, show_progress):
    """_build's image of `layers`, each read once ready(digest) says it
    is in the blob `cache`."""
    total = sum(size for _, size in layers)

    # An estimate from the compressed sizes: the squashfs about half of the
    # unpacked image at worst; enough to fail early.
    temp = cfg["ENROOT_TEMP_PATH"]
    remove_stale_unpack_dirs(temp)  # of imports killed before they could
    squash.require_space(os.path.dirname(image), total // 2, "the squashfs image")
    room = Room(temp) if keep_free else None

    def unpack(root, chosen, guard=None):
        squash.require_space(temp, sum(size for _, size in chosen), "the unpacked image")
        for layer_digest, _ in tqdm(chosen, desc="unpacking", unit="layer",
                                    disable=not show_progress):
            ready(layer_digest)
            apply_layer(root, cache.path(layer_digest), layer_digest,
                        cfg["ENROOT_GZIP_PROGRAM"], room, guard)

    def pack(chosen, output, files=(), guard=None):
        stream.squash_layers([(cache.path(layer_digest), layer_digest)
                              for layer_digest, _ in chosen], output, cfg, files, room, guard,
                             show_progress, verbose=getattr(args, "verbose", False),
                             ready=ready)

    build = _Build(args, cfg, image, layers, unpack, pack, ready, image_config, show_progress)
    with unpack_dir(temp) as workdir:
        root = os.path.join(workdir, "rootfs")
        if images.parted:
            try:
                return build.parted(workdir, root, images, options)
            except parts.Unavailable as e:
                if not args.quiet:
                    print(f"berth: importing {ref} whole, not as parts: {one_line(str(e))}",
                          file=sys.stderr)
        build.whole(root)
    return None


class _Build:
    """The making of an image: whole, one squashfs of every layer, or of
    parts (parts.py): its lower layers' tree, and a top part applied over
    it in a user namespace and appended."""

    def __init__(self, args, cfg, image, layers, unpack, pack, ready, image_config,
                 show_progress):
        self.args, self.cfg, self.image, self.layers = args, cfg, image, layers
        self.unpack, self.pack, self.ready = unpack, pack, ready
        self.image_config, self.show_progress = image_config, show_progress

    def whole(self, root):
        """Make the image as one squashfs: packed from the layers' streams,
        or where they must be applied in order (stream.NotStreamable), of
        the tree they make in `root` (which may hold every layer but the
        last already: a parted import's)."""
        done = 0
        if os.path.isdir(root):  # the lower layers are there already
            done = len(self.layers) - 1
        else:
            try:
                self.pack(self.layers, self.image, image_files(self.image_config))
                return
            except stream.NotStreamable as e:
                self._in_order(e)
            new_root(root)
        self.unpack(root, self.layers[done:])
        write_image_config(root, self.image_config)
        squash.make_squashfs(root, self.image, self.cfg, self.show_progress,
                             verbose=getattr(self.args, "verbose", False))

    def _in_order(self, reason):
        if getattr(self.args, "verbose", False):
            print(f"berth: applying the layers in order: {one_line(str(reason))}",
                  file=sys.stderr)

    def parted(self, workdir, root, images, options):
        """Make the image of parts; returns the digests its root holds.
        parts.Unavailable: import it whole (what `root` holds then, if it
        is there, is every layer but the last, applied)."""
        digests = [layer_digest for layer_digest, _ in self.layers]
        found = images.base(digests, options, self.args.quiet)
        number = parts.top_number_of_file(found[0]) + 1 if found else 0
        if found and number <= parts.MAX_TOPS:
            self._on_base(workdir, *found, number)
            return digests[:found[1]]
        if len(self.layers) < 2:
            raise parts.Unavailable("one layer: nothing for a later tag to share")
        base = f"{self.image}.tmp-{os.getpid()}-base"
        try:
            try:
                self.pack(self.layers[:-1], base, guard=parts.guard("/"))
                upper = self._top(workdir, os.path.join(workdir, "base"), self.layers[-1:], 1,
                                  image=base)
            except stream.NotStreamable as e:
                self._in_order(e)
                upper = self._unpacked_lower(workdir, root, base)
            self._append(upper, base, 1, move=True)
        finally:
            if os.path.lexists(base):
                os.unlink(base)
        return digests[:-1]

    def _unpacked_lower(self, workdir, root, base):
        """The lower layers applied in order in `root` and packed into
        `base`; the top part over them (returned)."""
        new_root(root)
        try:
            self.unpack(root, self.layers[:-1], parts.guard(root))
        except parts.Unavailable:
            shutil.rmtree(root)  # (some of the lower layers: the whole import starts anew)
            raise
        upper = self._top(workdir, root, self.layers[-1:], 1)
        squash.make_squashfs(root, base, self.cfg, self.show_progress)
        return upper

    def _on_base(self, workdir, base, count, number):
        """The image as a copy of the cached entry `base`, whose root holds
        its first `count` layers, with top part `number` appended."""
        if not self.args.quiet:
            print(f"berth: {count} of {len(self.layers)} layers are in {base}; unpacking "
                  f"the other {len(self.layers) - count}", file=sys.stderr)
        mounted = os.path.join(workdir, "base")
        try:
            upper = self._top(workdir, mounted, self.layers[count:], number, image=base)
            self._append(upper, base, number)
        except FileNotFoundError as e:
            if e.filename != base:
                raise
            raise parts.Unavailable(f"{base} was pruned meanwhile") from None

    def _top(self, workdir, lower, layers, number, image=None):
        """The top part `number`: `layers` and the image config applied over
        `lower`, into an upper directory of that name (returned)."""
        for layer_digest, _ in layers:  # (the child below has no download threads)
            self.ready(layer_digest)
        upper = os.path.join(workdir, parts.name(number))
        work = os.path.join(workdir, "work")
        os.mkdir(upper, 0o755)
        os.mkdir(work, 0o700)

        def apply(merged):
            parts.check_lower(lower, number)  # (the overlay hides the parts' markers)
            self.unpack(merged, layers, parts.guard(merged))
            write_image_config(merged, self.image_config)

        try:
            parts.apply_over(lower, os.path.join(workdir, "merged"), apply, upper=upper,
                             work=work, image=image, mount_points=(lower,) if image else ())
        finally:
            parts.remove_work(work)
        parts.check_top(upper)
        return upper

    def _append(self, upper, base, number, move=False):
        if not move:  # (a copy of the whole entry first)
            squash.require_space(os.path.dirname(self.image), os.path.getsize(base),
                                 "the squashfs image")
        squash.make_squashfs(upper, self.image, self.cfg, self.show_progress,
                             verbose=getattr(self.args, "verbose", False), append_to=base,
                             move_base=move, pseudo=parts.whiteouts(number))


def _is_sif_artifact(manifest):
    try:
        return (manifest["config"]["mediaType"] in sif.CONFIG_TYPES
                or any(layer["mediaType"] in sif.LAYER_TYPES for layer in manifest["layers"]))
    except (KeyError, TypeError):
        return False


def _build_sif(args, cfg, registry, ref, manifest, digest, image, show_progress):
    """A SIF image from a registry (Apptainer's `push oras://`): its one
    layer, the SIF file, fetched into the blob cache (digest-checked as every
    layer is), checked as a start checks it, and copied to `image` with
    Berth's record (source, digest) added, as image.json is to a squashfs it
    builds. Nothing is unpacked or converted."""
    try:
        layers = [(descriptor(layer), layer.get("mediaType")) for layer in manifest["layers"]]
    except (KeyError, TypeError, ValueError, AttributeError):
        raise malformed(ref) from None
    found = [found for found, media_type in layers if media_type in sif.LAYER_TYPES]
    if len(layers) != 1 or len(found) != 1:
        raise BerthError(f"{ref}: not a SIF image: a SIF artifact has one layer of type "
                         f"{sif.LAYER_TYPES[0]}; this manifest has {len(layers)} layers, "
                         f"{len(found)} of that type")
    (blob, size), = found
    cache = BlobCache(cfg["ENROOT_CACHE_PATH"])
    if not cache.use(blob):
        squash.require_space(cache.blob_dir, size, "the SIF image")
        _download(cache, registry, [(blob, size)], cfg, show_progress, args.quiet)
    squash.require_space(os.path.dirname(image), size, "the SIF image")
    partial = f"{image}.tmp-{os.getpid()}"
    try:
        shutil.copyfile(cache.path(blob), partial)
        fd = os.open(partial, os.O_RDWR | os.O_CLOEXEC)
        try:
            if sif.read(fd, str(ref)).record is not None:  # one that would pass for ours
                raise BerthError(f"{ref}: the SIF file holds a {sif.RECORD_NAME.decode()} "
                                 "object already; only Berth writes one")
            sif.add_record(fd, str(ref), json.dumps({"source": args.uri, "digest": digest}))
        finally:
            os.close(fd)
        os.chmod(partial, 0o644 & ~squash.umask())
        os.rename(partial, image)
    finally:
        if os.path.lexists(partial):
            os.unlink(partial)


def _download(cache, registry, layers, cfg, show_progress, quiet):
    """Fetch the layers in parallel, and wait for every one."""
    with _downloading(cache, registry, layers, cfg, show_progress, quiet):
        pass


@contextlib.contextmanager
def _downloading(cache, registry, layers, cfg, show_progress, quiet):
    """Fetch the layers in parallel, first to last as given; yields
    ready(digest), which returns once that layer is in the cache (at once
    for one not fetched here) or raises the error that stopped a download.
    Leaving waits for every layer. The first failure, or any exception in
    the main thread (SIGTERM), stops the others. The threads are daemons
    the main thread never waits for: one may sit in a read from a registry
    that stopped answering, and cache.cancel() has removed its temporary
    file."""
    pending = {digest for digest, _ in layers}
    failed = threading.Event()
    overall = tqdm(total=sum(size for _, size in layers),
                   desc=getattr(registry, "progress", "downloading"), unit="B",
                   unit_scale=True, disable=not show_progress or not layers)
    workers = max(1, min(cfg.number("ENROOT_MAX_CONNECTIONS"), len(layers)))
    todo = queue.SimpleQueue()
    for layer in layers:
        todo.put(layer)
    done = queue.SimpleQueue()  # (digest, None) per layer fetched, or (None, the error)

    def fetch(row):
        bar = tqdm(desc="", unit="B", unit_scale=True, leave=False, position=row,
                   disable=not show_progress)

        def on_bytes(count):
            if failed.is_set():
                raise BerthError("download cancelled")
            bar.update(count)
            overall.update(count)

        try:
            while not failed.is_set():
                try:
                    digest, size = todo.get_nowait()
                except queue.Empty:
                    return
                bar.reset(total=size)
                bar.set_description(digest[7:19])
                cache.fetch(digest, size, registry, on_bytes, quiet)
                done.put((digest, None))
        except BaseException as e:  # noqa: B036 (handed to the main thread)
            done.put((None, e))
        finally:
            bar.close()

    def ready(digest):
        while digest in pending:
            fetched, error = done.get()
            if error is not None:
                raise error
            pending.discard(fetched)

    for row in range(1, min(workers, len(layers)) + 1):  # a progress row each, under the bar
        threading.Thread(target=fetch, args=(row,), daemon=True,
                         name=f"berth-download-{row}").start()
    try:
        yield ready
        for digest, _ in layers:
            ready(digest)
    except BaseException:
        failed.set()
        cache.cancel()
        raise
    finally:
        overall.close()
