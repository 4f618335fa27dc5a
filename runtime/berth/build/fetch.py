"""ADD of an http(s) URL: the file fetched into the build's directory
under the bounds a pull has (registry.py): ENROOT_CONNECT_TIMEOUT, the
stall timeout ENROOT_TRANSFER_TIMEOUT with the answer's headers due
within twice it and a body under the rate floor ended, a busy answer or
a broken transfer asked again (a GET from the start) at most
ENROOT_TRANSFER_RETRIES times, redirects followed to http(s) alone. The
server is hostile: a body is read up to its Content-Length alone (one
that ends short of it is broken), and one that would pass
BERTH_BUILD_ADD_MAX_SIZE is cut there and refused, never retried.

A file that came with an ETag is kept (urlcache.py) and revalidated at
the next build as BuildKit revalidates an http source: If-None-Match
sent, a 304 the kept file, a 304 nobody asked for an error answer.

The file is named as BuildKit's frontend names it: the last component of
the URL's path, else `__unnamed__`; its mode 0600 (BuildKit's) unless
--chmod says otherwise, its mtime the answer's Last-Modified where one
is given."""

import email.utils
import hashlib
import os
import posixpath
import tempfile
import typing
from urllib.parse import unquote, urljoin, urlsplit

from berth import units
from berth.build import context, urlcache
from berth.errors import BerthError
from berth.image import registry
from berth.image.transport import TLSError, TransferError, Unreachable, open_transport

SCHEMES = ("http://", "https://")
MODE = 0o600
_CHUNK = 1 << 20


class Fetched(typing.NamedTuple):
    digest: str          # sha256:... of the body
    size: int
    mtime: float = None  # the Last-Modified, in seconds since the epoch, or None
    etag: str = None     # the answer's ETag (urlcache.etag_of), or None
    reused: bool = False  # the file kept before, the server answering 304


def is_url(spec):
    return spec.startswith(SCHEMES)


def file_name(url):
    """The name BuildKit's frontend gives what `url` fetches."""
    name = posixpath.basename(unquote(urlsplit(url).path).rstrip("/"))
    return name if name not in ("", ".", "..") and "\0" not in name else "__unnamed__"



def _answer(transport, url, *, who, patience, etag):
    """The 200 answer for `url`, redirects followed, busy ones asked again;
    with an `etag` sent as If-None-Match, a 304 too."""
    headers = {"User-Agent": "berth"} | ({"If-None-Match": etag} if etag else {})
    for _ in range(registry.MAX_REDIRECTS + 1):
        response = transport.get(url, headers)
        location = response.headers.get("Location")
        if response.status_code in registry.BUSY:
            answered = f"answered {registry.status_text(response.status_code)}"
            asked = registry.retry_after(response.headers.get("Retry-After", ""))
            response.close()
            if not patience.wait(answered, asked):
                raise BerthError(f"{who}: {answered}{patience.gave_up()}")
            continue
        if response.status_code in registry.REDIRECTS and location:
            response.close()
            url = urljoin(url, location.strip())
            if not is_url(url):
                raise BerthError(f"{who}: redirected to {location[:200]!r}, no HTTP(S) URL")
            continue
        if response.status_code != 200 and not (etag and response.status_code == 304):
            response.close()
            raise BerthError(f"{who}: answered {registry.status_text(response.status_code)}")
        return response
    raise BerthError(f"{who}: more than {registry.MAX_REDIRECTS} redirects")


def _body(response, out, *, who, limit, patience, stall):
    """The answer's body into the file `out`: its Fetched."""
    declared = registry.content_length(response)
    if declared > limit:
        raise BerthError(f"{who}: {declared} bytes, more than BERTH_BUILD_ADD_MAX_SIZE "
                         f"({units.human_size(limit)})")
    out.seek(0)
    out.truncate()
    hasher, written = hashlib.sha256(), 0
    floor = registry.Floor(stall)
    for chunk in response.chunks(_CHUNK):
        written += len(chunk)
        if written > limit:
            raise BerthError(f"{who}: more than BERTH_BUILD_ADD_MAX_SIZE "
                             f"({units.human_size(limit)}) sent; refusing it")
        out.write(chunk)
        hasher.update(chunk)
        patience.progressed(written)
        floor.came(len(chunk), done=written == declared)
    registry.check_complete(response)
    modified = response.headers.get("Last-Modified")
    try:
        mtime = email.utils.parsedate_to_datetime(modified).timestamp() if modified else None
    except (TypeError, ValueError, IndexError, OverflowError):
        mtime = None
    return Fetched(digest=f"sha256:{hasher.hexdigest()}", size=written, mtime=mtime,
                   etag=urlcache.etag_of(response))


