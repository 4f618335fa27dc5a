"""A client for the registry HTTP API v2: manifests and blobs; pulls, and
the requests of a push (push.py) through ask() and check().

Authentication follows the registry's WWW-Authenticate challenge: a Bearer
token from the realm it names (anonymous, or with the user's credentials) or
Basic with the credentials. Credentials come from a netrc file, as in enroot,
and go to the origin (scheme, host, port) they are for alone: a redirect
elsewhere (blobs often live on a CDN) is followed without them, and one to
plain HTTP only where HTTP is allowed.

A registry is not trusted to be sane: every body read into memory has a
cap (manifests, indexes and token answers MAX_MANIFEST, image configs
MAX_CONFIG), a blob is cut at the size its manifest declares and refused
past it, and ENROOT_TRANSFER_TIMEOUT is a stall timeout: a connection on
which no byte arrives for that many seconds (answer or body) fails; a
document read into memory must also arrive whole within it, so that one
dripping a byte at a time never holds an import for days; a blob, streamed
to a file, must keep above a rate floor (see Floor) for the same reason.

A busy registry is waited for: what curl's --retry (enroot's) takes for
transient, a 408, 429, 500, 502, 503 or 504 answer or a timeout, and a
connection reset or broken midway, is asked again after a wait (see
Patience), at most ENROOT_TRANSFER_RETRIES times per request; a broken
blob download resumes from the bytes it has where the registry honours a
Range request, and a try that moved it on starts its retries over. What
asking again would only repeat ends the request at once, in one line: a
name that does not resolve (UnknownHost), a connection refused or with
no route, a TLS handshake that fails, any other answer (a 401, 403 or 404 included) and a
malformed one.

The requests go over a transport of transport.py: http.client for a
resolve (direct=True), requests for pulls.
"""

import base64
import hashlib
import json
import os
import random
import re
import stat
import sys
import time
from urllib.parse import urlencode, urljoin, urlsplit

from berth import units
from berth.errors import AccessDenied, BerthError, ImageNotFound, UnknownHost
from berth.image.reference import DIGEST
from berth.image.transport import (
    NoSuchHost,
    TLSError,
    TransferError,
    Unreachable,
    UntrustedCertificate,
    deadline,
    open_transport,
    origin,
)

INDEX_TYPES = (
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
)
MANIFEST_TYPES = (
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
)
_CHALLENGE_PARAM = re.compile(r'(\w+)="([^"]*)"')
_CHUNK = 1 << 20
MAX_MANIFEST = 4 << 20  # manifests, indexes, token answers: a few KiB in practice
MAX_CONFIG = 8 << 20  # image configs: tens of KiB in practice
MAX_REDIRECTS = 10
REDIRECTS = (301, 302, 303, 307, 308)
# answers that say: ask again later (curl's --retry's transient ones)
BUSY = (408, 429, 500, 502, 503, 504)
# With ENROOT_TRANSFER_TIMEOUT 0 (no limit), how long a request's retries
# may go on (a Retry-After past it is not waited for).
UNTIMED_RETRY_BOUND = 3600
# What a try of a blob download must move, in bytes a second averaged over
# each ENROOT_TRANSFER_TIMEOUT seconds (curl's --speed-limit, with the
# timeout its --speed-time): 1 KiB/s, slower than any link a pull may need.
RATE_FLOOR = 1 << 10
_CONTENT_RANGE = re.compile(r"bytes (\d+)-\d+/(?:\d+|\*)")


def sha256_digest(data):
    return "sha256:" + hashlib.sha256(data).hexdigest()


def load_credentials(config_path):
    """The netrc credentials file, or None when there is none; refused unless 0600."""
    path = os.path.join(config_path, ".credentials")
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None, path
    if stat.S_IMODE(st.st_mode) & 0o077:
        raise BerthError(f"{path}: mode {stat.S_IMODE(st.st_mode):04o} lets others read "
                         "the registry passwords; chmod 0600 it")
    import netrc
    try:
        return netrc.netrc(path), path
    except netrc.NetrcParseError as e:
        raise BerthError(f"{path}:{e.lineno}: {e.msg}") from None


