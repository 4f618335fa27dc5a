"""How the registry client's GETs go over the wire; registry.py keeps the
protocol (authentication, redirects, retries, size limits), the same over
either transport here.

- Direct, on http.client: the few requests of `berth import --resolve`,
  which the SPANK plugin runs once per job at submission. Importing
  requests and urllib3 costs such a resolve more than its requests do.
- Pooled, on requests: pulls (one connection pool for the parallel
  downloads), and every request while a proxy is set in the environment
  (HTTP_PROXY, HTTPS_PROXY, ALL_PROXY, any case; requests honours them
  and NO_PROXY).

Both take the same settings: a connect timeout and a stall timeout (no byte
for that long), certificates verified against the CA bundle requests would
use (REQUESTS_CA_BUNDLE, CURL_CA_BUNDLE, else certifi's, which Debian points
at /etc/ssl/certs/ca-certificates.crt; Direct reads that one's directory
instead, see lazy_ca_path), or not at all for an `insecure` endpoint.
Neither follows a redirect (registry.py does, keeping credentials to their
own origin) nor adds credentials of its own: requests' lookup of ~/.netrc
is off, as the registry's credentials are $ENROOT_CONFIG_PATH/.credentials
alone.

deadline() cuts a response off after a time, whatever comes meanwhile:
registry.py reads documents (manifests, tokens, configs) under it. An
answer's head (its status line and headers) must be whole within twice the
stall timeout, over either transport (_HeadTimer): a stall timeout counts
from byte to byte, so without it a head sent a byte at a time would hold a
request for as long as the server likes.

A body is read the same way over either transport, off http.client's
response, in pieces as they arrive (see _pieces): a connection cut or reset
midway loses no byte that came before it, which a resumed download needs.
It comes as it was sent: no Content-Encoding is asked for (identity, what
http.client asks anyway) and none is undone, so that its size, Range and
digest count the bytes on the wire.

Failures are TransferError (TLSError for a failed handshake, and of that
UntrustedCertificate where TLS is there but its certificate is refused;
Unreachable for a connection never made, and of that NoSuchHost where the
name does not exist), whose text is the reason alone: "Connection
refused", "timed out", "[SSL: CERTIFICATE_VERIFY_FAILED] ...".

Either way the answers are parsed by http.client (urllib3 builds on it):
no HTTP parser of the runtime's own reads what a registry sends.
"""

import contextlib
import os
import re
from urllib.parse import urlsplit

from berth.errors import BerthError

PROXY_VARIABLES = ("http_proxy", "https_proxy", "all_proxy")
SYSTEM_CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
_HASH_LINK = re.compile(r"[0-9a-f]{8}\.[0-9]+")  # subject hash . index, as `openssl rehash` names
_IDLE_DRAIN = 1 << 16  # an unread body up to this size is read to keep its connection
_REASON = re.compile(r"(\[SSL[^\]]*\][^()']*|Connection refused|Read timed out|timed out|"
                     r"Name or service not known|No address associated with hostname|"
                     r"Temporary failure in name resolution|Connection reset by peer|"
                     r"Connection broken[^()']*)")


class TransferError(Exception):
    """No answer or a broken one: refused, reset, timed out, cut short."""


class TLSError(TransferError):
    """The TLS handshake failed: no TLS there, or a certificate not trusted."""


class UntrustedCertificate(TLSError):
    """TLS is there, but its certificate is not one the CA certificates vouch for."""


class Unreachable(TransferError):
    """No connection was made: the host's name did not resolve, nothing
    listens at its address, or there is no route to it (a timeout is not
    this). curl's --retry, which enroot's transfers use, takes none of
    these for transient (CURLE_COULDNT_RESOLVE_HOST, CURLE_COULDNT_CONNECT;
    a refused connection only with --retry-connrefused): the request ends
    at once."""


