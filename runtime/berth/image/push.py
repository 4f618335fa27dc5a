"""`berth build --push docker://[USER@]REGISTRY#REPO[:TAG]`: a built image
(build/oci.py's Image, what `-o oci:DIR` holds) uploaded as the OCI
distribution spec says. Each blob (the config, then the layers) is asked
for with a HEAD first and sent only where the registry lacks it: a POST
opens an upload, a PUT of the whole blob to its Location (?digest=) ends
it. The manifest is PUT under the tag last, so that a push that fails
midway leaves the tag as it was.

Through registry.py's client: the credentials file of pulls (a token asked
for with the scope pull,push, or Basic), the same timeouts, retries and
redirect rules. Nothing is written locally: the layers are read from the
image cache, where the build kept them."""

import contextlib
import typing

from berth.errors import BerthError
from berth.image import reference
from berth.image.registry import MANIFEST_TYPES, Registry, load_credentials

BLOB_TYPE = "application/octet-stream"


class Pushed(typing.NamedTuple):
    uploaded: int  # blobs sent
    present: int   # blobs the registry had already


def target(uri):
    """The Reference `uri` names to push to, or one line saying why not."""
    if not uri.startswith(reference.SCHEME):
        raise BerthError(f"--push {uri}: expected {reference.SCHEME}[USER@][REGISTRY#]REPO[:TAG]")
    ref = reference.parse(uri)
    if ref.digest:
        raise BerthError(f"--push {uri}: a push names a tag, not a digest")
    return ref


@contextlib.contextmanager
def _naming(what):
    """A failure's line says `what` request failed, where it does not already."""
    try:
        yield
    except BerthError as e:
        if what in str(e):
            raise
        raise type(e)(f"{e} ({what})") from None


def _asked(registry, where, *, what, expected, **request):
    """The answer to one request, checked (registry.check)."""
    with _naming(what):
        return registry.check(registry.ask(where, what=what, **request),
                              what=what, expected=expected)


def _present(registry, blob):
    """Whether the registry holds `blob` already (a HEAD)."""
    what = f"blob {blob.digest}"
    with _naming(what):
        response = registry.ask(f"/v2/{registry.ref.repository}/blobs/{blob.digest}",
                                method="HEAD", what=what)
        response.close()
        if response.status_code == 404:
            return False
        registry.check(response, what=what, expected=200)
    return True


def _upload(registry, blob):
    """`blob` sent whole: a POST opens the upload, a PUT to where it points ends it."""
    what = f"upload of blob {blob.digest}"
    opened = _asked(registry, f"/v2/{registry.ref.repository}/blobs/uploads/", method="POST",
                    what=what, expected=202, headers={"Content-Length": "0"}, body=b"")
    location = opened.headers.get("Location", "")
    if not location:
        raise BerthError(f"registry {registry.ref.registry}: {what}: the upload's answer "
                         "names no Location")
    where = f"{location}{'&' if '?' in location else '?'}digest={blob.digest}"
    headers = {"Content-Type": BLOB_TYPE, "Content-Length": str(blob.size)}
    if blob.data is not None:
        _asked(registry, where, method="PUT", what=what, expected=201, headers=headers,
               body=blob.data)
        return
    try:
        with open(blob.path, "rb") as body:
            _asked(registry, where, method="PUT", what=what, expected=201, headers=headers,
                   body=body)
    except OSError as e:
        raise BerthError(f"{blob.path}: {e.strerror}") from None


def push(cfg, ref, image, *, quiet=False):
    """`image` (oci.Image) in the registry of `ref` under its tag: a Pushed."""
    credentials, path = load_credentials(cfg["ENROOT_CONFIG_PATH"])
    registry = Registry(ref, cfg, credentials=credentials, credentials_path=path,
                        direct=True, quiet=quiet, actions="pull,push")
    uploaded = 0
    for blob in image.blobs:
        if not _present(registry, blob):
            _upload(registry, blob)
            uploaded += 1
    _asked(registry, f"/v2/{ref.repository}/manifests/{ref.tag}", method="PUT",
           what=f"manifest {ref.tag}", expected=201,
           headers={"Content-Type": MANIFEST_TYPES[0]}, body=image.manifest.data)
    return Pushed(uploaded=uploaded, present=len(image.blobs) - uploaded)