class Registry:
    """One registry and repository, with its authentication and timeouts.
    direct=True: over http.client (transport.Direct), for a resolve's few requests."""

    def __init__(self, ref, cfg, credentials=None, credentials_path="", insecure=False,
                 direct=False, quiet=False, fails_over=False, actions="pull"):
        self.ref = ref
        self.actions = actions  # what a token is asked for: "pull", or "pull,push"
        self.credentials = credentials
        self.credentials_path = credentials_path
        # registries.conf's `insecure = true` for this endpoint: plain HTTP
        # allowed and TLS certificates not verified, as podman does.
        self.insecure = insecure
        self.allow_http = insecure or cfg.flag("ENROOT_ALLOW_HTTP")
        # 0 means no limit, as in enroot; the transfer timeout is a stall
        # timeout here (no byte for that long), never a limit on a whole blob.
        connect = cfg.number("ENROOT_CONNECT_TIMEOUT") or None
        self.transfer_timeout = cfg.number("ENROOT_TRANSFER_TIMEOUT") or None
        self.timeout = (connect, self.transfer_timeout)
        self.retries = cfg.number("ENROOT_TRANSFER_RETRIES")
        self.quiet = quiet  # no line while a retry waits
        # fails_over: another endpoint is asked when this one fails: until it
        # has answered a manifest, a failure is not retried (the next is asked now)
        self.fails_over = fails_over
        self.answered = False
        # (a pool as large as the parallel downloads, so that none waits)
        self.transport = open_transport(self.timeout, insecure,
                                        cfg.number("ENROOT_MAX_CONNECTIONS"), direct)
        self.base = ""
        self.authorization = None  # the Authorization header for self.base's origin
        self.authenticated = False
        self.login_source = ""  # what _login found, for error messages
        self.typed_password = None

    # -- connection and authentication ------------------------------------

    def _first_get(self, path, headers, method="GET", what=None, body=None):
        """GET `path` as the first request to the registry: it finds the
        scheme the registry speaks (HTTPS, else plain HTTP where allowed) and,
        on a 401, authenticates as its challenge says and asks again. The
        first request is the one wanted, not a /v2/ probe before it: a round
        trip less to a registry across the WAN. A registry whose TLS
        certificate is refused has TLS: never asked over plain HTTP then."""
        host = self.ref.registry
        try:
            response = self._get(f"https://{host}{path}", headers, method, what, body=body)
            self.base = f"https://{host}"
        except UntrustedCertificate as e:
            raise BerthError(
                f"registry {host}: its TLS certificate is not trusted ({e}); add its CA to "
                "the system's CA certificates, or mark the registry insecure in "
                "registries.conf") from None
        except TLSError as e:
            if not self.allow_http:
                raise BerthError(
                    f"registry {host} does not speak HTTPS ({e}); if it is a plain "
                    "HTTP registry, set ENROOT_ALLOW_HTTP=yes in enroot.conf") from None
            response = self._get(f"http://{host}{path}", headers, method, what, body=body)
            self.base = f"http://{host}"
        if response.status_code == 401 and not self.authenticated:
            response.close()  # only its challenge counts: its body is never read
            self._authenticate(response.headers.get("WWW-Authenticate", ""))
            response = self._get(f"{self.base}{path}", headers, method, what, body=body)
        return response

    def _login(self, *hosts):
        """(login, password) from the credentials file; for USER@ without an
        entry there, the password is asked on the terminal, as enroot does."""
        for host in hosts:
            entry = self.credentials.authenticators(host) if self.credentials else None
            if entry and (not self.ref.user or entry[0] == self.ref.user):
                self.login_source = f"the credentials in {self.credentials_path}"
                return entry[0], entry[2]
        if self.ref.user and sys.stdin.isatty():
            if self.typed_password is None:
                import getpass
                self.typed_password = getpass.getpass(
                    f"Password for {self.ref.user}@{self.ref.registry}: ")
            self.login_source = f"the password typed for {self.ref.user}"
            return self.ref.user, self.typed_password
        return None

    def _authenticate(self, challenge):
        scheme, _, params = challenge.partition(" ")
        params = dict(_CHALLENGE_PARAM.findall(params))
        host = self.ref.registry
        if scheme.lower() == "basic":
            login = self._login(host, host.split(":")[0])
            if login is None:
                raise self._denied()
            self.authorization = _basic(login)
            self.authenticated = True
            return
        if scheme.lower() != "bearer" or "realm" not in params:
            raise BerthError(f"registry {host}: unsupported authentication '{challenge}'")
        realm = params["realm"]
        if not realm.startswith(("https://", "http://")):
            raise BerthError(f"registry {host}: token service '{realm}' is no HTTP(S) URL")
        if realm.startswith("http://") and not self.allow_http:
            raise BerthError(f"registry {host}: token service {realm} is plain HTTP; "
                             "set ENROOT_ALLOW_HTTP=yes to allow it")
        query = {"scope": f"repository:{self.ref.repository}:{self.actions}"}
        if "service" in params:
            query["service"] = params["service"]
        url = f"{realm}{'&' if urlsplit(realm).query else '?'}{urlencode(query)}"
        realm_host = urlsplit(realm).hostname or ""
        login = self._login(host, host.split(":")[0], realm_host)
        response = self._get_with_retries(url, {}, "GET", "the token request",
                                          authorization=login and _basic(login),
                                          who=f"token service {realm}")
        if response.status_code != 200:
            response.close()
            if response.status_code in (401, 403):
                raise self._denied()
            raise BerthError(f"token service {realm} answered {response.status_code}")
        body = self._read(response, MAX_MANIFEST, f"the answer of token service {realm}")
        try:
            body = json.loads(body)
            token = body.get("token") or body["access_token"]
            if not isinstance(token, str) or not token.isprintable():
                raise TypeError("not a token")
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
            raise BerthError(f"token service {realm} sent no token") from None
        self.authorization = f"Bearer {token}"
        self.authenticated = True

    def _denied(self, status="401 Unauthorized"):
        source = self.login_source
        if not source and self.credentials_path is None:
            source = "no credentials (an anonymous pull)"
        elif not source:
            who = f"{self.ref.user}@{self.ref.registry}" if self.ref.user else self.ref.registry
            found = "" if self.credentials else " (not found)"
            source = f"no credentials for {who} in {self.credentials_path}{found}"
        return AccessDenied(f"registry {self.ref.registry} refused access to "
                            f"{self.ref.repository} ({status}) with {source}"
                            f"{self.ref.registry_hint()}")

    def _get(self, url, headers=None, method="GET", what=None, patience=None, body=None):
        """GET (or HEAD) from the registry; a 401 once authenticated means our
        token expired (long pulls outlive them): get a fresh one and ask again.
        `what` names the document in the lines about retries."""
        response = self._get_with_retries(url, headers, method, what, patience, body=body)
        if response.status_code == 401 and self.authenticated:
            challenge = response.headers.get("WWW-Authenticate", "")
            response.close()
            self._authenticate(challenge)
            response = self._get_with_retries(url, headers, method, what, patience, body=body)
        return response

    def _patience(self, who, what):
        """The retries one request may make (none before a failing-over
        endpoint has answered)."""
        count = 0 if self.fails_over and not self.answered else self.retries
        return Patience(who, what, count, self.transfer_timeout, self.quiet)

    def _get_with_retries(self, url, headers, method, what, patience=None, authorization=None,
                          who=None, body=None):
        """GET, asking again while the registry is busy or the connection
        breaks, as `patience` allows (by default, the registry's own for one
        request); past that, one line naming the server, the last answer or
        error and how long it was tried. A connection never made (no such
        host, refused) is not asked again: one line at once. who,
        authorization: another server's (a token service), the registry's
        by default."""
        if who is None:
            who, authorization = f"registry {self.ref.registry}", self.authorization
        what = what or urlsplit(url).path
        patience = patience or self._patience(who, what)
        while True:
            try:
                # Streamed always: no body is read whole before its size is checked.
                response = self._follow(url, headers, authorization, who, method, body=body)
            except TLSError as e:
                if not self.base:
                    raise  # _first_get is finding out whether the registry speaks TLS
                raise BerthError(f"{who}: {e}") from None
            except Unreachable as e:
                raise (UnknownHost if isinstance(e, NoSuchHost) else BerthError)(
                    f"{who}: {e}") from None
            except TransferError as e:
                if patience.wait(f"failed ({e})"):
                    continue
                raise BerthError(f"{who}: {e}{patience.gave_up()}") from None
            if response.status_code not in BUSY:
                return response
            answered = f"answered {status_text(response.status_code)}"
            asked = retry_after(response.headers.get("Retry-After", ""))
            response.close()
            if not patience.wait(answered, asked):
                raise BerthError(f"{who}: {what} {answered}{patience.gave_up()}")

    def _follow(self, url, headers, authorization, who, method="GET", body=None):
        """GET `url`, following redirects; `authorization` goes to url's own
        origin alone. `who` names the server in errors. A `body` file is
        sent from its start each time (a retry, a redirect)."""
        own, first = origin(url), url
        for _ in range(MAX_REDIRECTS + 1):
            sent = {"User-Agent": "berth", **(headers or {})}
            if authorization and origin(url) == own:
                sent["Authorization"] = authorization
            if hasattr(body, "seek"):
                body.seek(0)
            response = self.transport.get(url, sent, method, body=body)
            location = response.headers.get("Location")
            if response.status_code not in REDIRECTS or not location:
                return response
            response.close()
            url = self._redirect(who, url, location)
        raise BerthError(f"{who}: more than {MAX_REDIRECTS} redirects from {first}")

    def _redirect(self, who, url, location):
        """Where a redirect from `url` to `location` leads, if it may be followed."""
        try:
            target = urljoin(url, location.strip())
            parts = urlsplit(target)
            parts.port  # noqa: B018 (ValueError for a port that is no number)
        except ValueError:
            target, parts = None, None
        if parts is None or parts.scheme not in ("https", "http") or not parts.hostname:
            raise BerthError(f"{who}: redirect from {url} to {location[:200]!r}, "
                             "no HTTP(S) URL")
        if parts.scheme == "http" and not self.allow_http:
            raise BerthError(f"{who}: redirect from {url} to plain HTTP {target}; "
                             "set ENROOT_ALLOW_HTTP=yes to allow it")
        return target

    # -- a push's requests ----------------------------------------------------

    def ask(self, where, *, method, what, headers=None, body=None):
        """The answer to a request for `where`, a path of the registry or a
        URL it gave (an upload's Location, followed as a redirect is); the
        first request connects (see _first_get)."""
        if not self.base:
            return self._first_get(where, headers or {}, method, what=what, body=body)
        who = f"registry {self.ref.registry}"
        url = self._redirect(who, self.base + "/v2/", where) \
            if not where.startswith("/") else self.base + where
        if origin(url) != origin(self.base):  # (the credentials are the registry's alone)
            return self._get_with_retries(url, headers, method, what=what, who=who, body=body)
        return self._get(url, headers, method, what=what, body=body)

    def check(self, response, *, what, expected):
        """`response` (closed), if its status is `expected`; else one line
        naming the registry and `what` was refused or answered."""
        response.close()
        if response.status_code == expected:
            return response
        if response.status_code == 401:
            raise self._denied()
        if response.status_code == 403:
            raise self._denied("403 Forbidden")
        raise BerthError(f"registry {self.ref.registry}: {what} answered "
                         f"{status_text(response.status_code)}")

    # -- manifests and blobs ------------------------------------------------

    def tag_digest(self, tag, accept):
        """The digest the registry gives for `tag` now, from a HEAD (which
        Docker Hub does not count as a pull); None when it names none."""
        path = f"/v2/{self.ref.repository}/manifests/{tag}"
        headers = {"Accept": ", ".join(accept)}
        what = f"manifest {tag}"
        response = (self._get(f"{self.base}{path}", headers, "HEAD", what) if self.base
                    else self._first_get(path, headers, "HEAD", what))
        response.close()
        if response.status_code != 200:
            raise BerthError(f"registry {self.ref.registry}: manifest {tag} answered "
                             f"{response.status_code}")
        digest = response.headers.get("Docker-Content-Digest", "")
        return digest if DIGEST.fullmatch(digest) else None

    def manifest(self, reference, accept):
        """(parsed manifest, media type, digest) for a tag or digest; the
        first manifest asked for connects (see _first_get)."""
        path = f"/v2/{self.ref.repository}/manifests/{reference}"
        headers = {"Accept": ", ".join(accept)}
        what = f"manifest {reference}"
        response = (self._get(f"{self.base}{path}", headers, what=what) if self.base
                    else self._first_get(path, headers, what=what))
        if response.status_code != 200:
            response.close()
        if response.status_code == 404:
            raise ImageNotFound(f"image not found: {self.ref.registry}/{self.ref.repository}"
                             f"{'@' if reference.startswith('sha256:') else ':'}{reference}"
                             f"{self.ref.registry_hint()}")
        if response.status_code == 401:
            raise self._denied()
        if response.status_code == 403:
            raise self._denied("403 Forbidden")
        if response.status_code != 200:
            raise BerthError(f"registry {self.ref.registry}: manifest {reference} answered "
                             f"{response.status_code}")
        body = self._read(response, MAX_MANIFEST, f"manifest {reference} of {self.ref}")
        self.answered = True
        digest = sha256_digest(body)
        expected = reference if reference.startswith("sha256:") else \
            response.headers.get("Docker-Content-Digest", digest)
        if digest != expected:
            raise BerthError(f"manifest digest mismatch for {self.ref}: expected {expected}, "
                             f"got {digest}")
        try:
            parsed = json.loads(body)
        except (ValueError, RecursionError):
            raise BerthError(f"manifest {expected} of {self.ref} is not JSON") from None
        if not isinstance(parsed, dict):
            raise BerthError(f"manifest {expected} of {self.ref} is not a JSON object")
        # mediaType is optional in OCI manifests; the header then says it.
        media_type = (parsed.get("mediaType")
                      or response.headers.get("Content-Type", "").split(";")[0])
        return parsed, media_type, digest

    def blob(self, digest, size, what="image config"):
        """The whole blob in memory, verified (for small blobs: image configs):
        at most `size` bytes (what the manifest declares) and MAX_CONFIG."""
        if size > MAX_CONFIG:
            raise BerthError(f"{what} {digest} of {self.ref} is {size} bytes, more than the "
                             f"{MAX_CONFIG >> 20} MiB berth reads; refusing it")
        response = self._blob_response(digest)
        body = self._read(response, size, f"{what} {digest} of {self.ref}",
                          limit_is="the size its manifest declares")
        if sha256_digest(body) != digest:
            raise BerthError(f"blob digest mismatch: expected {digest}, got "
                             f"{sha256_digest(body)}")
        return body

    def download(self, digest, size, out, on_bytes):
        """Stream a blob of `size` bytes (as its manifest declares) into the
        open file `out`; returns the sha256 digest of what was written. A
        broken transfer is asked again within the request's retries, from
        the bytes written where the registry answers the Range asked for
        (206), else from the start; one that moved it on starts the
        retries over (Patience). A try under the rate floor (Floor)
        fails as a stalled one does, and is asked again likewise. A blob
        larger than declared is cut there and refused, never retried."""
        out.seek(0)
        out.truncate()
        hasher, written = hashlib.sha256(), 0
        patience = self._patience(f"registry {self.ref.registry}", f"blob {digest}")
        while True:
            try:
                response = self._blob_response(digest, patience, written)
                with response:
                    if response.status_code == 200 and written:  # the whole blob again
                        out.seek(0)
                        out.truncate()
                        on_bytes(-written)
                        hasher, written = hashlib.sha256(), 0
                    if written + content_length(response) > size:
                        raise self._oversized(digest, size)
                    floor = Floor(self.transfer_timeout)
                    for chunk in response.chunks(_CHUNK):
                        if written + len(chunk) > size:
                            raise self._oversized(digest, size)
                        out.write(chunk)
                        hasher.update(chunk)
                        written += len(chunk)
                        on_bytes(len(chunk))
                        patience.progressed(written)
                        floor.came(len(chunk), done=written == size)
                    check_complete(response)
                return "sha256:" + hasher.hexdigest()
            except TransferError as e:  # a broken transfer, _CutShort and _TooSlow included
                if not patience.wait(f"failed ({e}) after {written} of {size} bytes"):
                    raise BerthError(f"download of {digest} from {self.ref.registry} "
                                     f"failed: {e}{patience.gave_up()}") from None

    def _oversized(self, digest, size):
        return BerthError(f"registry {self.ref.registry} sends blob {digest} of "
                          f"{self.ref.repository} larger than the {size} bytes its manifest "
                          "declares; refusing it")

    def _read(self, response, limit, what, limit_is=None):
        """The body of `response`, refused past `limit` bytes before it is all read."""
        limit_is = limit_is or f"the {limit >> 20} MiB berth reads"
        try:
            with response, deadline(response, self.transfer_timeout):
                if content_length(response) > limit:
                    raise BerthError(f"{what} is larger than {limit_is} ({limit} bytes); "
                                     "refusing it")
                body = bytearray()
                for chunk in response.chunks(1 << 16):
                    body += chunk
                    if len(body) > limit:
                        raise BerthError(f"{what} is larger than {limit_is} ({limit} bytes); "
                                         "refusing it")
                check_complete(response)
                return bytes(body)
        except TransferError as e:
            raise BerthError(f"registry {self.ref.registry}: reading {what} failed: "
                             f"{e}") from None

    def _blob_response(self, digest, patience=None, start=0):
        """The answer for a blob: 200, or from byte `start` on a 206 (a
        resumed download asks for the Range from there)."""
        url = f"{self.base}/v2/{self.ref.repository}/blobs/{digest}"
        headers = {"Range": f"bytes={start}-"} if start else None
        response = self._get(url, headers, what=f"blob {digest}", patience=patience)
        if response.status_code == 206 and start:
            match = _CONTENT_RANGE.fullmatch(response.headers.get("Content-Range", ""))
            if match and int(match.group(1)) == start:
                return response
            response.close()
            raise BerthError(f"registry {self.ref.registry}: blob {digest} of "
                             f"{self.ref.repository}: the range answered is not the "
                             f"bytes={start}- asked for")
        if response.status_code != 200:
            response.close()
            raise BerthError(f"registry {self.ref.registry}: blob {digest} of "
                             f"{self.ref.repository} answered {response.status_code}")
        return response


