"""`berth import`: a registry image, or an image archive (archive.py), to a
self-describing squashfs file. Registry references go through the admin's
registries.conf rules (registries.py): mirrors, rewrites, blocks.

The image comes from the image cache, made there first when missing (see
pull.py), and is copied into place. --cache-only prints the cached file's
path instead: what the SPANK plugin mounts, with no copy; it stays until
`berth cache prune` removes it (open files survive that). --reuse takes the
image last imported for the same URI on this node without asking the
registry at all (the plugin's "once per node"); without it a moved tag
brings its new image. --digest adds a line with the digest the image was
pulled by, read from the squashfs's image.json: what the plugin logs for
each step, so that an admin can tell which image a job ran. --resolve asks
the registry for the digest alone (one manifest request) and prints the URI
pinned to it: what the plugin resolves once per job at submission, so that
every node imports that digest (with --reuse: a digest never moves).

With BERTH_IMAGE_STORE set, --cache-only of a registry image without USER@
takes the shared store's entry (store/client.py): with --reuse the one last
imported there, else the one the store's socket answers; an image the store
cannot pull without credentials, or no store service on this node, is
imported into the caller's own cache as before, with a line saying why.
The store's client is handed in (the request's store_client, from cli.py,
behind request.StoreClient): the store stands above image/, which does not
import it.

cached_squashfs() is --cache-only's whole work, and what `berth start
docker://URI` starts (container/verbs.py): the plugin's one Python start per node
and step instead of an import and a start.
"""

import contextlib
import os
import signal
import sys
import time

from berth import porcelain, safedir
from berth.errors import BerthError, Permanent, Terminated, raise_terminated
from berth.image import archive, reference, registries
from berth.image.request import CachedImage, ImportResult

# squash, the store's client and the image cache are imported where they are
# used: --resolve, which the SPANK plugin runs once per job at submission,
# needs none of them.


def cmd_import(request, cfg):
    """`berth import`: an ImportRequest (request.py)."""
    with _interruptible():
        return _import(request, cfg)


@contextlib.contextmanager
def _interruptible():
    """An import's SIGTERM (scancel, a Slurm step's end) unwinds, so that
    cleanups run and partial files go, and ends in one BerthError, as does
    an OSError (naming its file). The SIGTERM handler of before is back
    afterwards (`berth start docker://URI` has its own for the container)."""
    previous = signal.signal(signal.SIGTERM, raise_terminated)
    try:
        yield
    except Terminated:
        raise BerthError("import interrupted by SIGTERM") from None
    except OSError as e:  # a path we could not use: say which, in one line
        where = f"{e.filename}: " if e.filename else ""
        raise BerthError(f"{where}{e.strerror or e}") from None
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


def _describe_sif(request):
    """`berth import APP.sif`: a SIF image runs where it lies, so nothing is
    made: the file is checked as a start checks it and what it holds is
    printed (with --quiet: nothing). A signature is reported by its key,
    never taken as verified."""
    for flag, given in (("-o/--output", request.output), ("--cache-only", request.cache_only),
                        ("--resolve", request.resolve), ("--digest", request.digest),
                        ("--porcelain", request.porcelain),
                        ("--reuse", request.reuse), ("-a/--arch", request.arch)):
        if given:
            raise BerthError(f"{flag}: not with a SIF image ({request.uri}): it is started as it "
                             "is, with nothing to import or convert")
    from berth.image import imagefile
    image = imagefile.locate(request.uri).sif
    if image is None:
        raise BerthError(f"{request.uri}: a squashfs image, not a SIF file: nothing to import "
                         "(berth start and create take it as it is)")
    if request.quiet:  # checked, nothing to say (srun's check at submission)
        return 0
    print(f"{request.uri}: SIF image, runs in place (berth start, berth create, "
          "srun --container-image take it as it is)")
    print(f"  system partition: squashfs, {image.arch}, {image.size} bytes at byte {image.offset}")
    for description in image.objects:
        print(f"  object: {description}")
    for hash_name, fingerprint in image.signatures:
        print(f"  signed ({hash_name}) by key {fingerprint}: NOT verified "
              "(Berth does not verify SIF signatures)")
    if not image.signatures:
        print("  not signed")
    return 0