class NoSuchHost(Unreachable):
    """The host's name does not exist (EAI_NONAME, EAI_NODATA): a mistyped
    name, which no wait mends (a resolver that could not answer, EAI_AGAIN,
    is Unreachable alone)."""


def connect_error(error):
    """The TransferError of a request that failed (an OSError of the socket,
    or requests' around one): Unreachable or NoSuchHost where it never
    connected, by the socket error at the bottom of the chain."""
    import errno
    import socket
    text = reason(error)
    cause = _socket_cause(error)
    if isinstance(cause, socket.gaierror):
        gone = (socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME))
        return NoSuchHost(text) if cause.errno in gone else Unreachable(text)
    # (the last address's error: with localhost's ::1 where a node has no
    # IPv6, a refused 127.0.0.1 ends in EADDRNOTAVAIL)
    if cause is not None and cause.errno in (errno.ECONNREFUSED, errno.ENETUNREACH,
                                             errno.EHOSTUNREACH, errno.EADDRNOTAVAIL):
        return Unreachable(text)
    return TransferError(text)


def _socket_cause(error):
    """The OSError under `error`: itself, or one urllib3 and requests wrap
    (as a cause, a context, a `reason` or an argument); None when none is."""
    pending, seen = [error], set()
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno is not None:
            return current
        pending += [current.__cause__, current.__context__, getattr(current, "reason", None)]
        pending += [arg for arg in getattr(current, "args", ()) if isinstance(arg, BaseException)]
    return None


def tls_error(error):
    """The TLSError of a failed handshake (ssl's, or requests' around it)."""
    text = reason(error)
    # (ssl names a refused certificate, or one for another host, so)
    return UntrustedCertificate(text) if "CERTIFICATE_VERIFY_FAILED" in text else TLSError(text)


def reason(error):
    """The innermost cause of an error, without the Python noise around it."""
    text = str(error) or type(error).__name__
    match = _REASON.search(text)
    return match.group(1).strip() if match else text


def proxied(environ=None):
    """Whether the environment names a proxy for HTTP or HTTPS."""
    environ = os.environ if environ is None else environ
    return any(value and key.lower() in PROXY_VARIABLES for key, value in environ.items())


def ca_bundle():
    """The file or directory of CA certificates requests verifies against,
    or None: the ssl module's defaults. SSL_CERT_FILE and SSL_CERT_DIR, which
    OpenSSL and curl (so enroot) read, count too: requests alone would not."""
    for key in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "SSL_CERT_FILE", "SSL_CERT_DIR"):
        if os.environ.get(key):
            return os.environ[key]
    try:
        import certifi
    except ImportError:
        return None
    return certifi.where()


def lazy_ca_path(bundle):
    """The system's CA directory in place of the system's bundle file: the
    same certificates (Debian's update-ca-certificates writes both, the
    directory with OpenSSL's hash links), but OpenSSL reads a hashed
    directory one issuer at a time, as a chain needs it, where it parses a
    bundle whole: about 20 ms for Debian's, on every resolve. Any other
    bundle is kept as it is, and so is the file when its directory has no
    hash links (the ssl module's defaults then)."""
    if bundle is None or os.path.realpath(bundle) != SYSTEM_CA_BUNDLE:
        return bundle
    directory = os.path.dirname(SYSTEM_CA_BUNDLE)
    try:
        hashed = any(_HASH_LINK.fullmatch(name) for name in os.listdir(directory))
    except OSError:
        return bundle
    return directory if hashed else bundle


@contextlib.contextmanager
def deadline(response, seconds):
    """Read `response` within `seconds` from now (None: no limit): then its
    socket is shut down, so that a body dripping a byte at a time, which a
    stall timeout never ends, fails as a TransferError saying so."""
    if not seconds:
        yield
        return
    import threading
    timer = threading.Timer(seconds, response.cut_off)
    timer.daemon = True
    timer.start()
    late = TransferError(f"not whole within {seconds} s (ENROOT_TRANSFER_TIMEOUT)")
    try:
        yield
    except TransferError:
        if response.was_cut_off:
            raise late from None
        raise
    finally:
        _end(timer)
    if response.was_cut_off:  # a body that ends with its connection ended at the cut
        raise late