class Patience:
    """The retries left to one request (the tries of a blob download share
    one): at most `count` after the first, each after a wait that doubles
    from 0.5-1 s, jittered so that the nodes of a job ask apart, or as long
    as the answer's Retry-After asks; none that would start later than
    `bound` seconds (the transfer timeout, the stall timeout's measure)
    after the first try or, for a download, its last byte. A try that
    took a download past where it had got by a window's worth of the rate
    floor (RATE_FLOOR times the transfer timeout; a byte where that is 0)
    starts them over, the count and the doubling: it did not fail to move
    it. A download stays bounded: each try that starts them over moved it
    on by what the floor asks of a window, and a blob has an end. A line
    says each wait (unless quiet); gave_up() what the line at the bound
    adds."""

    def __init__(self, who, what, count, bound, quiet):
        self.who, self.what, self.count, self.quiet = who, what, count, quiet
        self.bound = bound or UNTIMED_RETRY_BOUND
        self.bound_name = (f"ENROOT_TRANSFER_TIMEOUT={bound}" if bound
                           else f"{UNTIMED_RETRY_BOUND} s, as ENROOT_TRANSFER_TIMEOUT=0")
        self.advance = RATE_FLOOR * bound if bound else 1
        self.retries = 0  # since the last try that moved the download on
        self.tries = 1
        # the most bytes the download had, and that before the try under way
        # (one that answers a Range with the whole blob again moves it on
        # only past there)
        self.furthest = self.before = 0
        self.started = self.last_progress = time.monotonic()
        self.why_not = ""  # why the last failure was not tried again

    def progressed(self, written):
        """Bytes came, `written` of the download's now: the time bound counts from now."""
        self.last_progress = time.monotonic()
        self.furthest = max(self.furthest, written)

    def wait(self, why, asked=None):
        """After a try that failed (`why`: what it answered or how it broke;
        `asked`: the seconds its Retry-After asks for, or None): wait, then
        True for another try; False at once where the bound would be passed."""
        if self.furthest - self.before >= self.advance:
            self.retries = 0
        self.before = self.furthest
        if self.retries >= self.count:
            self.why_not = f"ENROOT_TRANSFER_RETRIES={self.count}"
            return False
        delay = asked if asked is not None else 2 ** self.retries * random.uniform(0.5, 1)
        if time.monotonic() + delay > self.last_progress + self.bound:
            self.why_not = (f"its Retry-After of {asked:.0f} s" if asked is not None
                            else "the next wait") + f" would pass {self.bound_name}"
            return False
        self.retries += 1
        self.tries += 1
        if not self.quiet:
            until = time.strftime("%H:%M:%S", time.localtime(time.time() + delay))
            print(f"berth: {self.who}: {self.what} {why}; asking again at {until} "
                  f"(in {delay:.1f} s, retry {self.retries} of {self.count})", file=sys.stderr)
        time.sleep(delay)
        return True

    def gave_up(self):
        """How long and how often it was tried, and the bound that ended it;
        nothing where no retry was allowed (ENROOT_TRANSFER_RETRIES=0)."""
        if not self.count:
            return ""
        took = time.monotonic() - self.started
        return (f" (tried {self.tries} time{'s' if self.tries > 1 else ''} in {took:.0f} s; "
                f"{self.why_not})")


