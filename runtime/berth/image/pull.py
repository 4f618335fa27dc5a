"""The making of an image cache's entry, for a registry image (and an
archive's, archive.py), in four stages, each taking one typed value and
giving the next:

    resolve(PullRequest) -> Resolved   the platform manifest, from the first
                                       endpoint of registries.conf's rules
                                       that answers (manifests.py)
    fetch(Resolved)      -> Fetched    the image config, and the layers the
                                       blob cache lacks, fetched in parallel
                                       and verified; packing reads each one
                                       as soon as it is there
    pack(Fetched)        -> Packed     the image, made straight from the
                                       layers' streams (stream.py), or where
                                       they must be, of a temporary root
                                       they are applied to in order
                                       (layers.py), whole or as parts
                                       (parts.py); a SIF file as it came
    record(Packed)       -> CachedImage  remembered as the latest of its URI

build_cached() runs the last three under the entry's lock, asking the
image cache first: an entry there already goes to record() as it is.
Imported only when the registry is asked: requests and the rest cost a
step that reuses an image 100 ms.
"""

import contextlib
import json
import os
import queue
import shutil
import sys
import threading
import typing

from tqdm import tqdm

from berth.errors import BerthError, one_line
from berth.image import parts, registries, sif, squash, stream
from berth.image.blobs import BlobCache
from berth.image.cache import ImageCache
from berth.image.imageconfig import from_oci, image_files, write_image_config
from berth.image.layers import Room, apply_layer, new_root, remove_stale_unpack_dirs, unpack_dir
from berth.image.manifests import descriptor, first_answer, malformed
from berth.image.registry import load_credentials
from berth.image.request import CachedImage, PullRequest

# The stages' values are typed named tuples, not dataclasses: the import of
# dataclasses costs each `berth import` about 7 ms (request.py).


class Resolved(typing.NamedTuple):
    """What resolve() found: the image, and where its blobs come from."""

    request: PullRequest
    ref: typing.Any  # a reference.Reference, or an archive.Archive
    # a Registry, or an archive's reader with the same blob() and download()
    source: typing.Any
    manifest: dict
    digest: str  # the digest pulled: an index's, for a multi-arch image
    manifest_digest: str  # the platform manifest's own

    @property
    def is_sif(self):
        """Whether the image is a SIF file (an ORAS artifact)."""
        return _is_sif_artifact(self.manifest) or getattr(self.ref, "is_oras", False)


class Fetched(typing.NamedTuple):
    """What fetch() gives while its downloads run: the layers ((digest,
    size), bottom first), each in `blobs` once ready(digest) returns, and
    the image config (None for a SIF file)."""

    resolved: Resolved
    layers: tuple
    image_config: typing.Optional[dict]
    blobs: BlobCache
    ready: typing.Callable[[str], None]


class Target(typing.NamedTuple):
    """Where a build goes: the entry `key` of the image cache `images`,
    whose key and records hold the squash `options`."""

    images: ImageCache
    key: str
    options: typing.Any

    @property
    def path(self):
        return self.images.path(self.key)


class Packed(typing.NamedTuple):
    """The entry of `target` for `resolved`: whether it was there already
    (found), and for one made of parts the digests of the layers its root
    holds (in_root; None otherwise)."""

    resolved: Resolved
    target: Target
    found: bool
    in_root: typing.Optional[tuple] = None


@contextlib.contextmanager
def cached_image(request, *, cfg, ref, images, options):
    """The CachedImage of `ref` as the registry has it now, for a
    PullRequest, locked while in use (build_cached)."""
    resolved = resolve(request, cfg=cfg, ref=ref)
    with build_cached(resolved, cfg=cfg, images=images, options=options) as image:
        yield image


