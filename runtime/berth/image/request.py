"""What crosses into the image part and back: an import's request and
result, what the pull of a registry or archive image needs, the image
cache's entry it gives, and the shared image store's client as an import
asks it (store/client.py implements it; the store stands above image/,
which does not import it).

Named tuples, as reference.py's (no dataclasses: their import costs each
`berth import` about 7 ms); no command-line namespace below cli.py.
"""

import abc
import collections


class ImportRequest(collections.namedtuple(
        "ImportRequest", "uri arch output cache_only resolve digest reuse dry_run quiet verbose "
                         "store_client porcelain",
        defaults=(None, None, False, False, False, False, False, False, False, None, False))):
    """`berth import [OPTIONS] URI` (see importer.py), or the import a
    `berth start docker://URI` makes (cache_only, digest). store_client: a
    function giving the shared image store's StoreClient, called only where
    an import may go through the store; None: no store."""
    __slots__ = ()

    def pull(self):
        return PullRequest(self.uri, arch=self.arch, quiet=self.quiet, verbose=self.verbose)


# What a build in the image cache (pull.build_cached, in its Resolved) reads: the URI it
# records as the image's source, the architecture asked for (None: the
# node's), and how much it says.
PullRequest = collections.namedtuple("PullRequest", "uri arch quiet verbose",
                                     defaults=(None, False, False))

# The image cache's squashfs (or SIF file) an import took: its path, and
# whether it was there already (nothing downloaded or built; a store's
# answer counts as made: the store may have pulled it for this request).
CachedImage = collections.namedtuple("CachedImage", "path found")

# `import --cache-only`'s answer: the CachedImage's path and found, and the
# digest the image was pulled by (None unless the request asked for it).
ImportResult = collections.namedtuple("ImportResult", "path digest found")


class StoreClient(abc.ABC):
    """The shared image store (BERTH_IMAGE_STORE) as `import --cache-only`
    asks it. Paths returned are the store's entries (or this node's copies)."""

    @abc.abstractmethod
    def serves(self, request, cfg, ref):
        """Whether the ImportRequest `request` of `ref` goes through the store."""

    @abc.abstractmethod
    def reused(self, cfg, uri, options, *, quiet):
        """--reuse: the store's entry last imported for `uri`, or None."""

    @abc.abstractmethod
    def ask(self, cfg, uri, quiet):
        """The store's entry of `uri` as its socket answers, or None: the
        caller imports into its own cache."""
