"""Command line: one sub-command per enroot verb.

Verb modules are imported only when their verb runs, so `berth start` does
not pay for the HTTP stack that `berth import` needs. Each verb is handed a
typed request (a named tuple its module defines) made of the parsed command
line: the argparse namespace stays here.
"""

import argparse
import importlib
import os
import sys
import typing

from berth import __version__, config
from berth.errors import BerthError, one_line


class VersionRequest(typing.NamedTuple):
    verbose: bool = False


def cmd_version(request, cfg):
    """The version; with --verbose, also what serves a squashfs here."""
    print(__version__)
    if request.verbose:
        from berth.image import squashserve
        print(squashserve.describe())
    return 0


def store_client():
    """The shared image store's client (store/client.py's SharedStore, an
    image.request.StoreClient), handed to the verbs that import (import,
    start docker://URI) in their request's store_client: the image import
    may not import the store, which stands beside the container verbs,
    above image/. Imported only when an import asks."""
    from berth.store.client import SharedStore
    return SharedStore()


def _add_import(sub):
    p = sub.add_parser("import", help="import a container image into a squashfs file")
    p.add_argument("-a", "--arch", help="architecture to pick from a multi-arch image")
    where = p.add_mutually_exclusive_group()
    where.add_argument("-o", "--output", help="output squashfs file")
    where.add_argument("--cache-only", action="store_true",
                       help="print the path of the image cache's squashfs instead of copying it")
    where.add_argument("--resolve", action="store_true",
                       help="print the registry URI pinned to the digest its tag names now "
                            "(one manifest request, nothing downloaded or cached)")
    p.add_argument("--digest", action="store_true",
                   help="with --cache-only: a second line with the digest the image was "
                        "pulled by, as its image.json records it (for the job's log)")
    p.add_argument("--porcelain", action="store_true",
                   help="with --cache-only: instead, one line of KEY=VALUE pairs for programs "
                        "(squashfs, digest, cached: berth/porcelain.py)")
    p.add_argument("--reuse", action="store_true",
                   help="take the image last imported for this URI here without asking the "
                        "registry (a moved tag is not seen); import when there is none")
    p.add_argument("--dry-run", action="store_true",
                   help="print where the image would be fetched from (each registry "
                        "endpoint in the order tried, after registries.conf) and stop")
    p.add_argument("uri", help="docker://[USER@][REGISTRY#]IMAGE[:TAG|@DIGEST], "
                               "oras://REGISTRY/IMAGE[:TAG|@DIGEST] (a SIF image), "
                               "docker-archive:PATH[:NAME:TAG|:@N], oci-archive:PATH[:REF] "
                               "or oci:DIR[:REF]; or IMAGE.sif: checked and described, "
                               "nothing made (a SIF image is started as it is)")
    p.set_defaults(store_client=store_client)


def _add_create(sub):
    p = sub.add_parser("create", help="unpack a squashfs or SIF image into a container root")
    p.add_argument("-n", "--name", help="container name (default: the image name)")
    p.add_argument("-f", "--force", action="store_true", help="replace an existing container")
    p.add_argument("image", help="IMAGE.sqsh or IMAGE.sif")


def _add_start_options(p):
    p.add_argument("-c", "--conf", action="append", default=[], help="batch configuration file")
    p.add_argument("-e", "--env", action="append", default=[], metavar="KEY[=VAL]")
    p.add_argument("--rc", help="script run in place of the container's /etc/rc")
    p.add_argument("-r", "--root", action="store_true", help="map the caller to root")
    p.add_argument("-w", "--rw", action="store_true", help="make the root filesystem writable")
    p.add_argument("-m", "--mount", action="append", default=[], metavar="SRC:DST[:FLAGS]")
    p.add_argument("--device", action="append", default=[], metavar="VENDOR/CLASS=NAME",
                   help="a CDI device, from the specs in BERTH_CDI_SPEC_DIRS")
    for ns in ("pid", "net", "ipc", "uts"):
        p.add_argument(f"--{ns}", action="store_true", help=f"new {ns} namespace")
    p.add_argument(
        "-d", "--detach", action="store_true",
        help="print the container pid once ready; stay up until SIGTERM or stdin closes",
    )
    p.add_argument(
        "--porcelain", action="store_true",
        help="with --detach: stdout's lines for programs, as KEY=VALUE pairs (digest= and "
             "cached= of a registry target, then pid=: berth/porcelain.py)",
    )
    p.add_argument(
        "--entrypoint", action="store_true",
        help="run the image's entrypoint with the command as its arguments; with "
             "--detach it must exec them (\"$@\"), and its environment is the container's",
    )