def resolve(request: PullRequest, *, cfg, ref, anonymous=False) -> Resolved:
    """The platform manifest of `ref` (blocked: refused) from the first
    endpoint of registries.conf's rules that answers (mirrors first): the
    layers come from the one that gave it. anonymous: with no credentials,
    as the shared image store pulls."""
    plan = registries.load(cfg["ENROOT_SYSCONF_PATH"]).endpoints(ref)
    credentials, credentials_path = (None, None) if anonymous else \
        load_credentials(cfg["ENROOT_CONFIG_PATH"])
    answer = first_answer(plan, ref, cfg=cfg, credentials=credentials,
                          credentials_path=credentials_path, arch=request.arch,
                          quiet=request.quiet)
    return Resolved(request=request, ref=ref, source=answer.source, manifest=answer.manifest,
                    digest=answer.digest, manifest_digest=answer.manifest_digest)


@contextlib.contextmanager
def build_cached(resolved: Resolved, *, cfg, images, options, building=contextlib.nullcontext,
                 keep_free=False):
    """The image cache's entry of `resolved`, locked while in use: found
    there, else fetched and packed inside building(path) (the store counts
    its users' imports there) and, with keep_free, unpacked within the
    temporary filesystem's free floor (layers.Room); then recorded. Yields
    a CachedImage."""
    if images.parted and resolved.is_sif:
        images = images.plain()  # a SIF file is kept as it came: one entry for every import
    request = resolved.request
    key = images.key(resolved.manifest_digest, resolved.digest, uri=request.uri,
                     squash_options=options)
    target = Target(images=images, key=key, options=options)
    with images.locked(key, resolved.ref, request.quiet):
        packed = _found(resolved, target)
        if packed is None:
            images.remove_partials(key)
            with building(target.path), fetch(resolved, cfg=cfg) as fetched:
                packed = pack(fetched, target=target, cfg=cfg, keep_free=keep_free)
        yield record(packed, cfg=cfg)


def _found(resolved, target):
    """The Packed entry of `target` where the image cache has it whole, or None."""
    path = target.images.lookup(target.key, resolved.request.quiet)
    if path is None:
        return None
    if not resolved.request.quiet:
        print(f"berth: using the cached squashfs of {resolved.ref}: {path}", file=sys.stderr)
    return Packed(resolved=resolved, target=target, found=True)


@contextlib.contextmanager
def fetch(resolved: Resolved, *, cfg) -> typing.Iterator[Fetched]:
    """The image config, and the layers the blob cache lacks fetched in
    parallel, the top layer first (as packing reads them); yields the
    Fetched while they arrive. Leaving waits for every layer."""
    layers, image_config = _contents(resolved)
    blobs = BlobCache(cfg["ENROOT_CACHE_PATH"])
    # (a layer listed twice, as images of several empty steps list one, fetched once:
    # a second fetch would wait on the first's own lock)
    missing = [(d, size) for d, size in dict.fromkeys(layers[::-1]) if not blobs.use(d)]
    squash.require_space(blobs.blob_dir, sum(size for _, size in missing),
                         "the SIF image" if resolved.is_sif else "the layers")
    with _downloading(blobs, resolved.source, missing, cfg=cfg,
                      request=resolved.request) as ready:
        yield Fetched(resolved=resolved, layers=tuple(layers), image_config=image_config,
                      blobs=blobs, ready=ready)


def _contents(resolved):
    """(layers, image config) of the manifest: for a SIF image its one
    layer, the SIF file, and no config."""
    if resolved.is_sif:
        return [_sif_layer(resolved)], None
    manifest, ref = resolved.manifest, resolved.ref
    try:
        config_digest, config_size = descriptor(manifest["config"])
        layers = [descriptor(layer) for layer in manifest["layers"]]
    except (KeyError, TypeError, ValueError, AttributeError):
        raise malformed(ref) from None
    try:
        config = json.loads(resolved.source.blob(config_digest, config_size))
    except (ValueError, RecursionError):
        raise BerthError(f"the image config {config_digest} of {ref} is not JSON") from None
    return layers, from_oci(config, resolved.request.uri, resolved.digest)


