"""The manifest a registry import goes by, and `berth import --resolve`.

first_answer() asks the endpoints of registries.conf's rules in order
(mirrors first) until one serves the image: for an import, the manifest of
the node's platform (from an index when the image is multi-arch); for a
resolve, the first manifest alone, whose digest pinned() prints. Light to
import (no requests, no tqdm, no layers): a resolve, which the SPANK plugin
runs once per job at submission, loads this and registry.py alone.
"""

import collections
import os
import sys

from berth.config import Config
from berth.errors import AccessDenied, BerthError, ImageNotFound, UnknownHost
from berth.image.imageconfig import goarch
from berth.image.reference import DIGEST
from berth.image.registry import INDEX_TYPES, MANIFEST_TYPES, Registry, load_credentials


def pinned(ref, plan, *, cfg, arch, quiet):
    """`berth import --resolve`: the URI pinned to the digest the registry
    gives for it now, docker://[USER@]REGISTRY#REPOSITORY@sha256:..., naming
    the registry the reference resolved to (a short name's search registry;
    the rule's, never a mirror's host, so that the pinned URI goes through
    the same rules). The digest is the one a pull records: an index's for a
    multi-arch image, whatever the platform: the nodes pick theirs. One
    manifest request through the endpoints of `plan` (for a `ref` with a
    tag: one pinned already is its own answer, see importer.py). Asked
    once, without ENROOT_TRANSFER_RETRIES: the plugin leaves a failure
    that may pass to the nodes, which retry it then; retried here too, a
    busy registry would hold the submission as long again."""
    credentials, credentials_path = load_credentials(cfg["ENROOT_CONFIG_PATH"])
    once = Config({**dict(cfg.items()), "ENROOT_TRANSFER_RETRIES": "0"})
    answer = first_answer(plan, ref, cfg=once, credentials=credentials,
                          credentials_path=credentials_path, arch=arch, quiet=quiet,
                          pick_platform=False)
    where = answer.candidate
    if ref.is_oras:
        return f"oras://{where.registry}/{where.repository}@{answer.digest}"
    user = f"{where.user}@" if where.user else ""
    return f"docker://{user}{where.registry}#{where.repository}@{answer.digest}"


# What first_answer found: the Registry that answered, the reference it
# answered for (a candidate of registries.py: the registry as resolved, not
# the endpoint's host), the platform manifest, the digest the user pulled
# (an index's, for a multi-arch image) and the manifest's own digest.
Answer = collections.namedtuple("Answer", "source candidate manifest digest manifest_digest")


def first_answer(plan, ref, *, cfg, credentials=None, credentials_path=None, arch=None,
                 quiet=False, pick_platform=True):
    """An Answer from the first endpoint of `plan` that serves the image; a
    failure there (no connection, 5xx, 404, refused access, a bad answer)
    moves on to the next, and when all fail, one line names each endpoint
    and why. pick_platform=False: the first manifest alone (one request, no
    platform chosen; manifest and manifest_digest are the index's then)."""
    failures, kinds = [], set()
    upstream = {}  # candidate -> (digest, name) of its tag where its rule's location answers
    for place, (endpoint, candidate) in enumerate(plan):
        # USER@ names an account on the registry of the URI: a mirror takes
        # the credentials file's entry for its own host.
        endpoint_ref = candidate._replace(
            registry=endpoint.host, repository=endpoint.repository,
            user="" if endpoint.mirror else candidate.user)
        # (a resolve's one manifest request over transport.Direct: requests
        # and urllib3 would cost it more than its requests do)
        # (a busy endpoint with another after it is not waited for: that one is asked now)
        registry = Registry(endpoint_ref, cfg, credentials=credentials,
                            credentials_path=credentials_path, insecure=endpoint.insecure,
                            direct=not pick_platform, quiet=quiet,
                            fails_over=place < len(plan) - 1)
        try:
            found = _manifest(registry, endpoint_ref, arch=arch, pick_platform=pick_platform)
        except BerthError as e:
            if len(plan) == 1:
                raise
            failures.append(f"{endpoint.name(candidate)}: {e}")
            kinds.add(type(e))
            if not quiet:
                print(f"berth: {endpoint.name(candidate)} failed ({e}); trying the next",
                      file=sys.stderr)
            continue
        if endpoint.mirror and not candidate.digest:
            if candidate not in upstream:
                upstream[candidate] = _upstream_digest(plan, candidate, cfg=cfg,
                                                       credentials=credentials,
                                                       credentials_path=credentials_path)
            checked = upstream[candidate]
            if checked and checked[0] != found[1]:
                # said quiet or not: a mirror serving a tag of its own is news to the site
                failures.append(f"{endpoint.name(candidate)}: it answers {found[1]}, "
                                f"{checked[1]} {checked[0]}")
                print(f"berth: not using {failures[-1]}", file=sys.stderr)
                continue
        if not quiet and len(plan) > 1:
            doing = "pulling" if pick_platform else "resolving"
            print(f"berth: {doing} {ref} from {endpoint.name(candidate)}", file=sys.stderr)
        return Answer(registry, candidate, *found)
    # a refusal anywhere says more than the others' failures (the image store
    # takes it, or a 404 from every place, for an image it may not hold); a
    # name that no place knows will not pass either (the plugin refuses it)
    kind = AccessDenied if AccessDenied in kinds else \
        ImageNotFound if kinds == {ImageNotFound} else \
        UnknownHost if kinds == {UnknownHost} else BerthError
    raise kind(f"cannot get {ref} from any of {len(plan)} places: {'; '.join(failures)}")