def _end(timer):
    """`timer` cancelled and its thread ended. A daemon thread that wakes
    while the interpreter finalizes (the exit right after ^C cancelled it)
    is made to exit by CPython 3.11 mid-teardown, and that can crash the
    process with SIGSEGV instead of its exit status 130."""
    timer.cancel()
    if timer.ident is not None:
        timer.join()


def _shut_down(sock):
    """End the reads another thread makes on `sock` (None: gone already) at
    once; a TLS socket's too: shut down below its TLS layer, which that
    read goes on using."""
    if sock is None:
        return
    import socket
    with contextlib.suppress(OSError):
        socket.socket.shutdown(sock, socket.SHUT_RDWR)


class _HeadTimer:
    """Shuts the socket `sock()` gives down unless the answer's head came
    whole within twice the stall timeout `stall` (None: no limit), so that
    a server that sends nothing at all is a stall, said as such; `late()`
    is the error then. armed=False: it counts from arm() on, not from the
    start: a request's body (a push's layer) takes as long as its size
    does to send, each write bounded by the stall timeout alone."""

    def __init__(self, stall, sock, armed=True):
        self.seconds, self.fired, self._timer = stall and 2 * stall, False, None
        self.armed = armed
        if stall:
            import threading
            self._timer = threading.Timer(self.seconds, self._fire, (sock,))
            self._timer.daemon = True

    def _fire(self, sock):
        self.fired = True
        _shut_down(sock())

    def late(self):
        return TransferError(f"the answer's headers not whole within {self.seconds:g} s "
                             "(twice ENROOT_TRANSFER_TIMEOUT)")

    def arm(self):
        if self._timer is not None and not self._timer.is_alive():
            self._timer.start()

    def __enter__(self):
        if self.armed:
            self.arm()
        return self

    def __exit__(self, *exc):
        if self._timer is not None:
            _end(self._timer)


_PROXY_SCHEMES = ("http", "https", "socks4", "socks4a", "socks5", "socks5h")


def check_proxies(environ=None):
    """Each proxy variable that is set names a proxy, [SCHEME://]HOST[:PORT]
    as curl and requests take it, or one line naming the variable (from
    enroot.conf or the environment): requests' own words would name the
    registry it was asked for instead."""
    environ = os.environ if environ is None else environ
    for key, value in environ.items():
        if not value or key.lower() not in PROXY_VARIABLES:
            continue
        try:
            parts = urlsplit(value if "://" in value else f"http://{value}")
            good = (parts.scheme in _PROXY_SCHEMES and bool(parts.hostname)
                    and (parts.port is None or parts.port > 0)
                    and not any(c.isspace() for c in value))
        except ValueError:  # a port that is no number, or out of range
            good = False
        if not good:
            shown = value if len(value) <= 60 else value[:60] + "..."
            raise BerthError(f"{key}: {shown!r} is not a proxy URL ([SCHEME://]HOST[:PORT], "
                             "e.g. http://proxy.example:3128)")


def open_transport(timeout, insecure, connections, direct):
    """A transport: Direct where asked for and no proxy is set, else Pooled.
    timeout: (connect, stall) seconds, None for no limit."""
    check_proxies()
    if direct and not proxied():
        return Direct(timeout, insecure)
    return Pooled(timeout, insecure, connections)


_DEFAULT_PORTS = {"https": 443, "http": 80}


def origin(url):
    """(scheme, host, port) of a URL: where its connection goes, and where
    credentials may go; ValueError for a port that is no number."""
    parts = urlsplit(url)
    return parts.scheme, parts.hostname, parts.port or _DEFAULT_PORTS.get(parts.scheme, 80)


# -- http.client -------------------------------------------------------------------