def _add_start(sub):
    p = sub.add_parser("start", help="run a command in a container, squashfs or SIF image, "
                                     "or registry image")
    _add_start_options(p)
    p.add_argument("--reuse", action="store_true",
                   help="take the image last imported for this URI here without asking the "
                        "registry; only with a docker:// or oras:// target")
    p.add_argument("container", help="NAME, IMAGE.sqsh, IMAGE.sif, docker://URI or "
                                     "oras://URI (the image cache's entry of URI, as "
                                     "`import --cache-only` gives it; with --detach, the digest "
                                     "it was pulled by is a line before the pid's)")
    p.add_argument("command", nargs=argparse.REMAINDER)
    p.set_defaults(store_client=store_client)


def _add_exec(sub):
    p = sub.add_parser("exec", help="run a command in a running container")
    p.add_argument("pid", type=int)
    p.add_argument("command", nargs=argparse.REMAINDER)


def _add_list(sub):
    p = sub.add_parser("list", help="list containers")
    p.add_argument("-f", "--fancy", action="store_true",
                   help="a table: NAME, PID, COMM, STATE, STARTED, TIME, MNTNS, USERNS, COMMAND")


def _add_remove(sub):
    p = sub.add_parser("remove", help="remove containers")
    p.add_argument("-f", "--force", action="store_true",
                   help="remove a running container too (a missing NAME is an error either way)")
    p.add_argument("names", nargs="+")


def _add_export(sub):
    p = sub.add_parser("export", help="export a container root as a squashfs image")
    p.add_argument("-o", "--output")
    p.add_argument("-f", "--force", action="store_true", help="overwrite the output")
    p.add_argument("--keep-setuid", action="store_true",
                   help="keep the setuid/setgid bits of files (stripped by default: in an "
                        "image a user exports, every file is root's)")
    p.add_argument("name")


def _add_batch(sub):
    p = sub.add_parser("batch", help="start a container described by a batch file")
    _add_start_options(p)
    p.add_argument("config", help="batch configuration file")
    p.add_argument("command", nargs=argparse.REMAINDER)


def _add_edf(sub):
    p = sub.add_parser("edf", help="environment definition files")
    edf_sub = p.add_subparsers(dest="edf_verb", required=True)
    show = edf_sub.add_parser("show", help="print the resolved environment")
    form = show.add_mutually_exclusive_group()
    form.add_argument("--json", action="store_true", help="JSON instead of TOML")
    form.add_argument("--spank", action="store_true",
                      help="KEY=VALUE lines for the SPANK plugin (image=, mount=, env=, ...)")
    show.add_argument("environment", help="NAME or PATH.toml")
    check = edf_sub.add_parser("check", help="validate an environment file")
    check.add_argument("environment", help="NAME or PATH.toml")


def _add_setup_user(sub):
    p = sub.add_parser("setup-user",
                       help="as root: make a user's cache, data, runtime and config dirs")
    p.add_argument("user", help="user name or uid")


# cache prune and store prune: image.verbs.parse_duration reads it
_OLDER_THAN_HELP = ("remove what was unused for DURATION: 30d, 12h, 90m, 2w "
                    "(a number alone is days)")


