"""A client for the registry HTTP API v2: manifests and blobs, pull only.

Authentication follows the registry's WWW-Authenticate challenge: a Bearer
token from the realm it names (anonymous, or with the user's credentials) or
Basic with the credentials. Credentials come from a netrc file, as in enroot.
"""

import getpass
import hashlib
import json
import netrc
import os
import re
import stat
import sys
import time
from urllib.parse import urlsplit

import requests

from berth.errors import BerthError

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
    try:
        return netrc.netrc(path), path
    except netrc.NetrcParseError as e:
        raise BerthError(f"{path}:{e.lineno}: {e.msg}") from None


class Registry:
    """One registry and repository, with its authentication and timeouts."""

    def __init__(self, ref, cfg, credentials=None, credentials_path=""):
        self.ref = ref
        self.credentials = credentials
        self.credentials_path = credentials_path
        self.allow_http = cfg.flag("ENROOT_ALLOW_HTTP")
        connect = cfg.number("ENROOT_CONNECT_TIMEOUT") or None
        self.transfer_timeout = cfg.number("ENROOT_TRANSFER_TIMEOUT") or None
        self.timeout = (connect, self.transfer_timeout)
        self.retries = cfg.number("ENROOT_TRANSFER_RETRIES")
        self.session = requests.Session()
        self.session.headers["User-Agent"] = "berth"
        # Connection pool as large as the parallel downloads, so none waits.
        adapter = requests.adapters.HTTPAdapter(
            pool_maxsize=max(1, cfg.number("ENROOT_MAX_CONNECTIONS")))
        self.session.mount("https://", adapter)
        self.session.mount("http://", adapter)
        self.base = ""
        self.authenticated = False
        self.login_source = ""  # what _login found, for error messages
        self.typed_password = None

    # -- connection and authentication ------------------------------------

    def connect(self):
        """Find the scheme the registry speaks and authenticate against it."""
        host = self.ref.registry
        try:
            response = self._get(f"https://{host}/v2/")
            self.base = f"https://{host}"
        except requests.exceptions.SSLError as e:
            if not self.allow_http:
                raise BerthError(
                    f"registry {host} does not speak HTTPS ({_reason(e)}); if it is a plain "
                    "HTTP registry, set ENROOT_ALLOW_HTTP=yes in enroot.conf") from None
            response = self._get(f"http://{host}/v2/")
            self.base = f"http://{host}"
        if response.status_code == 401:
            self._authenticate(response.headers.get("WWW-Authenticate", ""))
            response = self._get(f"{self.base}/v2/")
            if response.status_code == 401:
                raise self._denied()
        if response.status_code != 200:
            raise BerthError(f"registry {host}: /v2/ answered {response.status_code}; "
                             "is it a registry (API v2)?")

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
            self.session.auth = login
            self.authenticated = True
            return
        if scheme.lower() != "bearer" or "realm" not in params:
            raise BerthError(f"registry {host}: unsupported authentication '{challenge}'")
        realm = params["realm"]
        if realm.startswith("http://") and not self.allow_http:
            raise BerthError(f"registry {host}: token service {realm} is plain HTTP; "
                             "set ENROOT_ALLOW_HTTP=yes to allow it")
        query = {"scope": f"repository:{self.ref.repository}:pull"}
        if "service" in params:
            query["service"] = params["service"]
        realm_host = urlsplit(realm).hostname or ""
        login = self._login(host, host.split(":")[0], realm_host)
        try:
            response = self.session.get(realm, params=query, auth=login, timeout=self.timeout)
        except requests.RequestException as e:
            raise BerthError(f"token service {realm}: {_reason(e)}") from None
        if response.status_code in (401, 403):
            raise self._denied()
        if response.status_code != 200:
            raise BerthError(f"token service {realm} answered {response.status_code}")
        try:
            body = response.json()
            token = body.get("token") or body["access_token"]
        except (ValueError, KeyError, AttributeError):
            raise BerthError(f"token service {realm} sent no token") from None
        self.session.headers["Authorization"] = f"Bearer {token}"
        self.authenticated = True

    def _denied(self):
        source = self.login_source
        if not source:
            who = f"{self.ref.user}@{self.ref.registry}" if self.ref.user else self.ref.registry
            found = "" if self.credentials else " (not found)"
            source = f"no credentials for {who} in {self.credentials_path}{found}"
        return BerthError(f"registry {self.ref.registry} refused access to "
                          f"{self.ref.repository} (401 Unauthorized) with {source}"
                          f"{self.ref.registry_hint()}")

    def _get(self, url, **kwargs):
        """GET; a 401 once authenticated means our token expired (long pulls
        outlive them): get a fresh one and ask again."""
        response = self._get_with_retries(url, **kwargs)
        if response.status_code == 401 and self.authenticated:
            challenge = response.headers.get("WWW-Authenticate", "")
            response.close()
            self._authenticate(challenge)
            response = self._get_with_retries(url, **kwargs)
        return response

    def _get_with_retries(self, url, **kwargs):
        """GET with retries on connection failures and server errors."""
        for attempt in range(self.retries + 1):
            last = attempt == self.retries
            try:
                response = self.session.get(url, timeout=self.timeout, **kwargs)
            except requests.exceptions.SSLError as e:
                if not self.base:
                    raise  # connect() is finding out whether the registry speaks TLS
                raise BerthError(f"registry {self.ref.registry}: {_reason(e)}") from None
            except (requests.ConnectionError, requests.Timeout) as e:
                if last:
                    raise BerthError(f"registry {self.ref.registry}: {_reason(e)}") from None
                continue
            if response.status_code < 500 or last:
                return response
            response.close()
        raise AssertionError("unreachable")

    # -- manifests and blobs ------------------------------------------------

    def manifest(self, reference, accept):
        """(parsed manifest, media type, digest) for a tag or digest."""
        url = f"{self.base}/v2/{self.ref.repository}/manifests/{reference}"
        response = self._get(url, headers={"Accept": ", ".join(accept)})
        if response.status_code == 404:
            raise BerthError(f"image not found: {self.ref.registry}/{self.ref.repository}"
                             f"{'@' if reference.startswith('sha256:') else ':'}{reference}"
                             f"{self.ref.registry_hint()}")
        if response.status_code == 401:
            raise self._denied()
        if response.status_code != 200:
            raise BerthError(f"registry {self.ref.registry}: manifest {reference} answered "
                             f"{response.status_code}")
        body = response.content
        digest = sha256_digest(body)
        expected = reference if reference.startswith("sha256:") else \
            response.headers.get("Docker-Content-Digest", digest)
        if digest != expected:
            raise BerthError(f"manifest digest mismatch for {self.ref}: expected {expected}, "
                             f"got {digest}")
        try:
            parsed = json.loads(body)
        except ValueError:
            raise BerthError(f"manifest {expected} of {self.ref} is not JSON") from None
        # mediaType is optional in OCI manifests; the header then says it.
        media_type = (parsed.get("mediaType")
                      or response.headers.get("Content-Type", "").split(";")[0])
        return parsed, media_type, digest

    def blob(self, digest):
        """The whole blob in memory, verified (for small blobs: image configs)."""
        response = self._blob_response(digest)
        body = response.content
        if sha256_digest(body) != digest:
            raise BerthError(f"blob digest mismatch: expected {digest}, got "
                             f"{sha256_digest(body)}")
        return body

    def download(self, digest, out, on_bytes):
        """Stream a blob into the open file `out`, retrying a broken transfer
        from the start; returns the sha256 digest of what was written."""
        for attempt in range(self.retries + 1):
            out.seek(0)
            out.truncate()
            hasher = hashlib.sha256()
            written = 0
            try:
                response = self._blob_response(digest, stream=True)
                started = time.monotonic()
                for chunk in response.iter_content(_CHUNK):
                    out.write(chunk)
                    hasher.update(chunk)
                    written += len(chunk)
                    on_bytes(len(chunk))
                    if self.transfer_timeout and \
                            time.monotonic() - started > self.transfer_timeout:
                        raise requests.Timeout(f"transfer took over {self.transfer_timeout} s")
                return "sha256:" + hasher.hexdigest()
            except (requests.ConnectionError, requests.Timeout,
                    requests.exceptions.ChunkedEncodingError) as e:
                on_bytes(-written)
                if attempt == self.retries:
                    raise BerthError(f"download of {digest} from {self.ref.registry} "
                                     f"failed: {_reason(e)}") from None
        raise AssertionError("unreachable")

    def _blob_response(self, digest, stream=False):
        url = f"{self.base}/v2/{self.ref.repository}/blobs/{digest}"
        response = self._get(url, stream=stream)
        if response.status_code != 200:
            raise BerthError(f"registry {self.ref.registry}: blob {digest} of "
                             f"{self.ref.repository} answered {response.status_code}")
        return response


def _reason(error):
    """The innermost cause of a requests error, without the Python noise."""
    text = str(error.args[0] if error.args else error)
    match = re.search(r"(\[SSL[^\]]*\][^()']*|Connection refused|Read timed out|"
                      r"timed out|Name or service not known|Connection reset by peer|"
                      r"Connection broken[^()']*|transfer took over [0-9]+ s)", text)
    return match.group(1).strip() if match else text