def fetch(cfg, url, path, *, who, quiet):
    """`url` into the file `path`: its Fetched. `who` (FILE:LINE: ADD
    URL) begins every error's line. What the cache kept of `url` is
    revalidated by its ETag (urlcache.py)."""
    kept = urlcache.found(cfg, url)
    try:
        return _fetch(cfg, url, path, who=who, quiet=quiet, kept=kept)
    finally:
        if kept is not None:
            os.close(kept.blob)


def _fetch(cfg, url, path, *, who, quiet, kept):
    """fetch()'s transfer, asking with `kept`'s ETag (a urlcache.Kept, or None)."""
    stall = cfg.number("ENROOT_TRANSFER_TIMEOUT") or None
    limit = cfg.size("BERTH_BUILD_ADD_MAX_SIZE")
    transport = open_transport(timeout=(cfg.number("ENROOT_CONNECT_TIMEOUT") or None, stall),
                               insecure=False, connections=1, direct=True)
    patience = registry.Patience(who=who, what="the download", bound=stall, quiet=quiet,
                                 count=cfg.number("ENROOT_TRANSFER_RETRIES"))
    with open(path, "wb") as out:
        while True:
            try:
                with _answer(transport, url, who=who, patience=patience,
                             etag=kept and kept.etag) as response:
                    if response.status_code != 304:
                        return _body(response, out, who=who, limit=limit, patience=patience,
                                     stall=stall)
                if urlcache.copy_out(kept, out):
                    return Fetched(digest=kept.digest, size=kept.size, mtime=kept.mtime,
                                   etag=kept.etag, reused=True)
                kept = None  # (the kept file changed: asked for whole, as never fetched)
            except (Unreachable, TLSError) as e:  # (asking again would repeat it)
                raise BerthError(f"{who}: {e}") from None
            except TransferError as e:  # (stalled, broken, too slow: from the start again)
                why = f"no byte within ENROOT_TRANSFER_TIMEOUT={stall} s" \
                    if str(e) == "timed out" else str(e)
                if not patience.wait(f"failed ({why})"):
                    raise BerthError(f"{who}: {why}{patience.gave_up()}") from None


def checksum_flag(step, specs):
    """ADD --checksum=sha256:HEX, or None; it takes one http(s) source."""
    value = next((f.partition("=")[2] for f in step.flags if f.startswith("--checksum=")), None)
    if value is None:
        return None
    algorithm, _, digest = value.partition(":")
    if algorithm != "sha256" or len(digest) != 64 or digest.strip("0123456789abcdef"):
        raise BerthError(f"{step.where}: ADD --checksum={value}: expected sha256:<64 hex digits>")
    if len(specs) != 1 or not is_url(specs[0]):
        raise BerthError(f"{step.where}: ADD --checksum: takes one http(s) URL as the source")
    return value


def check_specs(step, specs):
    """Refuse a URL berth build does not fetch: in COPY, a git repository,
    another scheme."""
    for spec in specs:
        if step.cmd == "COPY" and is_url(spec):
            raise BerthError(f"{step.where}: COPY {spec}: a URL is a source of ADD only")
        if step.cmd == "COPY" or "://" not in spec and not spec.startswith("git@"):
            continue  # (a path of the context, as BuildKit reads it)
        path = urlsplit(spec).path
        if spec.startswith("git@") or path.endswith(".git") or ".git#" in spec:
            raise BerthError(f"{step.where}: {step.cmd} {spec}: a git repository: not supported "
                             "by berth build")
        if not is_url(spec):
            raise BerthError(f"{step.where}: {step.cmd} {spec}: only http:// and https:// URLs "
                             "are fetched")


def source(cfg, url, *, where, work, quiet, checksum=None):
    """The context.Source of the file `url` fetched into the directory
    `work` (its Last-Modified as its mtime), checked against `checksum`."""
    who = f"{where}: ADD {url}"
    fd, path = tempfile.mkstemp(prefix="url-", dir=work)
    os.close(fd)
    fetched = fetch(cfg, url, path, who=who, quiet=quiet)
    if checksum is not None and fetched.digest != checksum:
        raise BerthError(f"{who}: its sha256 is {fetched.digest}, not the --checksum given")
    if fetched.etag and not fetched.reused:
        urlcache.keep(cfg, url, path=path, fetched=fetched)
    if fetched.mtime is not None:
        os.utime(path, (fetched.mtime, fetched.mtime))
    entry = context.Entry(path=path, name="", kind="file", mode=MODE, target="")
    return context.Source(spec=url, is_dir=False, entries=[entry], name=file_name(url))
