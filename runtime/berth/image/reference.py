"""Registry image references: docker://[USER@][REGISTRY#]IMAGE[:TAG|@DIGEST],
and Apptainer's oras://REGISTRY/IMAGE[:TAG|@DIGEST] for SIF images kept in
a registry as OCI artifacts (the same registries, rules and credentials)."""

import collections
import re

from berth.errors import BerthError

SCHEME = "docker://"
ORAS_SCHEME = "oras://"
SCHEMES = (SCHEME, ORAS_SCHEME)
DEFAULT_REGISTRY = "registry-1.docker.io"
FORMAT = "docker://[USER@][REGISTRY#]IMAGE[:TAG|@DIGEST]"

_HOST = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?(?::[0-9]+)?")
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_REPOSITORY = re.compile(rf"{_COMPONENT}(?:/{_COMPONENT})*")
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
# A digest as berth takes it, everywhere: sha256 only, lowercase hex.
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_USER = re.compile(r"[^\s@#/:]+")


# Named tuples, here and in registries.py and archive.py, not dataclasses:
# importing dataclasses costs each `berth import` about 7 ms.
class Reference(collections.namedtuple(
        "Reference", "uri user registry repository tag digest explicit_registry name",
        defaults=("",))):
    """A parsed docker:// URI. `name` is the image name as written, before
    Docker Hub's `library/`: what an unqualified-search registry
    (registries.py) is asked for."""
    __slots__ = ()

    @property
    def is_oras(self):
        """Named as Apptainer names a SIF image in a registry (its artifact)."""
        return self.uri.startswith(ORAS_SCHEME)

    @property
    def reference(self):
        """What the manifest endpoint is asked for: the digest, else the tag."""
        return self.digest or self.tag

    def __str__(self):
        suffix = f"@{self.digest}" if self.digest else f":{self.tag}"
        return f"{self.registry}/{self.repository}{suffix}"

    def registry_hint(self):
        """Why a Docker Hub lookup may be a mistake: 'nvcr.io/x' lacks its '#'."""
        first = self.repository.split("/")[0]
        if self.explicit_registry or "/" not in self.repository:
            return ""
        if "." in first or first == "localhost":
            meant = self.uri.replace(f"{first}/", f"{first}#", 1)
            return f" (taken as a Docker Hub image; for registry {first} write {meant})"
        return ""


def in_enroot_form(image):
    """`image` with its registry written as enroot writes it: Docker's rule,
    a first component with '.' or ':' or named localhost is the registry
    (nvcr.io/nvidia/x becomes nvcr.io#nvidia/x), so that a reference written
    for Docker (an EDF's, a Containerfile's FROM) does not name a Docker Hub
    repository. Already in enroot's form, or none of the rule's: as given."""
    first, slash, rest = image.partition("/")
    host, colon, port = first.partition(":")
    if colon and not port.isdigit():  # a scheme (docker-archive:PATH), no HOST:PORT
        return image
    if "#" not in image and slash and ("." in host or colon or host == "localhost"):
        return f"{first}#{rest}"
    return image


def _bad(uri, why):
    return BerthError(f"invalid image reference '{uri}': {why}; expected {FORMAT}")


def parse(uri):
    """Split a docker:// URI into its parts, filling in Docker Hub defaults;
    an oras:// one names its registry first, always."""
    if uri.startswith(ORAS_SCHEME):
        registry, slash, rest = uri[len(ORAS_SCHEME):].partition("/")
        if not slash or not _HOST.fullmatch(registry) or "#" in rest:
            raise BerthError(f"invalid image reference '{uri}': expected "
                             "oras://REGISTRY[:PORT]/IMAGE[:TAG|@DIGEST]")
        return parse(f"{SCHEME}{registry}#{rest}")._replace(uri=uri)
    if not uri.startswith(SCHEME):
        raise BerthError(f"'{uri}' is not a registry reference; expected {FORMAT}")
    rest = uri[len(SCHEME):]
    digest = ""
    head, at, tail = rest.rpartition("@")
    if at and tail.startswith("sha256:"):
        if not DIGEST.fullmatch(tail):
            raise _bad(uri, f"digest '{tail}' is not sha256: and 64 lowercase hex digits")
        rest, digest = head, tail
    user = ""
    if "@" in rest:
        user, _, rest = rest.partition("@")
        if not _USER.fullmatch(user):
            raise _bad(uri, f"user '{user}' is not valid")
    registry = ""
    if "#" in rest:
        registry, _, rest = rest.partition("#")
        if not _HOST.fullmatch(registry):
            raise _bad(uri, f"registry '{registry}' is not HOST[:PORT]")
    image, tag = rest, ""
    last = rest.rsplit("/", 1)[-1]
    if ":" in last:
        image, _, tag = rest.rpartition(":")
        if not _TAG.fullmatch(tag):
            raise _bad(uri, f"tag '{tag}' is not valid")
    if not _REPOSITORY.fullmatch(image):
        raise _bad(uri, f"image name '{image}' is not valid (lowercase letters, digits, "
                        "'.', '_', '-' separated by '/')")
    explicit = bool(registry)
    registry = registry or DEFAULT_REGISTRY
    repository = image
    if registry == DEFAULT_REGISTRY and "/" not in image:
        repository = f"library/{image}"
    return Reference(uri, user, registry, repository, tag or ("" if digest else "latest"),
                     digest, explicit, image)


def default_output(uri):
    """File name for an import: the image part with '/' and ':' as '+'
    (IMAGE.sif for an oras:// one: the image is the SIF file)."""
    if uri.startswith(ORAS_SCHEME):
        host, _, path = uri[len(ORAS_SCHEME):].partition("/")
        return default_output(f"{SCHEME}{host}#{path}").removesuffix(".sqsh") + ".sif"
    rest = uri[len(SCHEME):]
    head, at, tail = rest.rpartition("@")
    digest = f"@{tail}" if at and tail.startswith("sha256:") else ""
    if digest:
        rest = head
    rest = rest.partition("@")[2] or rest
    rest = rest.partition("#")[2] or rest
    return re.sub(r"[/:]", "+", rest + digest) + ".sqsh"