def cached_squashfs(cfg, request):
    """An ImportResult: the image cache's squashfs of request.uri (a
    registry reference or an image archive), found or made as `berth import
    --cache-only [--reuse] URI` does (the shared image store's entry where
    it serves, registries.conf's rules, the cache's locks), the digest
    it was pulled by as its image.json records it (None unless
    request.digest), and whether it was there already: taken by --reuse or
    found in the user's cache, nothing downloaded (a store's answer counts
    as made: the store may have pulled it for this request).
    What `import --cache-only` prints, and what `berth start docker://URI`
    starts. Interruptible as an import is (see _interruptible)."""
    request = request._replace(cache_only=True)
    with _interruptible():
        request, ref, rules = _source(request, cfg)
        if rules is not None:
            rules.endpoints(ref)  # blocked: refused (see _source)
        from berth.image import squash
        safedir.ensure(cfg["ENROOT_CACHE_PATH"], "ENROOT_CACHE_PATH")
        with _cached_image(request, cfg, ref) as image:
            if not request.digest:
                return ImportResult(image.path, None, image.found)
            # a pinned URI's entry was pulled by that digest (the cache key
            # holds the URI): not opened to read it, on every cached step
            pinned = ref.digest if isinstance(ref, reference.Reference) else ""
            return ImportResult(image.path, pinned or squash.recorded_digest(image.path),
                                image.found)


def _source(request, cfg):
    """(request, ref, rules) of request.uri: an archive (the request's uri
    made its absolute path: what the cache and image config record) and
    None, or a registry reference and registries.conf's rules. Blocked, or
    a broken registries.conf: refused by rules.endpoints() before any
    request, and before --reuse serves what an earlier rule let in."""
    if archive.is_archive(request.uri):
        ref = archive.parse(request.uri)
        return request._replace(uri=ref.uri), ref, None
    return request, reference.parse(request.uri), registries.load(cfg["ENROOT_SYSCONF_PATH"])


def _import(request, cfg):
    began = time.monotonic()
    if request.uri.endswith(".sif") and "://" not in request.uri:
        return _describe_sif(request)
    if request.resolve and archive.is_archive(request.uri):
        raise BerthError(f"--resolve: '{request.uri}' is an archive; only registry (docker://) "
                         "references have a digest to resolve")
    if request.resolve and (request.reuse or request.dry_run or request.digest):
        raise BerthError("--resolve: not with --reuse, --dry-run or --digest")
    if request.porcelain and (not request.cache_only or request.dry_run):
        raise BerthError("--porcelain: only with --cache-only (not with --dry-run)")
    if request.cache_only and not request.dry_run:
        result = cached_squashfs(cfg, request._replace(digest=request.digest or
                                                       request.porcelain))
        if request.porcelain:
            print(porcelain.line(squashfs=result.path, digest=result.digest,
                                 cached=result.found), end="")
            return 0
        print(result.path)
        if request.digest:
            print(result.digest)
        return 0
    request, ref, rules = _source(request, cfg)
    if rules is None:
        if request.dry_run:
            print(f"{ref} (a local archive: no registry is asked)")
            return 0
        default = archive.default_output(ref)
    else:
        if request.dry_run:
            lines = rules.describe(ref)
            print("\n".join(lines))
            return 0 if any(not line.startswith("blocked:") for line in lines) else 1
        plan = rules.endpoints(ref)
        if request.resolve:
            return _resolve(request, cfg, ref=ref, plan=plan)
        default = reference.default_output(request.uri)
    if request.digest:
        raise BerthError("--digest: only with --cache-only")
    from berth.image import squash
    safedir.ensure(cfg["ENROOT_CACHE_PATH"], "ENROOT_CACHE_PATH")
    output = os.path.abspath(request.output or default)
    replace = cfg.flag("ENROOT_FORCE_OVERRIDE")
    _check_output(output, replace)
    with _cached_image(request, cfg, ref) as image:
        squash.require_space(os.path.dirname(output), os.path.getsize(image.path),
                             "the squashfs image")
        squash.copy_image(image.path, output, replace)
    _summary(request, output, began=began, found=image.found)
    return 0


