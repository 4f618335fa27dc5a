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
The store's client is handed in (store_client, from cli.py): the store
stands above image/, which does not import it.

cached_squashfs() is --cache-only's whole work, and what `berth start
docker://URI` starts (container/verbs.py): the plugin's one Python start per node
and step instead of an import and a start.
"""

import argparse
import contextlib
import os
import signal
import sys
import time

from berth import porcelain, safedir
from berth.errors import BerthError, Terminated, raise_terminated
from berth.image import archive, reference, registries

# squash, the store's client and the image cache are imported where they are
# used: --resolve, which the SPANK plugin runs once per job at submission,
# needs none of them.


def cmd_import(args, cfg):
    with _interruptible():
        return _import(args, cfg)


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


def _describe_sif(args):
    """`berth import APP.sif`: a SIF image runs where it lies, so nothing is
    made: the file is checked as a start checks it and what it holds is
    printed (with --quiet: nothing). A signature is reported by its key,
    never taken as verified."""
    for flag, given in (("-o/--output", args.output), ("--cache-only", args.cache_only),
                        ("--resolve", args.resolve), ("--digest", args.digest),
                        ("--porcelain", args.porcelain),
                        ("--reuse", args.reuse), ("-a/--arch", args.arch)):
        if given:
            raise BerthError(f"{flag}: not with a SIF image ({args.uri}): it is started as it "
                             "is, with nothing to import or convert")
    from berth.image import imagefile
    image = imagefile.locate(args.uri).sif
    if image is None:
        raise BerthError(f"{args.uri}: a squashfs image, not a SIF file: nothing to import "
                         "(berth start and create take it as it is)")
    if args.quiet:  # checked, nothing to say (srun's check at submission)
        return 0
    print(f"{args.uri}: SIF image, runs in place (berth start, berth create, "
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


def cached_squashfs(cfg, uri, reuse=False, quiet=False, arch=None, digest=True,
                    store_client=None):
    """(path, digest, found): the image cache's squashfs of `uri` (a registry
    reference or an image archive), found or made as `berth import
    --cache-only [--reuse] URI` does (the shared image store's entry where
    it serves, registries.conf's rules, the cache's locks), the digest
    it was pulled by as its image.json records it (None unless `digest`),
    and whether it was there already: taken by --reuse or found in the
    user's cache, nothing downloaded (a store's answer counts as made: the
    store may have pulled it for this request).
    What `import --cache-only` prints, and what `berth start docker://URI`
    starts. Interruptible as an import is (see _interruptible).
    store_client: a function that gives the shared image store's client
    (cli.store_client); None: no store."""
    args = argparse.Namespace(uri=uri, reuse=reuse, quiet=quiet, arch=arch, cache_only=True,
                              store_client=store_client)
    with _interruptible():
        ref, rules = _source(args, cfg)
        if rules is not None:
            rules.endpoints(ref)  # blocked: refused (see _source)
        from berth.image import squash
        safedir.ensure(cfg["ENROOT_CACHE_PATH"], "ENROOT_CACHE_PATH")
        with _cached_image(args, cfg, ref) as image:
            if not digest:
                return image, None, args.found
            # a pinned URI's entry was pulled by that digest (the cache key
            # holds the URI): not opened to read it, on every cached step
            pinned = ref.digest if isinstance(ref, reference.Reference) else ""
            return image, pinned or squash.recorded_digest(image), args.found


def _source(args, cfg):
    """(ref, rules) of args.uri: an archive (args.uri made its absolute
    path: what the cache and image config record) and None, or a registry
    reference and registries.conf's rules. Blocked, or a broken
    registries.conf: refused by rules.endpoints() before any request, and
    before --reuse serves what an earlier rule let in."""
    if archive.is_archive(args.uri):
        ref = archive.parse(args.uri)
        args.uri = ref.uri
        return ref, None
    return reference.parse(args.uri), registries.load(cfg["ENROOT_SYSCONF_PATH"])


def _import(args, cfg):
    began = time.monotonic()
    if args.uri.endswith(".sif") and "://" not in args.uri:
        return _describe_sif(args)
    if args.resolve and archive.is_archive(args.uri):
        raise BerthError(f"--resolve: '{args.uri}' is an archive; only registry (docker://) "
                         "references have a digest to resolve")
    if args.resolve and (args.reuse or args.dry_run or args.digest):
        raise BerthError("--resolve: not with --reuse, --dry-run or --digest")
    if args.porcelain and (not args.cache_only or args.dry_run):
        raise BerthError("--porcelain: only with --cache-only (not with --dry-run)")
    if args.cache_only and not args.dry_run:
        image, digest, found = cached_squashfs(cfg, args.uri, args.reuse, args.quiet, args.arch,
                                               args.digest or args.porcelain, args.store_client)
        if args.porcelain:
            print(porcelain.line(squashfs=image, digest=digest, cached=found), end="")
            return 0
        print(image)
        if args.digest:
            print(digest)
        return 0
    ref, rules = _source(args, cfg)
    if rules is None:
        if args.dry_run:
            print(f"{ref} (a local archive: no registry is asked)")
            return 0
        default = archive.default_output(ref)
    else:
        if args.dry_run:
            lines = rules.describe(ref)
            print("\n".join(lines))
            return 0 if any(not line.startswith("blocked:") for line in lines) else 1
        plan = rules.endpoints(ref)
        if args.resolve:
            return _resolve(args, cfg, ref, plan)
        default = reference.default_output(args.uri)
    if args.digest:
        raise BerthError("--digest: only with --cache-only")
    from berth.image import squash
    safedir.ensure(cfg["ENROOT_CACHE_PATH"], "ENROOT_CACHE_PATH")
    output = os.path.abspath(args.output or default)
    replace = cfg.flag("ENROOT_FORCE_OVERRIDE")
    _check_output(output, replace)
    with _cached_image(args, cfg, ref) as image:
        squash.require_space(os.path.dirname(output), os.path.getsize(image),
                             "the squashfs image")
        squash.copy_image(image, output, replace)
    _summary(args, output, began)
    return 0


def _summary(args, path, began):
    """The one line an import to a file ends with (unless --quiet): where
    the image went, its size, how long it took, and whether it was in the
    image cache already. (--cache-only prints its path on stdout alone.)"""
    if args.quiet:
        return
    from berth.image.cache import human_size
    size = human_size(os.path.getsize(path))
    print(f"berth: imported {args.uri} to {path} ({size}) in "
          f"{time.monotonic() - began:.1f} s"
          f"{', from the image cache (nothing downloaded)' if args.found else ''}",
          file=sys.stderr)


def _resolve(args, cfg, ref, plan):
    """--resolve: one line, the URI pinned to a digest (the plugin's, once
    per job at submission). Nothing is downloaded, nothing cached."""
    if ref.digest:
        print(args.uri)  # pinned already: no request
        return 0
    from berth.image import manifests  # (only where a request is made)
    print(manifests.pinned(args, cfg, ref, plan))
    return 0


@contextlib.contextmanager
def _cached_image(args, cfg, ref):
    """The image cache's squashfs for this import, locked (against prune) while
    in use; with a shared image store (args.store_client), the store's entry
    when it has or makes one. Sets args.found: whether it was there already
    (a build, or the store's answer, makes it False)."""
    args.found = True
    from berth.image import parts, squash
    from berth.image.cache import ImageCache
    store = args.store_client() if args.store_client else None
    options = squash.options(cfg)
    images = ImageCache(cfg["ENROOT_CACHE_PATH"], parts.wanted(args.cache_only, options)
                        and not getattr(ref, "is_oras", False))  # (a SIF file: pull.py)
    shared = store is not None and store.serves(args, cfg, ref)
    if shared and args.reuse:
        image = store.reused(cfg, args.uri, options, args.quiet)
        if image is not None:
            yield image
            return
    key = images.remembered(args.uri, options, args.arch) if args.reuse else None
    if key is not None:
        with images.locked(key, ref, args.quiet):
            image = images.lookup(key, args.quiet)
            if image is not None:
                yield image
                return
    if shared:
        image = store.ask(cfg, args.uri, args.quiet)
        if image is not None:
            args.found = False
            yield image
            return
    if isinstance(ref, archive.Archive):
        with archive.cached_image(args, cfg, ref, images, options) as image:
            yield image
        return
    from berth.image import pull  # (only now: its imports are most of a reuse's time)
    with pull.cached_image(args, cfg, ref, images, options) as image:
        yield image


def _check_output(output, replace):
    if os.path.isdir(output):
        raise BerthError(f"output {output} is a directory; name the image file")
    if os.path.lexists(output) and not replace:
        raise BerthError(f"{output} already exists; remove it or set ENROOT_FORCE_OVERRIDE=yes")
    directory = os.path.dirname(output)
    if not os.path.isdir(directory) or not os.access(directory, os.W_OK):
        raise BerthError(f"output directory {directory} does not exist or is not writable")