def _add_cache(sub):
    p = sub.add_parser("cache", help="show or prune the layer and image cache",
                       description="The layers and squashfs images in ENROOT_CACHE_PATH: "
                       "'list' (the default) counts them; 'prune' removes the least recently "
                       "used.")
    cache_sub = p.add_subparsers(dest="cache_verb", metavar="list|prune")
    cache_sub.add_parser("list", help="files and bytes of layers, images and partial files")
    prune = cache_sub.add_parser(
        "prune", help="remove the least recently used layers and images",
        description="Removes layers and images unused for DURATION, then the least recently "
        "used until the cache holds at most SIZE. Entries an import holds or uses meanwhile "
        "stay, and partial files (downloads and builds under way, or left by a killed import) "
        "go only by age. At least one limit is required; --max-size 0 empties the cache.")
    prune.add_argument("--older-than", metavar="DURATION", help=_OLDER_THAN_HELP)
    prune.add_argument("--max-size", metavar="SIZE",
                       help="then keep at most SIZE: bytes, or with K, M, G, T (500M, 20G)")


def _add_store(sub):
    p = sub.add_parser("store", help="the shared image store (BERTH_IMAGE_STORE)",
                       description="'serve' answers one request of the store's socket (run by "
                       "systemd as the store's account); 'list' shows the store's images; "
                       "'prune' removes the least recently used (as the store's account).")
    store_sub = p.add_subparsers(dest="store_verb", metavar="serve|list|prune", required=True)
    store_sub.add_parser(
        "serve", help="read a registry reference on stdin, import it into the store, "
        "answer 'ok PATH', 'private REASON' or 'error REASON' on stdout")
    listing = store_sub.add_parser("list", help="the store's images: size, last use, URI, path")
    listing.add_argument("--json", action="store_true",
                         help="a JSON list of {path, size, used, source, latest}, for programs")
    prune = store_sub.add_parser(
        "prune", help="remove the least recently used images and layers",
        description="As the store's account (BERTH_IMAGE_STORE_OWNER): removes images and "
        "layers unused for DURATION, then the least recently used until images and layers "
        "hold at most SIZE; partial files left by killed imports an hour old; uris/ links "
        "that name no image. Each goes with its import's lock held: what an import holds, "
        "or what was used in the last hour, stays. One line per file removed (size, last "
        "use, URI, path), then the total. At least one limit is required.")
    prune.add_argument("--older-than", metavar="DURATION", help=_OLDER_THAN_HELP)
    prune.add_argument("--max-size", metavar="SIZE",
                       help="then keep at most SIZE: bytes, or with K, M, G, T (500G, 1.5T)")
    prune.add_argument("--dry-run", action="store_true",
                       help="print what would be removed; remove nothing")
    # (SUPPRESS: `berth --quiet store prune` says the same)
    prune.add_argument("-q", "--quiet", action="store_true", default=argparse.SUPPRESS,
                       help="print the total only")


def _add_build(sub):
    p = sub.add_parser("build", help="build a squashfs image from a Containerfile, unprivileged",
                       description="Runs the Containerfile's steps in Berth's own container "
                       "(remapped root, no daemon), each step's result kept in the image "
                       "cache and reused while its instruction and inputs stay the same.")
    p.add_argument("-f", "--file", help="the Containerfile (default: CONTEXT/Containerfile, "
                                        "else CONTEXT/Dockerfile)")
    p.add_argument("--build-arg", action="append", default=[], metavar="NAME[=VALUE]",
                   help="a build argument (NAME alone: its value from the environment)")
    p.add_argument("--target", metavar="STAGE", help="build this stage (default: the last)")
    p.add_argument("--no-cache", action="store_true",
                   help="run every step, taking none from the cache")
    p.add_argument("-o", "--output", metavar="OUT",
                   help="the image to write: OUT.sqsh (default: image.sqsh), oci:DIR (an OCI "
                        "image layout) or oci-archive:FILE (that layout as a tar)")
    p.add_argument("--push", metavar="docker://[USER@]REGISTRY#REPO[:TAG]",
                   help="upload the image (as oci:DIR would hold it) to a registry under "
                        "that tag; with -o, the image is written there too, else nothing "
                        "is written locally")
    # (SUPPRESS: `berth --quiet build` says the same)
    p.add_argument("-q", "--quiet", action="store_true", default=argparse.SUPPRESS,
                   help="no progress lines, nor RUN's output unless it fails")
    p.add_argument("context", help="the build context: the directory COPY reads")