class Direct:
    """GETs (and HEADs, and a push's requests) over http.client, one
    connection per origin, kept for the next request once an answer was
    read whole. Not requests: importing it and urllib3 costs a resolve
    more than its requests do. urllib3 reads its answers with http.client
    too, so every registry answer, a resolve's or a pull's, goes through
    the standard library's one parser."""

    def __init__(self, timeout, insecure):
        self.connect_timeout, self.stall_timeout = timeout
        self.insecure = insecure
        self.context = None  # the TLS context, made at the first HTTPS request
        self.idle = {}  # origin -> a connection whose last answer was read whole

    def get(self, url, headers, method="GET", body=None):
        """`body`: bytes, or a file read from where it is, sent as it is
        (its Content-Length among `headers`); None: none."""
        parts = urlsplit(url)
        try:
            where = origin(url)
        except ValueError:
            raise TransferError(f"bad URL {url}") from None
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        if parts.scheme not in ("http", "https") or not parts.hostname or \
                _UNSAFE.search(target):
            raise TransferError(f"bad URL {url}")
        _check_headers(headers)
        kept = self.idle.pop(where, None)
        if kept is not None:
            try:
                return self._ask(kept, where, (target, headers, method, body), kept=True)
            except _Closed:
                # the server closed the kept connection meanwhile: a new one
                if hasattr(body, "seek"):
                    body.seek(0)
        return self._ask(self._connect(where), where, (target, headers, method, body))

    def _connect(self, where):
        import http.client
        import ssl
        scheme, host, port = where
        if scheme == "https":
            connection = http.client.HTTPSConnection(
                host, port, timeout=self.connect_timeout, context=self._tls())
        else:
            connection = http.client.HTTPConnection(host, port, timeout=self.connect_timeout)
        try:  # the handshake under the connect timeout, as the connection itself
            connection.connect()
        except ssl.SSLError as e:
            connection.close()
            raise tls_error(e) from None
        except OSError as e:
            connection.close()
            raise connect_error(e) from None
        connection.sock.settimeout(self.stall_timeout)
        return connection

    def _tls(self):
        if self.context is None:
            import ssl
            if self.insecure:
                # nothing is verified: no certificates to load (20 ms for a bundle)
                context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
            else:
                where = lazy_ca_path(ca_bundle())
                try:
                    context = ssl.create_default_context(
                        capath=where if where and os.path.isdir(where) else None,
                        cafile=where if where and not os.path.isdir(where) else None)
                except (OSError, ssl.SSLError) as e:
                    raise BerthError(f"CA certificates {where}: {reason(e)}") from None
            self.context = context
        return self.context

    def _ask(self, connection, where, request, kept=False):
        import http.client
        target, headers, method, body = request
        with _HeadTimer(self.stall_timeout, lambda: connection.sock,
                        armed=body is None) as head:
            try:
                connection.request(method, target, body=body, headers=headers)
                head.arm()
                response = connection.getresponse()
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError) as e:
                connection.close()
                if head.fired:
                    raise head.late() from None
                if kept:
                    raise _Closed() from None
                raise TransferError(reason(e)) from None
            except (OSError, http.client.HTTPException) as e:
                connection.close()
                raise (head.late() if head.fired else TransferError(_broken(e))) from None
        if head.fired:  # (whole, as the timer went off: its socket is shut down)
            connection.close()
            raise head.late()
        return _DirectResponse(self, where, connection, response)


# what may not be in a request target or a header: a second line, or a space
_UNSAFE = re.compile(r"[\x00-\x20\x7f]")
_UNSAFE_VALUE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


def _check_headers(headers):
    """Refuse, unsent, a header that would smuggle a line of its own (a
    token or a redirect comes from the registry); http.client would let a
    folded line through."""
    for key, value in headers.items():
        if _UNSAFE.search(key) or _UNSAFE_VALUE.search(str(value)):
            raise TransferError(f"header {key!r} holds a line break or a control character")


