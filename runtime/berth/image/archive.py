"""Air-gapped imports: images from files instead of a registry.

    docker-archive:PATH[:NAME:TAG|:@INDEX]   `docker save` output (manifest.json and
                                             layer tars; Docker 25+ blobs/ too)
    oci-archive:PATH[:REF]                   a tar of an OCI image layout
    oci:DIR[:REF]                            an OCI image layout directory

REF is an image's `org.opencontainers.image.ref.name` in index.json; it
is needed only when the layout holds several images (a multi-platform
index is one image: --arch picks from it, as for a registry). A PATH that
exists whole is taken whole, colons and all.

The archive is read in place: index, manifests and configs into memory
(capped as a registry's answers are), layers straight from their offset in
the tar into the layer cache, each checked against the digest its name or
descriptor gives (docker-archive layers without one: the config's
diff_id). A gzip- or zstd-compressed tar is first decompressed to an
unnamed temporary file. Then the import goes on as a registry import does:
the same layer safety, image cache and progress.

An archive is not trusted: entry names with `..` or a leading `/`,
manifest.json, index.json or oci-layout that are links, links leading out
of the archive or round in circles, a missing blob, a blob of another size
or digest than declared, an oversized manifest are each refused in one
line naming the archive, before any output is written.
"""

import collections
import contextlib
import hashlib
import json
import os
import posixpath
import re
import stat

from berth import units
from berth.errors import BerthError
from berth.image.reference import DIGEST

# berth.registry (whose limits and media types apply here too) imports
# requests, and tarfile is no light import either (nor berth.image.layers,
# which tells compressed tars): they are loaded once an archive is read, not
# by every `berth import --reuse` that imports this.

SCHEMES = ("docker-archive", "oci-archive", "oci")
REF_NAME = "org.opencontainers.image.ref.name"
_CHUNK = 1 << 20
_MAX_ENTRIES = 1 << 20  # entries in an outer tar: images hold tens to thousands
_MAX_LINKS = 16
_MAX_NESTING = 4  # index within index within ...


registry = tarfile = layers = None


def _load_modules():
    global registry, tarfile, layers
    import tarfile as tar_module

    from berth.image import layers as layers_module, registry as registry_module
    registry, tarfile, layers = registry_module, tar_module, layers_module


def is_archive(uri):
    return uri.partition(":")[0] in SCHEMES and ":" in uri


class Archive(collections.namedtuple("Archive", "kind path selector")):
    """kind: one of SCHEMES; path: absolute; selector: NAME:TAG, @INDEX or
    REF, "" for the only image."""
    __slots__ = ()

    @property
    def uri(self):
        return f"{self.kind}:{self.path}" + (f":{self.selector}" if self.selector else "")

    def __str__(self):
        return self.uri


def parse(uri):
    """The archive a URI names (its path made absolute); no I/O but a stat."""
    kind, _, rest = uri.partition(":")
    if kind not in SCHEMES or not rest:
        raise BerthError(f"invalid archive reference '{uri}'; expected "
                         "docker-archive:PATH[:NAME:TAG], oci-archive:PATH[:REF] or "
                         "oci:DIR[:REF]")
    path, selector = rest, ""
    if not os.path.lexists(rest) and ":" in rest:
        path, _, selector = rest.partition(":")
    if not path:
        raise BerthError(f"invalid archive reference '{uri}': no path")
    return Archive(kind, os.path.abspath(path), selector)


def default_output(archive):
    """NAME.sqsh for an import without -o: the file or directory name less
    its .tar, plus the selector, with '/' and ':' as '+'."""
    name = os.path.basename(archive.path.rstrip("/")) or "image"
    for ending in (".tar.gz", ".tgz", ".tar.zst", ".tar"):
        if name.endswith(ending) and len(name) > len(ending):
            name = name[:-len(ending)]
            break
    if archive.selector:
        name += "+" + archive.selector.lstrip("@")
    return re.sub(r"[/:]", "+", name) + ".sqsh"


@contextlib.contextmanager
def cached_image(request, *, cfg, archive, images, options):
    """The CachedImage (request.py) of the archive's image for a
    PullRequest, built when missing: the archive's own resolve, then
    pull.build_cached's fetch, pack and record."""
    from berth.image import pull  # (the image build is shared with registry imports)
    _load_modules()
    with contextlib.ExitStack() as stack:
        try:
            layout = stack.enter_context(_open(archive, cfg))
            manifest, digest, manifest_digest, source = _resolve(layout, archive, request.arch)
            resolved = pull.Resolved(request=request, ref=archive, source=source,
                                     manifest=manifest, digest=digest,
                                     manifest_digest=manifest_digest)
            image = stack.enter_context(pull.build_cached(resolved, cfg=cfg, images=images,
                                                          options=options))
        except BerthError as e:
            raise _named(archive, e) from None
        yield image


