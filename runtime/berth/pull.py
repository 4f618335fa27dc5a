"""The registry side of `berth import`: the platform manifest, then the
cached squashfs of it, or the layers fetched in parallel and verified,
applied in order to a temporary root, the image config written into it,
and mksquashfs into the image cache. Imported only when the registry is
asked: requests and the rest cost a step that reuses an image 100 ms.
"""

import concurrent.futures
import contextlib
import json
import os
import platform
import queue
import shutil
import sys
import tempfile
import threading

from tqdm import tqdm

from berth import squash
from berth.blobs import BlobCache
from berth.errors import BerthError
from berth.imageconfig import from_oci, write_image_config
from berth.layers import apply_layer
from berth.registry import INDEX_TYPES, MANIFEST_TYPES, Registry, load_credentials

# uname -m names to the GOARCH names registries use.
_ARCHES = {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm", "i686": "386",
           "i386": "386"}


@contextlib.contextmanager
def cached_image(args, cfg, ref, images, options):
    """The image cache's squashfs of `ref` as the registry has it now, locked
    while in use: looked up by its manifest (a moved tag has a new one, so a
    new key), else built; remembered as the latest of its URI."""
    credentials, credentials_path = load_credentials(cfg["ENROOT_CONFIG_PATH"])
    registry = Registry(ref, cfg, credentials, credentials_path)
    registry.connect()
    try:
        manifest, digest, manifest_digest = _platform_manifest(registry, ref, args.arch)
    except (KeyError, TypeError, ValueError, AttributeError):
        raise _malformed(ref) from None
    key = images.key(manifest_digest, digest, args.uri, options)
    with images.locked(key, ref, args.quiet):
        image = images.lookup(key, args.quiet)
        if image is None:
            image = images.path(key)
            _build(args, cfg, registry, ref, manifest, digest, image)
        elif not args.quiet:
            print(f"berth: using the cached squashfs of {ref}: {image}", file=sys.stderr)
        images.remember(args.uri, options, key)
        yield image


def _malformed(ref):
    return BerthError(f"the manifest or image config of {ref} is malformed")


def _build(args, cfg, registry, ref, manifest, digest, image):
    """Fetch the missing layers and the image config, then make `image` of them."""
    show_progress = not args.quiet and sys.stderr.isatty()
    try:
        config = json.loads(registry.blob(manifest["config"]["digest"]))
        layers = [(layer["digest"], int(layer["size"])) for layer in manifest["layers"]]
        if not isinstance(config, dict):
            raise TypeError("image config is not an object")
    except (KeyError, TypeError, ValueError, AttributeError):
        raise _malformed(ref) from None
    total = sum(size for _, size in layers)

    cache = BlobCache(cfg["ENROOT_CACHE_PATH"])
    missing = [(d, size) for d, size in layers if not cache.use(d)]
    squash.require_space(cache.blob_dir, sum(size for _, size in missing), "the layers")
    _download(cache, registry, missing, cfg, show_progress, args.quiet)

    # Estimates from the compressed sizes: the root is at least as large,
    # the squashfs about half of it at worst; enough to fail early.
    squash.require_space(cfg["ENROOT_TEMP_PATH"], total, "the unpacked image")
    squash.require_space(os.path.dirname(image), total // 2, "the squashfs image")
    try:
        workdir = tempfile.mkdtemp(prefix="berth-import-", dir=cfg["ENROOT_TEMP_PATH"])
    except OSError as e:
        raise BerthError(f"ENROOT_TEMP_PATH {cfg['ENROOT_TEMP_PATH']}: {e.strerror}") from None
    try:
        root = os.path.join(workdir, "rootfs")
        os.mkdir(root, 0o755)
        for layer_digest, _ in tqdm(layers, desc="unpacking", unit="layer",
                                    disable=not show_progress):
            apply_layer(root, cache.path(layer_digest), layer_digest,
                        cfg["ENROOT_GZIP_PROGRAM"])
        write_image_config(root, from_oci(config, args.uri, digest))
        squash.make_squashfs(root, image, cfg, show_progress)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _platform_manifest(registry, ref, arch):
    """The image manifest for our platform, the digest the user pulled (an
    index's, for a multi-arch image) and the manifest's own digest."""
    manifest, media_type, digest = registry.manifest(ref.reference,
                                                     INDEX_TYPES + MANIFEST_TYPES)
    manifest_digest = digest
    if media_type in INDEX_TYPES:
        choice = _pick_platform(manifest.get("manifests") or [], arch, ref)
        manifest, media_type, manifest_digest = registry.manifest(choice, MANIFEST_TYPES)
    if media_type not in MANIFEST_TYPES:
        raise BerthError(f"{ref}: unsupported manifest type '{media_type}' (Docker schema 2 "
                         "or OCI image expected)")
    return manifest, digest, manifest_digest


def _pick_platform(entries, arch, ref):
    wanted = arch or platform.machine()
    name, _, variant = wanted.partition("/")
    name = _ARCHES.get(name, name)
    available = []
    for entry in entries:
        plat = entry.get("platform") or {}
        if plat.get("os") != "linux":
            continue  # attestations and other systems
        available.append("/".join(filter(None, (plat.get("architecture"),
                                                plat.get("variant")))))
        if plat.get("architecture") == name and variant in ("", plat.get("variant")):
            return entry["digest"]
    raise BerthError(f"{ref} has no image for architecture {wanted}; available: "
                     f"{', '.join(sorted(available)) or 'none'} (choose one with --arch)")


def _download(cache, registry, layers, cfg, show_progress, quiet):
    """Fetch the layers in parallel; the first failure stops the others."""
    if not layers:
        return
    failed = threading.Event()
    overall = tqdm(total=sum(size for _, size in layers), desc="downloading", unit="B",
                   unit_scale=True, disable=not show_progress)
    workers = max(1, min(cfg.number("ENROOT_MAX_CONNECTIONS"), len(layers)))
    free_rows = queue.SimpleQueue()  # one progress row per worker, under the overall bar
    for row in range(1, workers + 1):
        free_rows.put(row)

    def fetch(digest, size):
        row = free_rows.get()
        bar = tqdm(total=size, desc=digest[7:19], unit="B", unit_scale=True, leave=False,
                   position=row, disable=not show_progress)

        def on_bytes(count):
            if failed.is_set():
                raise BerthError("download cancelled")
            bar.update(count)
            overall.update(count)

        try:
            cache.fetch(digest, registry, on_bytes, quiet)
        finally:
            bar.close()
            free_rows.put(row)

    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        futures = [pool.submit(fetch, digest, size) for digest, size in layers]
        try:
            for future in concurrent.futures.as_completed(futures):
                future.result()
        except BaseException:
            failed.set()
            for future in futures:
                future.cancel()
            raise
        finally:
            overall.close()