def _sif_layer(resolved):
    """(digest, size) of a SIF artifact's one layer (Apptainer's `push oras://`)."""
    ref = resolved.ref
    try:
        layers = [(descriptor(layer), layer.get("mediaType"))
                  for layer in resolved.manifest["layers"]]
    except (KeyError, TypeError, ValueError, AttributeError):
        raise malformed(ref) from None
    found = [found for found, media_type in layers if media_type in sif.LAYER_TYPES]
    if len(layers) != 1 or len(found) != 1:
        raise BerthError(f"{ref}: not a SIF image: a SIF artifact has one layer of type "
                         f"{sif.LAYER_TYPES[0]}; this manifest has {len(layers)} layers, "
                         f"{len(found)} of that type")
    return found[0]


def pack(fetched: Fetched, *, target: Target, cfg, keep_free=False) -> Packed:
    """The image of `fetched` made at target.path: a SIF file as it came
    (_pack_sif); else whole, or of parts where the image cache keeps them
    (_Build)."""
    if fetched.resolved.is_sif:
        _pack_sif(fetched, target.path)
        in_root = None
    else:
        in_root = _Build(fetched, target=target, cfg=cfg, keep_free=keep_free).made()
    return Packed(resolved=fetched.resolved, target=target, found=False, in_root=in_root)


def record(packed: Packed, *, cfg) -> CachedImage:
    """The entry of `packed` remembered: as the latest whose root holds its
    layers (parts.py), and as the latest of its URI for `import --reuse`."""
    target, request = packed.target, packed.resolved.request
    if packed.in_root:
        target.images.remember_layers(packed.in_root, target.options, target.key)
    try:
        target.images.remember(request.uri, target.options, arch=request.arch, key=target.key)
    except (OSError, BerthError):
        # A cache this user may not write still serves what it holds;
        # only `--reuse` misses the record.
        if os.access(cfg["ENROOT_CACHE_PATH"], os.W_OK):
            raise
    return CachedImage(target.path, packed.found)