def _add_version(sub):
    sub.add_parser("version", help="print the version (--verbose: and what serves a squashfs)")


# verb -> (adds its sub-parser, "module:function" run with (request, cfg) ->
# exit status, "module:Request" the named tuple it takes)
VERBS = {
    "import": (_add_import, "berth.image.importer:cmd_import",
               "berth.image.request:ImportRequest"),
    "create": (_add_create, "berth.container.verbs:cmd_create",
               "berth.container.verbs:CreateRequest"),
    "start": (_add_start, "berth.container.verbs:cmd_start",
              "berth.container.verbs:StartRequest"),
    "exec": (_add_exec, "berth.container.verbs:cmd_exec", "berth.container.verbs:ExecRequest"),
    "list": (_add_list, "berth.container.verbs:cmd_list", "berth.container.verbs:ListRequest"),
    "remove": (_add_remove, "berth.container.verbs:cmd_remove",
               "berth.container.verbs:RemoveRequest"),
    "export": (_add_export, "berth.container.verbs:cmd_export",
               "berth.container.verbs:ExportRequest"),
    "batch": (_add_batch, "berth.container.verbs:cmd_batch",
              "berth.container.verbs:StartRequest"),
    "edf": (_add_edf, "berth.site.edf:cmd_edf", "berth.site.edf:EdfRequest"),
    "setup-user": (_add_setup_user, "berth.site.userdirs:cmd_setup_user",
                   "berth.site.userdirs:SetupUserRequest"),
    "cache": (_add_cache, "berth.image.verbs:cmd_cache", "berth.image.verbs:CacheRequest"),
    "store": (_add_store, "berth.store.verbs:cmd_store", "berth.store.verbs:StoreRequest"),
    "build": (_add_build, "berth.build.verbs:cmd_build", "berth.build.verbs:BuildRequest"),
    "version": (_add_version, "berth.cli:cmd_version", "berth.cli:VersionRequest"),
}


def _named(where):
    """The object "module:name" names, its module imported."""
    module_name, name = where.split(":")
    return getattr(importlib.import_module(module_name), name)


def _request(request_type, args):
    """The verb's request: the fields of the named tuple `request_type`
    that the command line gives (its sub-parser's and the global options),
    the rest left at their defaults."""
    given = vars(args)
    return request_type(**{name: given[name] for name in request_type._fields
                           if name in given})


def prog():
    """The name messages use: `enroot` when run through a link of that name
    (the role installs one where no real enroot is), else `berth`."""
    return "enroot" if os.path.basename(sys.argv[0] or "") == "enroot" else "berth"


def parser(verb=None):
    """The argument parser; given a verb, with that verb's sub-parser alone."""
    p = argparse.ArgumentParser(prog=prog(), description=__doc__.splitlines()[0])
    p.add_argument("-q", "--quiet", action="store_true", help="no progress output")
    p.add_argument("--verbose", action="store_true",
                   help="everything mksquashfs says (its statistics), as enroot shows it")
    p.add_argument("-v", "--version", action="version", version=__version__)
    sub = p.add_subparsers(dest="verb", required=True, metavar="VERB")
    for name, (add, *_) in VERBS.items():
        if verb in (None, name):
            add(sub)
    return p


def _verb(argv):
    """The verb of a command line, or None: building every sub-parser costs
    more than a `berth start` may spend, so only the one in use is built."""
    first = next((arg for arg in argv if not arg.startswith("-")), None)
    return first if first in VERBS else None


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parser(_verb(argv)).parse_args(argv)
    _, func_where, request_where = VERBS[args.verb]
    try:
        cfg = config.load()
        os.environ.update(cfg.network_environment())
        func = _named(func_where)
        return func(_request(_named(request_where), args), cfg)
    except BerthError as e:
        print(f"{prog()}: error: {one_line(str(e))}", file=sys.stderr)
        return e.status
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