def _named(archive, error):
    text = str(error)
    return error if archive.path in text else BerthError(f"{archive}: {text}")


# -- reading the layout, from a directory or a tar ---------------------------

@contextlib.contextmanager
def _open(archive, cfg):
    if archive.kind == "oci":
        if not os.path.isdir(archive.path):
            raise BerthError(f"{archive.path} is not a directory (an OCI layout)")
        yield _Directory(archive.path)
        return
    try:  # O_NONBLOCK: a FIFO opens at once (to be refused), not when a writer comes
        fd = os.open(archive.path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as e:
        raise BerthError(f"cannot read {archive.path}: {e.strerror}") from None
    with contextlib.ExitStack() as stack:
        stack.callback(os.close, fd)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise BerthError(f"{archive.path} is not a file")
        command = layers.decompressor(os.pread(fd, 4, 0), cfg["ENROOT_GZIP_PROGRAM"])
        if command:
            fd = _decompressed(fd, command, temp=cfg["ENROOT_TEMP_PATH"], archive=archive)
            stack.callback(os.close, fd)
        yield _Tar(fd, archive)


def _decompressed(fd, command, *, temp, archive):
    """An unnamed temporary file (gone with the process) holding the tar."""
    import subprocess
    import tempfile
    try:
        out = tempfile.TemporaryFile(dir=temp)
    except OSError as e:
        raise BerthError(f"ENROOT_TEMP_PATH {temp}: {e.strerror}") from None
    with open(os.dup(fd), "rb") as source:
        source.seek(0)
        try:
            result = subprocess.run(command, stdin=source, stdout=out, stderr=subprocess.PIPE,
                                    check=False)
        except OSError as e:
            out.close()
            raise BerthError(f"cannot run {command[0]}: {e.strerror}") from None
    if result.returncode != 0:
        out.close()
        lines = result.stderr.decode(errors="replace").strip().splitlines()
        raise BerthError(f"{command[0]} -d failed on {archive.path}: "
                         f"{lines[-1] if lines else f'exit {result.returncode}'}")
    copy = os.dup(out.fileno())
    out.close()
    return copy


def _clean_name(name, where):
    """An entry name relative to the archive's top, refused when it leads out."""
    if name.startswith("/") or ".." in name.split("/"):
        raise BerthError(f"entry '{name[:200]}' points outside the archive{where}; refusing it")
    return posixpath.normpath(name) if name not in ("", ".") else "."


class _Tar:
    """The entries of an uncompressed tar read in place (pread: threads may
    read layers at once)."""

    def __init__(self, fd, archive):
        self.fd = fd
        self.entries = {}
        try:
            with open(os.dup(fd), "rb") as f:
                f.seek(0)  # (a dup shares the offset: the decompressed file's is at its end)
                with tarfile.open(fileobj=f, mode="r:") as tar:
                    for count, member in enumerate(tar):
                        if count >= _MAX_ENTRIES:
                            raise BerthError(f"more than {_MAX_ENTRIES} entries; refusing it")
                        name = _clean_name(member.name, "")
                        if member.isdir():
                            continue
                        if name in self.entries:
                            raise BerthError(f"entry '{name}' appears twice; refusing it")
                        self.entries[name] = member
        except (tarfile.TarError, EOFError, ValueError, OverflowError) as e:
            raise BerthError(f"not a valid tar archive: {e}") from None

    def _member(self, name, follow):
        seen = 0
        member = self.entries.get(name)
        while member is not None and (member.issym() or member.islnk()):
            if not follow:
                raise BerthError(f"'{name}' is a link; refusing it")
            seen += 1
            if seen > _MAX_LINKS:
                raise BerthError(f"'{name}': too many levels of links")
            if member.issym():
                target = posixpath.join(posixpath.dirname(member.name), member.linkname)
            else:
                target = member.linkname
            name = _clean_name(posixpath.normpath(target), f" (a link from '{name}')")
            member = self.entries.get(name)
        if member is not None and not member.isreg():
            raise BerthError(f"'{name}' is not a regular file")
        return member

    def size(self, name, follow=True):
        member = self._member(name, follow)
        return None if member is None else member.size

    def chunks(self, name, follow=True):
        member = self._member(name, follow)
        offset, left = member.offset_data, member.size
        while left > 0:
            data = os.pread(self.fd, min(_CHUNK, left), offset)
            if not data:
                raise BerthError(f"'{name}' is cut short")
            offset += len(data)
            left -= len(data)
            yield data


class _Directory:
    """An OCI layout directory; no link is followed in it."""

    def __init__(self, path):
        self.path = path

    def _open(self, name):
        _clean_name(name, "")
        # O_NONBLOCK: a FIFO opens at once (to be refused), not when a writer comes
        flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
        try:
            fd = os.open(os.path.join(self.path, name), flags)
        except FileNotFoundError:
            return None
        except OSError as e:
            if os.path.islink(os.path.join(self.path, name)):
                raise BerthError(f"'{name}' is a link; refusing it") from None
            raise BerthError(f"cannot read '{name}': {e.strerror}") from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise BerthError(f"'{name}' is not a regular file")
        return fd

    def size(self, name, follow=True):
        fd = self._open(name)
        if fd is None:
            return None
        try:
            return os.fstat(fd).st_size
        finally:
            os.close(fd)

    def chunks(self, name, follow=True):
        fd = self._open(name)
        if fd is None:
            raise BerthError(f"'{name}' is missing")
        with open(fd, "rb") as f:
            while True:
                data = f.read(_CHUNK)
                if not data:
                    return
                yield data


def _read(layout, name, *, limit, what, follow=False):
    """The whole of entry `name`, at most `limit` bytes, or None when missing."""
    size = layout.size(name, follow)
    if size is None:
        return None
    if size > limit:
        raise BerthError(f"{what} is {size} bytes, more than the {limit >> 20} MiB berth "
                         "reads; refusing it")
    data = b"".join(layout.chunks(name, follow))
    if len(data) > limit:
        raise BerthError(f"{what} is larger than {limit >> 20} MiB; refusing it")
    return data


def _json(data, what):
    try:
        return json.loads(data)
    except (ValueError, RecursionError):
        raise BerthError(f"{what} is not JSON") from None


def _blob_name(digest):
    if not isinstance(digest, str) or not DIGEST.fullmatch(digest):
        raise _unsupported(digest)
    return f"blobs/sha256/{digest.partition(':')[2]}"


def _unsupported(digest):
    return BerthError(f"unsupported digest '{str(digest)[:100]}' (expected sha256:<64 hex>)")


class _Source:
    """What pull._build reads blobs from: the registry's blob() and
    download(), from the archive; `names` maps each digest to its entry."""

    progress = "reading"

    def __init__(self, layout, archive, names):
        self.layout, self.archive, self.names = layout, archive, names

    def _entry(self, digest, size):
        name = self.names.get(digest)
        actual = None if name is None else self.layout.size(name)
        if actual is None:
            raise BerthError(f"blob {digest} is missing")
        if actual != size:
            raise BerthError(f"blob {digest} ('{name}') is {actual} bytes; its descriptor "
                             f"says {size}")
        return name

    def blob(self, digest, size, what="image config"):
        if size > registry.MAX_CONFIG:
            raise BerthError(f"{what} {digest} is {size} bytes, more than the "
                             f"{registry.MAX_CONFIG >> 20} MiB berth reads; refusing it")
        data = b"".join(self.layout.chunks(self._entry(digest, size)))
        got = "sha256:" + hashlib.sha256(data).hexdigest()
        if got != digest:
            raise BerthError(f"blob digest mismatch: expected {digest}, got {got}")
        return data

    def download(self, digest, size, out, on_bytes):
        hasher = hashlib.sha256()
        for data in self.layout.chunks(self._entry(digest, size)):
            out.write(data)
            hasher.update(data)
            on_bytes(len(data))
        return "sha256:" + hasher.hexdigest()


# -- finding the image ---------------------------------------------------------

def _resolve(layout, archive, arch):
    """(manifest, digest, manifest digest, _Source) of the image chosen."""
    if archive.kind == "docker-archive" and layout.size("manifest.json", False) is not None:
        return _docker(layout, archive)
    if layout.size("index.json", False) is None:
        what = "manifest.json (docker save) or index.json" if archive.kind == \
            "docker-archive" else "index.json: not an OCI image layout"
        raise BerthError(f"no {what}")
    return _oci(layout, archive, arch)


def _descriptor(entry, what):
    """manifests.descriptor, in the words of an archive's errors."""
    from berth.image.manifests import descriptor
    if not isinstance(entry, dict):
        raise BerthError(f"{what} is not a JSON object")

    def invalid(field, value):
        return _unsupported(value) if field == "digest" else \
            BerthError(f"{what} has no valid size")
    return descriptor({"digest": None, "size": None, **entry}, invalid)


def _oci(layout, archive, arch):
    from berth.image.manifests import platform_digest
    layout_file = _read(layout, "oci-layout", limit=registry.MAX_MANIFEST, what="oci-layout")
    if layout_file is not None:
        version = _json(layout_file, "oci-layout")
        if not isinstance(version, dict) or not str(
                version.get("imageLayoutVersion", "")).startswith("1."):
            raise BerthError("oci-layout: unsupported imageLayoutVersion")
    index = _json(_read(layout, "index.json", limit=registry.MAX_MANIFEST, what="index.json"),
                  "index.json")
    entries = index.get("manifests") if isinstance(index, dict) else None
    if not isinstance(entries, list) or not entries or \
            not all(isinstance(e, dict) for e in entries):
        raise BerthError("index.json lists no images")
    entry = _choose(entries, archive, arch)
    digest, size = _descriptor(entry, "an index.json entry")
    top = digest  # what was asked for: an index's digest for a multi-platform image
    names = {}
    for _ in range(_MAX_NESTING):
        manifest, media_type = _manifest(layout, digest, size, names=names)
        if media_type not in registry.INDEX_TYPES:
            break
        inner = manifest.get("manifests")
        if not isinstance(inner, list) or not all(isinstance(e, dict) for e in inner):
            raise BerthError(f"index {digest} lists no manifests")
        chosen = platform_digest(inner, arch, archive)
        entry = next(e for e in inner if e.get("digest") == chosen)
        digest, size = _descriptor(entry, f"the entry {chosen} of index {digest}")
    else:
        raise BerthError(f"indexes nested more than {_MAX_NESTING} deep")
    if media_type not in registry.MANIFEST_TYPES:
        raise BerthError(f"manifest {digest} has the unsupported type '{media_type}' "
                         "(Docker schema 2 or OCI image expected)")
    for descriptor in [manifest.get("config"), *(manifest.get("layers") or [])]:
        if isinstance(descriptor, dict) and isinstance(descriptor.get("digest"), str):
            names[descriptor["digest"]] = _blob_name(descriptor["digest"])
    return manifest, top, digest, _Source(layout, archive, names)


def _manifest(layout, digest, size, *, names):
    """(parsed manifest or index, media type) of blob `digest`, verified."""
    if size > registry.MAX_MANIFEST:
        raise BerthError(f"manifest {digest} is {size} bytes, more than the "
                         f"{registry.MAX_MANIFEST >> 20} MiB berth reads; refusing it")
    name = _blob_name(digest)
    names[digest] = name
    data = _Source(layout, None, names).blob(digest, size, "manifest")
    parsed = _json(data, f"manifest {digest}")
    if not isinstance(parsed, dict):
        raise BerthError(f"manifest {digest} is not a JSON object")
    media_type = parsed.get("mediaType")
    if not media_type:  # optional in OCI: tell an index by its list of manifests
        media_type = (registry.INDEX_TYPES if "manifests" in parsed
                      else registry.MANIFEST_TYPES)[0]
    return parsed, media_type


def _choose(entries, archive, arch):
    """The index.json entry the selector names, or the only one."""
    named = [(e.get("annotations") or {}).get(REF_NAME) if isinstance(
        e.get("annotations"), dict) else None for e in entries]
    if archive.selector:
        for entry, name in zip(entries, named, strict=True):
            if name == archive.selector:
                return entry
        raise BerthError(f"no image named '{archive.selector}'; it holds "
                         f"{', '.join(repr(n) for n in named if n) or 'none with a name'}")
    if len(entries) == 1:
        return entries[0]
    if not any(named) and all(isinstance(e.get("platform"), dict) for e in entries):
        # One image, its platforms listed in index.json itself.
        from berth.image.manifests import platform_digest
        digest = platform_digest(entries, arch, archive)
        return next(e for e in entries if e.get("digest") == digest)
    raise BerthError(f"holds {len(entries)} images "
                     f"({', '.join(repr(n) for n in named if n) or 'without names'}); "
                     f"choose one with {archive.kind}:{archive.path}:NAME")


def _docker(layout, archive):
    """The image of a `docker save` archive, as a manifest of our own."""
    listing = _json(_read(layout, "manifest.json", limit=registry.MAX_MANIFEST,
                          what="manifest.json"),
                    "manifest.json")
    if not isinstance(listing, list) or not listing or \
            not all(isinstance(e, dict) for e in listing):
        raise BerthError("manifest.json lists no images")
    entry = _choose_docker(listing, archive)
    config_name, layer_names = entry.get("Config"), entry.get("Layers")
    if not isinstance(config_name, str) or not isinstance(layer_names, list) or \
            not all(isinstance(n, str) for n in layer_names):
        raise BerthError("manifest.json: an image without Config or Layers")
    config_name = _clean_name(config_name, " (manifest.json Config)")
    config_size = layout.size(config_name)
    if config_size is None:
        raise BerthError(f"the image config '{config_name}' is missing")
    config_digest = _named_digest(config_name)
    if config_digest is None:  # no digest in its name: the content is its identity
        data = _read(layout, config_name, limit=registry.MAX_CONFIG,
                     what=f"the image config '{config_name}'", follow=True)
        config_digest = "sha256:" + hashlib.sha256(data).hexdigest()
    names = {config_digest: config_name}
    descriptors = []
    diff_ids = None
    for number, name in enumerate(layer_names):
        name = _clean_name(name, " (manifest.json Layers)")
        size = layout.size(name)
        if size is None:
            raise BerthError(f"layer '{name}' is missing")
        digest = _named_digest(name)
        if digest is None:
            # A plain tar, named by no digest: its diff_id is the sha256 of it.
            if diff_ids is None:
                config = _json(_Source(layout, archive, names).blob(config_digest, config_size),
                               "the image config")
                rootfs = config.get("rootfs") if isinstance(config, dict) else None
                diff_ids = rootfs.get("diff_ids") if isinstance(rootfs, dict) else None
                if not isinstance(diff_ids, list) or len(diff_ids) != len(layer_names):
                    raise BerthError(f"the image config {config_digest} lists no diff_id "
                                     f"for each of the {len(layer_names)} layers")
            digest = diff_ids[number]
            _blob_name(digest)
            head = next(layout.chunks(name), b"")[:4]
            if layers.compression(head):
                raise BerthError(f"layer '{name}' is compressed and named by no digest: "
                                 "nothing to check it against")
        names[digest] = name
        descriptors.append({"digest": digest, "size": size})
    manifest = {"config": {"digest": config_digest, "size": config_size}, "layers": descriptors}
    return manifest, config_digest, config_digest, _Source(layout, archive, names)


def _named_digest(name):
    """sha256:HEX when the entry's name gives it (blobs/sha256/HEX, HEX.json)."""
    match = re.fullmatch(r"(?:blobs/sha256/([0-9a-f]{64})|([0-9a-f]{64})\.json)", name)
    return f"sha256:{match.group(1) or match.group(2)}" if match else None


def _choose_docker(listing, archive):
    tags = [[t for t in (e.get("RepoTags") or []) if isinstance(t, str)]
            if isinstance(e.get("RepoTags") or [], list) else [] for e in listing]
    selector = archive.selector
    if selector.startswith("@"):
        index = units.whole(selector[1:])
        if index is None or index >= len(listing):
            raise BerthError(f"no image {selector}: it holds {len(listing)} "
                             f"(@0 to @{len(listing) - 1})")
        return listing[index]
    if selector:
        wanted = {selector, f"docker.io/{selector}", f"docker.io/library/{selector}"}
        for entry, names in zip(listing, tags, strict=True):
            if wanted & set(names) or any(_short(n) == selector for n in names):
                return entry
        raise BerthError(f"no image tagged '{selector}'; it holds "
                         f"{', '.join(n for names in tags for n in names) or 'untagged ones'}")
    if len(listing) == 1:
        return listing[0]
    raise BerthError(f"holds {len(listing)} images "
                     f"({', '.join(n for names in tags for n in names) or 'untagged'}); choose "
                     f"one with docker-archive:{archive.path}:NAME:TAG or :@INDEX")


def _short(name):
    """docker.io/library/x:t as x:t, the way `docker save` users write it."""
    for prefix in ("docker.io/library/", "docker.io/"):
        if name.startswith(prefix):
            return name[len(prefix):]
    return name