class _TooSlow(TransferError):
    """A try of a blob download that kept under the rate floor."""


class Floor:
    """The rate floor of one try of a blob download: RATE_FLOOR bytes a
    second, averaged over each `window` seconds (the transfer timeout)
    from its answer on, or the rest of the blob within it; None (the
    timeout 0, no limit): no floor, as no stall timeout. A piece comes as
    its bytes do (transport._pieces), at least every `window` seconds, or
    the stall timeout ends the try: one under the floor ends within two
    windows."""

    def __init__(self, window):
        self.window = window
        self.began, self.moved = time.monotonic(), 0

    def came(self, count, done):
        """`count` bytes came (`done`: the blob's last): _TooSlow where
        the window they end is under the floor."""
        self.moved += count
        took = time.monotonic() - self.began
        if not self.window or done or took < self.window:
            return
        if self.moved < RATE_FLOOR * self.window:
            raise _TooSlow(f"moved {self.moved} bytes in {took:.0f} s, under the floor of "
                           f"{RATE_FLOOR >> 10} KiB/s over ENROOT_TRANSFER_TIMEOUT="
                           f"{self.window} s")
        self.began, self.moved = time.monotonic(), 0


def status_text(code):
    """`429 Too Many Requests`: a status with its standard phrase."""
    import http
    try:
        return f"{code} {http.HTTPStatus(code).phrase}"
    except ValueError:
        return str(code)