def _manifest(registry, ref, *, arch, pick_platform):
    """(manifest, digest, manifest digest) as first_answer takes them from
    one endpoint's `registry`."""
    try:
        if pick_platform:
            return _platform_manifest(registry, ref, arch)
        manifest, media_type, digest = registry.manifest(ref.reference,
                                                         INDEX_TYPES + MANIFEST_TYPES)
        _check_type(media_type, INDEX_TYPES + MANIFEST_TYPES, ref)
        return manifest, digest, digest
    except (KeyError, TypeError, ValueError, AttributeError):
        raise malformed(ref) from None


# A mirror's answer for a tag is checked against the rule's own location
# where that answers within this bound: an air-gapped site's resolve waits
# no longer than this for a location it cannot reach.
UPSTREAM_CHECK_SECONDS = 5


def _upstream_digest(plan, candidate, *, cfg, credentials, credentials_path):
    """(digest, name) the location of `candidate`'s rule gives for its tag
    now, one HEAD request; None where it does not answer (unreachable,
    refused, no such tag: the mirror is then taken at its word)."""
    for endpoint, other in plan:
        if endpoint.mirror or other != candidate:
            continue
        bounded = min(cfg.number("ENROOT_CONNECT_TIMEOUT") or UPSTREAM_CHECK_SECONDS,
                      UPSTREAM_CHECK_SECONDS)
        # (retried, quietly, within the bound as any request)
        values = {**dict(cfg.items()), "ENROOT_CONNECT_TIMEOUT": str(bounded),
                  "ENROOT_TRANSFER_TIMEOUT": str(UPSTREAM_CHECK_SECONDS)}
        ref = candidate._replace(registry=endpoint.host, repository=endpoint.repository)
        registry = Registry(ref, Config(values), credentials=credentials,
                            credentials_path=credentials_path, insecure=endpoint.insecure,
                            direct=True, quiet=True)
        try:
            digest = registry.tag_digest(ref.reference, INDEX_TYPES + MANIFEST_TYPES)
        except BerthError:
            return None
        return (digest, endpoint.name(candidate)) if digest else None
    return None


def malformed(ref):
    return BerthError(f"the manifest or image config of {ref} is malformed")


def _invalid(field, value):
    return ValueError(f"{field} {value!r}")


def descriptor(entry, invalid=_invalid):
    """(digest, size) of a descriptor (a manifest's config or layer, an
    index's entry, a registry's or an OCI layout's), both checked: a DIGEST
    and a whole number of bytes. A field that is not is raised as
    invalid(field, value), so that each caller keeps its own words."""
    digest, size = entry["digest"], entry["size"]
    if not isinstance(digest, str) or not DIGEST.fullmatch(digest):
        raise invalid("digest", digest)
    if type(size) is not int or size < 0:
        raise invalid("size", size)
    return digest, size


def _platform_manifest(registry, ref, arch):
    """The image manifest for our platform, the digest the user pulled (an
    index's, for a multi-arch image) and the manifest's own digest."""
    manifest, media_type, digest = registry.manifest(ref.reference,
                                                     INDEX_TYPES + MANIFEST_TYPES)
    manifest_digest = digest
    if media_type in INDEX_TYPES:
        choice = platform_digest(manifest.get("manifests") or [], arch, ref)
        manifest, media_type, manifest_digest = registry.manifest(choice, MANIFEST_TYPES)
    _check_type(media_type, MANIFEST_TYPES, ref)
    return manifest, digest, manifest_digest


def _check_type(media_type, expected, ref):
    if media_type not in expected:
        raise BerthError(f"{ref}: unsupported manifest type '{media_type[:100]}' (Docker "
                         "schema 2 or OCI image expected)")


def platform_digest(entries, arch, ref):
    """The digest of the entry of an index's `entries` for `arch` (the
    node's by default). An index is whatever its registry or archive sent:
    entries, platforms or digests of the wrong shape make it malformed."""
    try:
        return _platform_entry(entries, arch, ref)
    except (KeyError, TypeError, ValueError, AttributeError):
        raise malformed(ref) from None


def _platform_entry(entries, arch, ref):
    wanted = arch or os.uname().machine
    name, _, variant = wanted.partition("/")
    name = goarch(name)
    available = []
    for entry in entries:
        plat = entry.get("platform") or {}
        if plat.get("os") != "linux":
            continue  # attestations and other systems
        available.append("/".join(filter(None, (plat.get("architecture"),
                                                plat.get("variant")))))
        if plat.get("architecture") == name and variant in ("", plat.get("variant")):
            return descriptor(dict(entry, size=0))[0]
    raise BerthError(f"{ref} has no image for architecture {wanted}; available: "
                     f"{', '.join(sorted(available)) or 'none'} (choose one with --arch)")