def _summary(request, path, *, began, found):
    """The one line an import to a file ends with (unless --quiet): where
    the image went, its size, how long it took, and whether it was in the
    image cache already (found). (--cache-only prints its path on stdout
    alone.)"""
    if request.quiet:
        return
    from berth.units import human_size
    size = human_size(os.path.getsize(path))
    print(f"berth: imported {request.uri} to {path} ({size}) in "
          f"{time.monotonic() - began:.1f} s"
          f"{', from the image cache (nothing downloaded)' if found else ''}",
          file=sys.stderr)


def _resolve(request, cfg, *, ref, plan):
    """--resolve: one line, the URI pinned to a digest (the plugin's, once
    per job at submission). Nothing is downloaded, nothing cached."""
    if ref.digest:
        print(request.uri)  # pinned already: no request
        return 0
    from berth.image import manifests  # (only where a request is made)
    try:
        print(manifests.pinned(ref, plan, cfg=cfg, arch=request.arch, quiet=request.quiet))
    except Permanent as e:  # the plugin refuses the job on this status, not the nodes
        raise BerthError(str(e), status=porcelain.PERMANENT) from None
    return 0


@contextlib.contextmanager
def _cached_image(request, cfg, ref):
    """The CachedImage of this import in the image cache, locked (against
    prune) while in use; with a shared image store (request.store_client),
    the store's entry when it has or makes one. Its `found`: whether it was
    there already (a build, or the store's answer, makes it False)."""
    from berth.image import parts, squash
    from berth.image.cache import ImageCache
    store = request.store_client() if request.store_client else None
    options = squash.options(cfg)
    images = ImageCache(cfg["ENROOT_CACHE_PATH"], parts.wanted(request.cache_only, options)
                        and not getattr(ref, "is_oras", False))  # (a SIF file: pull.py)
    shared = store is not None and store.serves(request, cfg, ref)
    if shared and request.reuse:
        image = store.reused(cfg, request.uri, options, quiet=request.quiet)
        if image is not None:
            yield CachedImage(image, True)
            return
    key = images.remembered(request.uri, options, request.arch) if request.reuse else None
    if key is not None:
        with images.locked(key, ref, request.quiet):
            image = images.lookup(key, request.quiet)
            if image is not None:
                yield CachedImage(image, True)
                return
    if shared:
        image = store.ask(cfg, request.uri, request.quiet)
        if image is not None:
            yield CachedImage(image, False)
            return
    if isinstance(ref, archive.Archive):
        with archive.cached_image(request.pull(), cfg=cfg, archive=ref, images=images,
                                  options=options) as image:
            yield image
        return
    from berth.image import pull  # (only now: its imports are most of a reuse's time)
    with pull.cached_image(request.pull(), cfg=cfg, ref=ref, images=images,
                           options=options) as image:
        yield image


def _check_output(output, replace):
    if os.path.isdir(output):
        raise BerthError(f"output {output} is a directory; name the image file")
    if os.path.lexists(output) and not replace:
        raise BerthError(f"{output} already exists; remove it or set ENROOT_FORCE_OVERRIDE=yes")
    directory = os.path.dirname(output)
    if not os.path.isdir(directory) or not os.access(directory, os.W_OK):
        raise BerthError(f"output directory {directory} does not exist or is not writable")