class _Build:
    """The making of an image: whole, one squashfs of every layer, or of
    parts (parts.py): its lower layers' tree, and a top part applied over
    it in a user namespace and appended."""

    def __init__(self, fetched, *, target, cfg, keep_free):
        self.layers, self.ready = list(fetched.layers), fetched.ready
        self.blobs, self.image_config = fetched.blobs, fetched.image_config
        self.request, self.target, self.image = fetched.resolved.request, target, target.path
        self.ref = fetched.resolved.ref
        self.cfg, self.keep_free, self.room = cfg, keep_free, None
        self.show_progress = _shows_progress(self.request)

    def made(self):
        """Make the image, of parts where the image cache keeps them (and
        they can be made: else whole); returns the digests of the layers its
        root holds where it was made of parts, else None."""
        total = sum(size for _, size in self.layers)
        # An estimate from the compressed sizes: the squashfs about half of the
        # unpacked image at worst; enough to fail early.
        temp = self.cfg["ENROOT_TEMP_PATH"]
        remove_stale_unpack_dirs(temp)  # of imports killed before they could
        squash.require_space(os.path.dirname(self.image), total // 2, "the squashfs image")
        self.room = Room(temp) if self.keep_free else None
        with unpack_dir(temp) as workdir:
            root = os.path.join(workdir, "rootfs")
            if self.target.images.parted:
                try:
                    return tuple(self.parted(workdir, root))
                except parts.Unavailable as e:
                    if not self.request.quiet:
                        print(f"berth: importing {self.ref} whole, not as parts: "
                              f"{one_line(str(e))}", file=sys.stderr)
            self.whole(root)
        return None

    def unpack(self, root, chosen, guard=None):
        """Apply the layers `chosen` to `root` in order, each once it is there."""
        temp = self.cfg["ENROOT_TEMP_PATH"]
        squash.require_space(temp, sum(size for _, size in chosen), "the unpacked image")
        for layer_digest, _ in tqdm(chosen, desc="unpacking", unit="layer",
                                    disable=not self.show_progress):
            self.ready(layer_digest)
            apply_layer(root, self.blobs.path(layer_digest), layer_digest,
                        gzip_program=self.cfg["ENROOT_GZIP_PROGRAM"], room=self.room,
                        guard=guard)

    def stream(self, chosen, output, files=(), guard=None):
        """Pack the layers `chosen` straight from their streams into `output`
        (stream.NotStreamable: they must be applied in order)."""
        stream.squash_layers([(self.blobs.path(layer_digest), layer_digest)
                              for layer_digest, _ in chosen], output, self.cfg, files=files,
                             room=self.room, guard=guard, show_progress=self.show_progress,
                             verbose=self.request.verbose, ready=self.ready)

    def squashfs(self, root, output, **options):
        squash.make_squashfs(root, output, self.cfg, show_progress=self.show_progress,
                             **options)

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
                self.stream(self.layers, self.image, image_files(self.image_config))
                return
            except stream.NotStreamable as e:
                self._in_order(e)
            new_root(root)
        self.unpack(root, self.layers[done:])
        write_image_config(root, self.image_config)
        self.squashfs(root, self.image, verbose=self.request.verbose)

    def _in_order(self, reason):
        if self.request.verbose:
            print(f"berth: applying the layers in order: {one_line(str(reason))}",
                  file=sys.stderr)

    def parted(self, workdir, root):
        """Make the image of parts; returns the digests its root holds.
        parts.Unavailable: import it whole (what `root` holds then, if it
        is there, is every layer but the last, applied)."""
        digests = [layer_digest for layer_digest, _ in self.layers]
        found = self.target.images.base(digests, self.target.options, self.request.quiet)
        number = parts.top_number_of_file(found[0]) + 1 if found else 0
        if found and number <= parts.MAX_TOPS:
            self._on_base(workdir, *found, number)
            return digests[:found[1]]
        if len(self.layers) < 2:
            raise parts.Unavailable("one layer: nothing for a later tag to share")
        base = f"{self.image}.tmp-{os.getpid()}-base"
        try:
            try:
                self.stream(self.layers[:-1], base, guard=parts.guard("/"))
                upper = self._top(workdir, os.path.join(workdir, "base"), self.layers[-1:],
                                  number=1, image=base)
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
        upper = self._top(workdir, root, self.layers[-1:], number=1)
        self.squashfs(root, base)
        return upper

    def _on_base(self, workdir, base, count, number):
        """The image as a copy of the cached entry `base`, whose root holds
        its first `count` layers, with top part `number` appended."""
        if not self.request.quiet:
            print(f"berth: {count} of {len(self.layers)} layers are in {base}; unpacking "
                  f"the other {len(self.layers) - count}", file=sys.stderr)
        mounted = os.path.join(workdir, "base")
        try:
            upper = self._top(workdir, mounted, self.layers[count:], number=number, image=base)
            self._append(upper, base, number)
        except FileNotFoundError as e:
            if e.filename != base:
                raise
            raise parts.Unavailable(f"{base} was pruned meanwhile") from None

    def _top(self, workdir, lower, layers, *, number, image=None):
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
        self.squashfs(upper, self.image, verbose=self.request.verbose, append_to=base,
                      move_base=move, pseudo=parts.whiteouts(number))


def _shows_progress(request):
    return not request.quiet and sys.stderr.isatty()


def _is_sif_artifact(manifest):
    try:
        return (manifest["config"]["mediaType"] in sif.CONFIG_TYPES
                or any(layer["mediaType"] in sif.LAYER_TYPES for layer in manifest["layers"]))
    except (KeyError, TypeError):
        return False


def _pack_sif(fetched, image):
    """A SIF image from a registry (Apptainer's `push oras://`): its one
    layer, the SIF file, fetched into the blob cache (digest-checked as every
    layer is), checked as a start checks it, and copied to `image` with
    Berth's record (source, digest) added, as image.json is to a squashfs it
    builds. Nothing is unpacked or converted."""
    (blob, size), = fetched.layers
    resolved, ref = fetched.resolved, fetched.resolved.ref
    fetched.ready(blob)
    squash.require_space(os.path.dirname(image), size, "the SIF image")
    partial = f"{image}.tmp-{os.getpid()}"
    try:
        shutil.copyfile(fetched.blobs.path(blob), partial)
        fd = os.open(partial, os.O_RDWR | os.O_CLOEXEC)
        try:
            if sif.read(fd, str(ref)).record is not None:  # one that would pass for ours
                raise BerthError(f"{ref}: the SIF file holds a {sif.RECORD_NAME.decode()} "
                                 "object already; only Berth writes one")
            sif.add_record(fd, str(ref), json.dumps({"source": resolved.request.uri,
                                                     "digest": resolved.digest}))
        finally:
            os.close(fd)
        os.chmod(partial, 0o644 & ~squash.umask())
        os.rename(partial, image)
    finally:
        if os.path.lexists(partial):
            os.unlink(partial)


@contextlib.contextmanager
def _downloading(blobs, source, layers, *, cfg, request):
    """Fetch the layers from `source` into `blobs` in parallel, first to last
    as given; yields ready(digest), which returns once that layer is there
    (at once for one not fetched here) or raises the error that stopped a
    download. Leaving waits for every layer. The first failure, or any
    exception in the main thread (SIGTERM), stops the others. The threads
    are daemons the main thread never waits for: one may sit in a read from
    a registry that stopped answering, and blobs.cancel() has removed its
    temporary file."""
    downloads = _Downloads(blobs, source, layers, request=request)
    try:
        # (started inside: a SIGTERM while the later threads start finds the
        # first ones' temporary files, and removes them)
        downloads.start(max(1, min(cfg.number("ENROOT_MAX_CONNECTIONS"), len(layers))))
        yield downloads.ready
        for digest, _ in layers:
            downloads.ready(digest)
    except BaseException:
        downloads.failed.set()
        blobs.cancel()
        raise
    finally:
        downloads.overall.close()


class _Downloads:
    """The download threads of _downloading, and what they hand back: a
    queue of (digest, None) per layer fetched, or (None, the error)."""

    def __init__(self, blobs, source, layers, *, request):
        self.blobs, self.source, self.quiet = blobs, source, request.quiet
        self.show_progress = _shows_progress(request)
        self.pending = {digest for digest, _ in layers}
        self.failed = threading.Event()
        self.overall = tqdm(total=sum(size for _, size in layers),
                            desc=getattr(source, "progress", "downloading"), unit="B",
                            unit_scale=True, disable=not self.show_progress or not layers)
        self.todo, self.done = queue.SimpleQueue(), queue.SimpleQueue()
        for layer in layers:
            self.todo.put(layer)

    def start(self, workers):
        for row in range(1, min(workers, len(self.pending)) + 1):  # a progress row each
            threading.Thread(target=self._fetch, args=(row,), daemon=True,
                             name=f"berth-download-{row}").start()

    def _fetch(self, row):
        bar = tqdm(desc="", unit="B", unit_scale=True, leave=False, position=row,
                   disable=not self.show_progress)

        def on_bytes(count):
            if self.failed.is_set():
                raise BerthError("download cancelled")
            bar.update(count)
            self.overall.update(count)

        try:
            while not self.failed.is_set():
                try:
                    digest, size = self.todo.get_nowait()
                except queue.Empty:
                    return
                bar.reset(total=size)
                bar.set_description(digest[7:19])
                self.blobs.fetch(digest, size, self.source, on_bytes=on_bytes, quiet=self.quiet)
                self.done.put((digest, None))
        except BaseException as e:  # noqa: B036 (handed to the main thread)
            self.done.put((None, e))
        finally:
            bar.close()

    def ready(self, digest):
        while digest in self.pending:
            fetched, error = self.done.get()
            if error is not None:
                raise error
            self.pending.discard(fetched)