def retry_after(value):
    """The seconds a Retry-After header asks to wait (a number of seconds
    or an HTTP date), or None when it says neither."""
    value = value.strip()
    seconds = units.whole(value)
    if seconds is not None:
        return float(seconds)
    import datetime
    import email.utils
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:  # (a -0000 zone: UTC, with no place said)
        when = when.replace(tzinfo=datetime.timezone.utc)
    return max(0.0, when.timestamp() - time.time())


class _CutShort(TransferError):
    """A body that ended before its Content-Length: http.client, which both
    transports read bodies off, returns what came as if it were whole."""


def check_complete(response):
    """Raise _CutShort, worded as urllib3 2's error, when fewer bytes came
    over the wire than the response's Content-Length announced."""
    announced, received = content_length(response), response.received
    if announced and received < announced:
        raise _CutShort(f"Connection broken: IncompleteRead ({received} bytes read, "
                        f"{announced - received} more expected)")


def content_length(response):
    """The Content-Length the server announces, or 0 when none or not a number."""
    return units.whole(response.headers.get("Content-Length", "")) or 0


def _basic(login):
    """The Basic Authorization header of (login, password), UTF-8 as curl sends it."""
    return "Basic " + base64.b64encode(f"{login[0]}:{login[1]}".encode()).decode()
