"""Where `berth build -o` writes the image: OUT.sqsh (the default),
`oci:DIR`, an OCI image layout (oci-layout, index.json, blobs/sha256) in a
directory that is new or empty, or `oci-archive:FILE`, that layout as a
tar. Each is checked before the build runs and written through a
temporary name beside it, so it appears whole or not at all, however the
write ends (an error, SIGINT)."""

import json
import os
import shutil
import tarfile
import typing

from berth.build import oci
from berth.errors import BerthError
from berth.image import squash

LAYOUT = "oci:"
ARCHIVE = "oci-archive:"
REF_NAME = "latest"  # the index's org.opencontainers.image.ref.name


class Target(typing.NamedTuple):
    kind: str    # "squashfs", "oci" or "oci-archive"
    path: str    # absolute
    shown: str   # as the user gave it


def _writable_parent(target):
    parent = os.path.dirname(target.path)
    if not os.path.isdir(parent):
        raise BerthError(f"{target.shown}: no directory {parent}")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise BerthError(f"{target.shown}: {parent} is not writable")


def target(spec):
    """The checked Target of -o `spec` (None: image.sqsh)."""
    spec = spec or "image.sqsh"
    kind, path = "squashfs", spec
    for prefix in (LAYOUT, ARCHIVE):
        if spec.startswith(prefix):
            kind, path = prefix[:-1], spec[len(prefix):]
    if not path:
        raise BerthError(f"-o {spec}: expected a path after {kind}:")
    found = Target(kind=kind, path=os.path.abspath(path), shown=spec)
    _writable_parent(found)
    if kind == "oci" and os.path.lexists(found.path) and (
            not os.path.isdir(found.path) or os.path.islink(found.path)
            or os.listdir(found.path)):
        raise BerthError(f"{spec}: exists and is not an empty directory")
    if kind != "oci" and os.path.isdir(found.path):
        raise BerthError(f"{spec}: is a directory")
    return found


def _json_file(path, document):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(document, f, sort_keys=True, separators=(",", ":"))


def _layout(directory, image):
    """The OCI image layout of `image` (oci.Image) in the new `directory`."""
    blobs = os.path.join(directory, "blobs", "sha256")
    os.makedirs(blobs)
    for blob in [image.manifest, *image.blobs]:
        where = os.path.join(blobs, blob.digest.removeprefix("sha256:"))
        if blob.path:
            shutil.copyfile(blob.path, where)
        else:
            with open(where, "wb") as f:
                f.write(blob.data)
    _json_file(os.path.join(directory, "oci-layout"), {"imageLayoutVersion": "1.0.0"})
    _json_file(os.path.join(directory, "index.json"), {
        "schemaVersion": 2, "mediaType": oci.INDEX,
        "manifests": [{**oci.descriptor(image.manifest, oci.MANIFEST),
                       "annotations": {"org.opencontainers.image.ref.name": REF_NAME}}]})


def _archive(directory, output):
    """The layout in `directory` as the tar `output`: sorted, root's, times zero."""
    with tarfile.open(output, "w", format=tarfile.PAX_FORMAT) as tar:
        for name in ["oci-layout", "index.json", "blobs", "blobs/sha256",
                     *(f"blobs/sha256/{n}" for n in sorted(
                         os.listdir(os.path.join(directory, "blobs", "sha256"))))]:
            info = tar.gettarinfo(os.path.join(directory, name), arcname=name)
            info.uid = info.gid = info.mtime = 0
            info.uname = info.gname = ""
            info.mode = 0o755 if info.isdir() else 0o644
            if info.isreg():
                with open(os.path.join(directory, name), "rb") as f:
                    tar.addfile(info, f)
            else:
                tar.addfile(info)


def _remove(path):
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.unlink(path)


def write_oci(found, image):
    """`image` (oci.Image) at the Target `found`, whole or not at all."""
    parent, name = os.path.split(found.path)
    partial = os.path.join(parent, f".{name}.tmp-{os.getpid()}")
    layout = f"{partial}.layout" if found.kind == "oci-archive" else partial
    try:
        _layout(layout, image)
        if found.kind == "oci-archive":
            _archive(layout, partial)
            os.rename(partial, found.path)
        else:
            if os.path.isdir(found.path):
                os.rmdir(found.path)  # (checked empty before the build)
            os.rename(partial, found.path)
    except OSError as e:
        raise BerthError(f"{found.shown}: {e.strerror}") from None
    finally:
        _remove(layout)
        _remove(partial)


def write_squashfs(found, image_path):
    squash.copy_image(image_path, found.path, True)