def _broken(error):
    """The reason http.client gives for a broken answer, in one line."""
    import http.client
    if isinstance(error, http.client.IncompleteRead):
        return "Connection broken: IncompleteRead"
    if isinstance(error, http.client.UnknownProtocol):
        return f"bad status line: unknown protocol {error.args[0][:80]!r}"
    if isinstance(error, http.client.BadStatusLine):
        return f"bad status line {error.line[:80]!r}"
    return reason(error)


def _pieces(body, size):
    """The body of http.client's response `body` as it arrives: each piece
    is what has come by then, up to `size` bytes. Each read takes what one
    read of the socket gives (read1; a TLS record at most), and the next is
    made for the same piece only where more is there already: so a piece
    never waits for bytes past one read, a broken read loses nothing, and
    what came before it is handed out before its TransferError (a read of
    `size` bytes, as urllib3 makes, loses all it had taken when the
    connection breaks). Ends quietly where the connection does, even short
    of a Content-Length: registry.py tells that by `received`."""
    import http.client
    while True:
        piece, broken = bytearray(), None
        try:
            while len(piece) < size:
                data = body.read1(size - len(piece))
                if not data:
                    break
                piece += data
                if body.length == 0:  # whole: closed, as read() closes it and read1
                    body.close()      # does not (Python 3.12 and older, cpython#113199)
                if body.isclosed() or not _waiting(body):
                    break
        except (OSError, ValueError, http.client.HTTPException) as e:
            broken = TransferError(_broken(e))
        if piece:
            yield piece
        if broken is not None:
            raise broken
        if not piece:
            return


def _waiting(body):
    """Whether bytes of `body` wait on its socket, unread (a poll that does not wait)."""
    import select
    poller = select.poll()
    poller.register(body.fileno(), select.POLLIN)
    return bool(poller.poll(0))


class _Closed(Exception):
    """A kept connection the server had closed: ask again on a new one."""


class _DirectResponse:
    def __init__(self, transport, where, connection, response):
        self._transport, self._where, self._connection = transport, where, connection
        self._response = response
        self.status_code = response.status
        self.headers = response.headers  # get() ignores case and gives the first value
        self.received = 0  # body bytes read so far
        self.was_cut_off = False

    def cut_off(self):
        """(deadline()'s, from its timer's thread)"""
        self.was_cut_off = True
        _shut_down(getattr(self._connection, "sock", None))

    def chunks(self, size):
        try:
            for piece in _pieces(self._response, size):
                self.received += len(piece)
                yield piece
        except TransferError:
            self._drop()
            raise

    def close(self):
        if self._connection is None:
            return
        if self.was_cut_off:
            self._drop()
            return
        left = self._response.length  # of the Content-Length; None: chunked or until close
        if not self._response.isclosed() and left is not None and left <= _IDLE_DRAIN:
            try:
                for _ in self.chunks(_IDLE_DRAIN):
                    pass  # a small body unread: read, so that the connection serves on
            except TransferError:
                return
        # (read whole: closed with nothing left; http.client drops the socket
        # of an answer that ends with its connection)
        if self._response.isclosed() and not self._response.length and \
                self._connection.sock is not None:
            self._transport.idle[self._where] = self._connection
            self._connection = None
        else:
            self._drop()

    def _drop(self):
        if self._connection is not None:
            self._response.close()
            self._connection.close()
            self._connection = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# -- requests -----------------------------------------------------------------------

def _no_netrc(request):
    """An auth that adds nothing: requests then leaves ~/.netrc unread."""
    return request


def _unredirected_session(requests):
    class Session(requests.Session):
        def get_redirect_target(self, response):
            return None  # registry.py follows redirects; requests leaves Location unread
    return Session()


# thread ident -> the urllib3 connection its request took from a pool: what
# a _HeadTimer of Pooled shuts down
_TAKEN = {}


def _recording(manager):
    """Make `manager`'s pools (urllib3's PoolManager, or a proxy's) record in
    _TAKEN the connection each request takes: requests hands out no socket
    before the answer's head is read."""
    if getattr(manager, "berth_records", False):
        return manager
    manager.pool_classes_by_scheme = {scheme: _recording_pool(cls) for scheme, cls
                                      in manager.pool_classes_by_scheme.items()}
    manager.berth_records = True
    return manager


_RECORDING_POOLS = {}


def _recording_pool(pool_class):
    if pool_class not in _RECORDING_POOLS:
        import threading

        class Recording(pool_class):
            def _get_conn(self, timeout=None):
                connection = super()._get_conn(timeout)
                _TAKEN[threading.get_ident()] = connection
                return connection
        _RECORDING_POOLS[pool_class] = Recording
    return _RECORDING_POOLS[pool_class]


def _recording_adapter(requests, connections):
    class Adapter(requests.adapters.HTTPAdapter):
        def init_poolmanager(self, *args, **kwargs):
            super().init_poolmanager(*args, **kwargs)
            _recording(self.poolmanager)

        def proxy_manager_for(self, proxy, **kwargs):
            return _recording(super().proxy_manager_for(proxy, **kwargs))
    return Adapter(pool_maxsize=max(1, connections))


def _taken_socket(thread):
    return getattr(_TAKEN.get(thread), "sock", None)


class Pooled:
    """GETs (and HEADs) over a requests session, its pool as large as the
    parallel downloads."""

    def __init__(self, timeout, insecure, connections):
        import requests
        import urllib3
        self._requests = requests
        self.timeout = timeout
        self.session = _unredirected_session(requests)
        # Bodies are read off http.client's response (_pieces), not undone
        # by urllib3: none may come encoded.
        self.session.headers["Accept-Encoding"] = "identity"
        adapter = _recording_adapter(requests, connections)
        self.session.mount("https://", adapter)
        self.session.mount("http://", adapter)
        # Given per request: requests lets REQUESTS_CA_BUNDLE override a
        # session's verify, never an argument's.
        self.verify = False if insecure else (ca_bundle() or True)
        if insecure:
            urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)

    def get(self, url, headers, method="GET", body=None):
        """`body`: as Direct's; the head's timer is off for a request
        with one (requests sends it and reads the answer in one call),
        its socket's stall timeout still on."""
        import threading
        requests = self._requests
        thread = threading.get_ident()
        with _HeadTimer(self.timeout[1] if body is None else None,
                        lambda: _taken_socket(thread)) as head:
            try:
                response = self.session.request(method, url, headers=headers, data=body,
                                                timeout=self.timeout, stream=True,
                                                verify=self.verify, auth=_no_netrc)
            except requests.exceptions.SSLError as e:
                raise (head.late() if head.fired else tls_error(e)) from None
            except (requests.RequestException, ValueError) as e:
                raise (head.late() if head.fired else connect_error(e)) from None
            finally:
                _TAKEN.pop(thread, None)
        if head.fired:  # (whole, as the timer went off: its socket is shut down)
            response.close()
            raise head.late()
        return _PooledResponse(response)


class _PooledResponse:
    def __init__(self, response):
        self._response = response
        # http.client's response under urllib3's (as requests itself reads
        # its headers there for cookies): the body is read off it
        self._body = response.raw._original_response
        self.status_code = response.status_code
        self.headers = response.headers
        self.received = 0  # body bytes read so far
        self.was_cut_off = False

    def cut_off(self):
        """(deadline()'s, from its timer's thread)"""
        self.was_cut_off = True
        connection = getattr(self._response.raw, "connection", None)  # urllib3's, 1.26 and 2
        _shut_down(getattr(connection, "sock", None))

    def chunks(self, size):
        for piece in _pieces(self._body, size):
            self.received += len(piece)
            yield piece

    def close(self):
        if self._body.isclosed():  # read whole: its connection serves the next request
            self._response.raw.release_conn()
        self._response.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
