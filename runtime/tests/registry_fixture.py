"""Test helpers for `berth import`: a real registry, images pushed through
its v2 API, and a proxy in front of it that counts requests, asks for
credentials and breaks transfers on demand.

A plain module, imported by the import tests (not a conftest.py).
"""

import base64
import contextlib
import gzip
import hashlib
import http.server
import io
import json
import os
import pwd
import socket
import stat
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path

import requests

RUNTIME = Path(__file__).resolve().parents[1]
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port, what, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"{what} did not listen on 127.0.0.1:{port}")


def sha256(data):
    return "sha256:" + hashlib.sha256(data).hexdigest()


class Registry:
    """Debian's docker-registry on 127.0.0.1, storing in `directory`."""

    def __init__(self, directory):
        self.port = free_port()
        self.host = f"127.0.0.1:{self.port}"
        self.url = f"http://{self.host}"
        directory = Path(directory)
        config = directory / "registry.yml"
        config.write_text(
            "version: 0.1\n"
            "log: {level: error, accesslog: {disabled: true}}\n"
            f"storage: {{filesystem: {{rootdirectory: {directory / 'storage'}}}}}\n"
            f"http: {{addr: '{self.host}'}}\n")
        self.log = open(directory / "registry.log", "wb")
        self.process = subprocess.Popen(["docker-registry", "serve", str(config)],
                                        stdout=self.log, stderr=self.log)
        wait_for_port(self.port, "docker-registry")

    def stop(self):
        self.process.terminate()
        self.process.wait(10)
        self.log.close()

    def push_blob(self, repo, data):
        digest = sha256(data)
        start = requests.post(f"{self.url}/v2/{repo}/blobs/uploads/", timeout=10)
        start.raise_for_status()
        location = requests.compat.urljoin(self.url, start.headers["Location"])
        separator = "&" if "?" in location else "?"
        done = requests.put(f"{location}{separator}digest={digest}", data=data, timeout=10,
                            headers={"Content-Type": "application/octet-stream"})
        done.raise_for_status()
        return digest

    def push_manifest(self, repo, ref, manifest, media_type):
        body = json.dumps(manifest).encode()
        response = requests.put(f"{self.url}/v2/{repo}/manifests/{ref}", data=body,
                                headers={"Content-Type": media_type}, timeout=10)
        response.raise_for_status()
        return sha256(body)

    def push_image(self, repo, tag, layers, config=None, media_type=OCI_MANIFEST,
                   layer_type="application/vnd.oci.image.layer.v1.tar+gzip"):
        """Push layers (bytes, already compressed as wanted) and an image
        config; returns the manifest digest."""
        config = config or {"architecture": "amd64", "os": "linux", "config": {}}
        config_blob = json.dumps(config).encode()
        config_type = ("application/vnd.oci.image.config.v1+json" if media_type == OCI_MANIFEST
                       else "application/vnd.docker.container.image.v1+json")
        manifest = {
            "schemaVersion": 2,
            "mediaType": media_type,
            "config": {"mediaType": config_type, "size": len(config_blob),
                       "digest": self.push_blob(repo, config_blob)},
            "layers": [{"mediaType": layer_type, "size": len(layer),
                        "digest": self.push_blob(repo, layer)} for layer in layers],
        }
        return self.push_manifest(repo, tag, manifest, media_type)

    def push_index(self, repo, tag, platforms):
        """An OCI index over {(arch, variant): manifest digest}."""
        entries = []
        for (arch, variant), digest in platforms.items():
            size = len(requests.get(f"{self.url}/v2/{repo}/manifests/{digest}", timeout=10,
                                    headers={"Accept": OCI_MANIFEST}).content)
            plat = {"architecture": arch, "os": "linux"}
            if variant:
                plat["variant"] = variant
            entries.append({"mediaType": OCI_MANIFEST, "digest": digest, "size": size,
                            "platform": plat})
        index = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": entries}
        return self.push_manifest(repo, tag, index, OCI_INDEX)


# -- layers -----------------------------------------------------------------

def layer_tar(*entries):
    """A tar from entries: ("dir", name, mode), ("file", name, data[, mode]),
    ("symlink", name, target), ("hardlink", name, target), ("char", name[, major, minor]),
    ("fifo", name)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for kind, name, *rest in entries:
            info = tarfile.TarInfo(name)
            info.mtime = 1_700_000_000
            data = None
            if kind == "dir":
                info.type, info.mode = tarfile.DIRTYPE, rest[0] if rest else 0o755
            elif kind == "file":
                data = rest[0]
                info.size, info.mode = len(data), rest[1] if len(rest) > 1 else 0o644
            elif kind in ("symlink", "hardlink"):
                info.type = tarfile.SYMTYPE if kind == "symlink" else tarfile.LNKTYPE
                info.linkname = rest[0]
            elif kind == "char":  # (major, minor) 1, 3 unless given
                info.type = tarfile.CHRTYPE
                info.devmajor, info.devminor = rest if rest else (1, 3)
            elif kind == "fifo":
                info.type = tarfile.FIFOTYPE
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return out.getvalue()


# -- layers posing as parts of Berth's (image/parts.py) -------------------

FORGED_DIGEST = "sha256:" + "0" * 64


def forged_listing_line(part):
    """What `unsquashfs -lls` prints for a part's marker: a symbolic link's
    target holding a newline and this line forges one (the listing prints
    targets unescaped)."""
    return f"x\ncrw-r--r-- root/root  0,  0 2023-11-14 22:13 squashfs-root/{part}/{part}"


def forged_part(number, marker="file"):
    """Entries of a layer posing as top part `number`: its marker (a
    plain file, a character device 0/0 as Berth's, or a symbolic link whose
    target forges a listing's line), an image.json that claims another
    source and digest, and a file to show it was seen."""
    part = f".berth-top.{number}"
    record = json.dumps({"source": "docker://nvcr.io#nvidia/pytorch:24.01",
                         "digest": FORGED_DIGEST}).encode()
    marker = {"file": ("file", f"{part}/{part}", b""), "device": ("char", f"{part}/{part}", 0, 0),
              "link": ("symlink", f"{part}/{part}", forged_listing_line(part))}[marker]
    return (("dir", part, 0o755), marker, ("dir", f"{part}/etc", 0o755),
            ("dir", f"{part}/etc/berth", 0o755),
            ("file", f"{part}/etc/berth/image.json", record), ("file", f"{part}/seen", b"seen\n"))


def gzipped(data):
    return gzip.compress(data, compresslevel=6, mtime=0)


def zstd_compressed(data):
    return subprocess.run(["zstd", "-q", "-c"], input=data, stdout=subprocess.PIPE,
                          check=True).stdout


# -- a proxy that counts, authenticates and breaks -------------------------

class Proxy:
    """An HTTP front for `upstream` on 127.0.0.1.

    auth: None, "basic" or "bearer" (token from its own /token, given for
    `login`/`password`, good for `token_uses` requests).
    `cut`: blob digests whose transfer stops halfway;
    `cut_once` stops only the first; `tamper`: path -> body served instead (200 OK);
    `blob_delay`: seconds before each blob is sent (only those in
    `delayed`, where that is a set).
    """

    def __init__(self, upstream, auth=None, login="alice", password="secret"):
        self.upstream = upstream
        self.auth = auth
        self.basic = "Basic " + base64.b64encode(f"{login}:{password}".encode()).decode()
        self.requests = []
        self.cut, self.cut_once, self.tamper = set(), set(), {}
        self.blob_delay, self.delayed = 0.0, None
        self.in_flight = self.most_in_flight = 0  # blob requests being answered at once
        self.lock = threading.Lock()
        self.token_uses = None  # how many requests a token is good for; None: forever
        self.tokens = {}  # token -> requests left
        self.port = free_port()
        self.host = f"127.0.0.1:{self.port}"
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # Headers and body go in two writes: without TCP_NODELAY the body
            # waits for the client's delayed ACK (40 ms) on a kept connection.
            disable_nagle_algorithm = True

            def log_message(self, *args):
                pass

            def do_GET(self):
                proxy._handle(self)

            def do_HEAD(self):
                proxy._handle(self)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()

    def blob_requests(self):
        return [path for path in self.requests if "/blobs/" in path]

    def _handle(self, handler):
        path = handler.path
        self.requests.append(path if handler.command == "GET" else f"{handler.command} {path}")
        if path.startswith("/token"):
            if handler.headers.get("Authorization") == self.basic:
                token = f"token-{len(self.tokens)}"
                self.tokens[token] = self.token_uses
                return self._reply(handler, 200, json.dumps({"token": token}).encode(),
                                   {"Content-Type": "application/json"})
            return self._reply(handler, 401, b"{}", {})
        if not self._authorized(handler.headers.get("Authorization", "")):
            challenge = ('Basic realm="test"' if self.auth == "basic" else
                         f'Bearer realm="http://{self.host}/token",service="test"')
            return self._reply(handler, 401, b"{}", {"WWW-Authenticate": challenge})
        headers = {k: v for k, v in handler.headers.items() if k.lower() == "accept"}
        upstream = requests.request(handler.command, self.upstream + path, headers=headers,
                                    timeout=10)
        status, body = upstream.status_code, upstream.content
        if path in self.tamper:
            status, body = 200, self.tamper[path]
        keep = {k: v for k, v in upstream.headers.items()
                if k.lower() in ("content-type", "docker-content-digest")}
        digest = path.rsplit("/", 1)[-1]
        if "/blobs/" in path:
            with self.lock:
                self.in_flight += 1
                self.most_in_flight = max(self.most_in_flight, self.in_flight)
            if self.delayed is None or digest in self.delayed:
                time.sleep(self.blob_delay)
            with self.lock:
                self.in_flight -= 1
            if digest in self.cut or digest in self.cut_once:
                self.cut_once.discard(digest)
                return self._reply(handler, status, body, keep, broken=True)
        return self._reply(handler, status, body, keep)

    def _authorized(self, header):
        if self.auth == "basic":
            return header == self.basic
        if self.auth == "bearer":
            token = header.removeprefix("Bearer ")
            if token not in self.tokens or self.tokens[token] == 0:
                return False
            if self.tokens[token] is not None:
                self.tokens[token] -= 1
        return True

    @staticmethod
    def _reply(handler, status, body, headers, broken=False):
        handler.send_response(status)
        for key, value in headers.items():
            handler.send_header(key, value)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        if handler.command == "HEAD":
            return
        handler.wfile.write(body[:len(body) // 2] if broken else body)
        handler.wfile.flush()
        if broken:
            handler.close_connection = True
            handler.connection.shutdown(socket.SHUT_RDWR)


# -- running berth ----------------------------------------------------------

def berth_env(tmp_path, **overrides):
    """An environment for `berth` confined to tmp_path."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("ENROOT_")}
    env.update({
        "PYTHONPATH": str(RUNTIME),
        "ENROOT_SYSCONF_PATH": str(tmp_path / "sysconf"),
        "ENROOT_CONFIG_PATH": str(tmp_path / "config"),
        "ENROOT_CACHE_PATH": str(tmp_path / "cache"),
        "ENROOT_DATA_PATH": str(tmp_path / "data"),
        "ENROOT_TEMP_PATH": str(tmp_path / "temp"),
        "ENROOT_ALLOW_HTTP": "yes",
        "ENROOT_SQUASH_OPTIONS": "-comp gzip",
        "ENROOT_MAX_PROCESSORS": "1",
    })
    env.update(overrides)
    (tmp_path / "temp").mkdir(exist_ok=True)
    return env


@contextlib.contextmanager
def throwaway_users(*names):
    """System accounts without a home or a shell for the test's length:
    {name: pwd entry}, removed again even when the test fails."""
    made = []
    try:
        for name in names:
            subprocess.run(["useradd", "--no-create-home", "--home-dir", "/nonexistent",
                            "--shell", "/usr/sbin/nologin", name], check=True,
                           capture_output=True)
            made.append(name)
        yield {name: pwd.getpwnam(name) for name in made}
    finally:
        for name in made:
            subprocess.run(["userdel", name], check=False, capture_output=True)


def berth(args, env, cwd, user=None, timeout=120):
    """Run the CLI; returns the CompletedProcess (text)."""
    command = [sys.executable, "-m", "berth.cli", *args]
    if user:
        command = ["runuser", "-u", user, "--", *command]
    return subprocess.run(command, env=env, cwd=cwd, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=timeout, check=False)


def imports_at_once(uri, env, cwd, *outputs):
    """`berth import -o OUTPUT uri` for every output at the same time: {output: result}."""
    results = {}

    def run(output):
        results[output] = berth(["import", "-o", output, uri], env, cwd)

    threads = [threading.Thread(target=run, args=(output,)) for output in outputs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def unsquash(image, directory):
    """The tree of a squashfs image in `directory`; of an image cache's entry
    kept as parts (berth/image/parts.py), its merged tree."""
    from berth.image import parts
    top = parts.top_of_file(str(image))
    if top:
        os.mkdir(directory)
        parts.unpack(str(image), str(directory), top)
        return Path(directory)
    subprocess.run(["unsquashfs", "-q", "-n", "-d", str(directory), str(image)], check=True,
                   stdout=subprocess.DEVNULL)
    return Path(directory)


def listing(image):
    """The paths of a squashfs image as `unsquashfs -l -d ''` prints them (the
    images of one source must agree; bytes do not: mksquashfs records the
    time it ran); of an entry kept as parts, those of its merged tree."""
    from berth.image import parts
    if not parts.top_of_file(str(image)):
        return subprocess.run(["unsquashfs", "-l", "-d", "", str(image)], capture_output=True,
                              text=True, check=True).stdout
    lines = [""]

    def walk(directory, prefix):
        for name in sorted(os.listdir(directory), key=os.fsencode):
            lines.append(f"{prefix}/{name}")
            path = os.path.join(directory, name)
            if os.path.isdir(path) and not os.path.islink(path):
                walk(path, f"{prefix}/{name}")

    with tempfile.TemporaryDirectory() as scratch:
        walk(unsquash(image, Path(scratch) / "root"), "")
    return "\n".join(lines) + "\n"


# -- a registry that lies, floods and stalls ----------------------------------

class HostileRegistry:
    """A registry API v2 in this process, on 127.0.0.1, serving what a test
    sets up, true or not: `image()` stores an image with the sizes its
    manifest declares (`declared`: digest -> size, to lie), and `behave`
    (digest or manifest tag -> function(handler, body)) answers a request
    instead: flood(), stall(), drip(), redirect() below. `sent` counts the
    body bytes written per path; `release` ends every stalled answer (set
    by stop). `basic`: the Authorization header every request but the
    challenged /v2/ must carry (Basic auth); `authorizations` records what
    each request carried; `hang_up`: close each connection after one
    answer without saying so (a keep-alive the server drops)."""

    def __init__(self, basic=None):
        self.blobs, self.manifests, self.behave = {}, {}, {}
        self.sent = {}
        self.requests = []
        self.basic, self.authorizations = basic, []
        self.hang_up = False
        self.connections = 0
        self.release = threading.Event()
        self.port = free_port()
        self.host = f"127.0.0.1:{self.port}"
        hostile = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # Headers and body go in two writes: without TCP_NODELAY the body
            # waits for the client's delayed ACK (40 ms) on a kept connection.
            disable_nagle_algorithm = True

            def log_message(self, *args):
                pass

            def setup(self):
                super().setup()
                hostile.connections += 1

            def do_GET(self):
                try:
                    hostile._handle(self)
                except (BrokenPipeError, ConnectionResetError):
                    self.close_connection = True

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self):
        self.release.set()
        self.server.shutdown()
        self.server.server_close()

    def blob(self, data):
        digest = sha256(data)
        self.blobs[digest] = data
        return digest

    def image(self, repo, tag, layers, config=None, declared=None, raw_config=None):
        """Store an image (layers: bytes; config: a dict, or raw_config bytes);
        returns {"config": digest, "layers": [digests], "manifest": digest}."""
        declared = declared or {}
        config_blob = raw_config if raw_config is not None else json.dumps(
            config if config is not None else {"architecture": "amd64", "os": "linux",
                                               "config": {}}).encode()
        config_digest = self.blob(config_blob)
        layer_digests = [self.blob(layer) for layer in layers]
        manifest = {
            "schemaVersion": 2, "mediaType": OCI_MANIFEST,
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                       "digest": config_digest,
                       "size": declared.get(config_digest, len(config_blob))},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                        "digest": digest, "size": declared.get(digest, len(layer))}
                       for digest, layer in zip(layer_digests, layers, strict=True)],
        }
        body = json.dumps(manifest).encode()
        self.manifests[(repo, tag)] = body
        return {"config": config_digest, "layers": layer_digests, "manifest": sha256(body)}

    def _handle(self, handler):
        path = handler.path
        self.requests.append(path if handler.command == "GET" else f"{handler.command} {path}")
        self.authorizations.append(handler.headers.get("Authorization"))
        if self.hang_up:
            handler.close_connection = True
        parts = path.split("/")
        if self.basic and handler.headers.get("Authorization") != self.basic:
            return self.send(handler, 401, b"{}", {"WWW-Authenticate": 'Basic realm="x"'})
        if path == "/v2/":
            return self.send(handler, 200, b"{}")
        if len(parts) >= 5 and parts[1] == "v2" and parts[-2] in ("manifests", "blobs"):
            repo, kind, name = "/".join(parts[2:-2]), parts[-2], parts[-1]
            body = (self.manifests.get((repo, name)) if kind == "manifests"
                    else self.blobs.get(name))
            if body is None:
                return self.send(handler, 404, b"{}")
            if name in self.behave:
                return self.behave[name](self, handler, body)
            headers = {"Content-Type": OCI_MANIFEST} if kind == "manifests" else {}
            return self.send(handler, 200, body, headers)
        return self.send(handler, 404, b"{}")

    def send(self, handler, status, body, headers=None, length=True):
        handler.send_response(status)
        for key, value in (headers or {}).items():
            handler.send_header(key, value)
        if length is True:
            handler.send_header("Content-Length", str(len(body)))
        elif length is not None:
            handler.send_header("Content-Length", str(length))
        else:
            handler.close_connection = True  # the body ends when the connection does
        handler.end_headers()
        self.write(handler, body)

    def write(self, handler, data):
        handler.wfile.write(data)
        handler.wfile.flush()
        self.sent[handler.path] = self.sent.get(handler.path, 0) + len(data)


def flood(total, announce=True):
    """Answer with the true body, then junk up to `total` bytes, announcing
    the whole length in Content-Length or not (a body ended by closing)."""
    def answer(hostile, handler, body):
        hostile.send(handler, 200, b"", {"Content-Type": OCI_MANIFEST},
                     length=total if announce else None)
        hostile.write(handler, body)
        left = total - len(body)
        chunk = b"\0" * (1 << 16)
        while left > 0 and not hostile.release.is_set():
            hostile.write(handler, chunk[:left])
            left -= len(chunk)
    return answer


def redirect(location, status=307):
    """Answer with a redirect to `location` (FORMAT: {path} is the request's)."""
    def answer(hostile, handler, body):
        hostile.send(handler, status, b"", {"Location": location.format(path=handler.path)})
    return answer


def stall(first=0):
    """Answer with headers and the first `first` bytes, then nothing until released;
    first=None: not even the headers."""
    def answer(hostile, handler, body):
        if first is not None:
            hostile.send(handler, 200, b"", length=len(body))
            hostile.write(handler, body[:first])
        hostile.release.wait()
        handler.close_connection = True
    return answer


def drip(pieces, pause):
    """The true body in `pieces` parts, `pause` seconds apart: slow, never stalled."""
    def answer(hostile, handler, body):
        hostile.send(handler, 200, b"", length=len(body))
        step = -(-len(body) // pieces)
        for start in range(0, len(body), step):
            time.sleep(pause)
            hostile.write(handler, body[start:start + step])
    return answer


class SilentServer:
    """Accepts connections (the kernel does, from its listen queue) and never answers."""

    def __init__(self):
        self.socket = socket.socket()
        self.socket.bind(("127.0.0.1", 0))
        self.socket.listen(64)
        self.port = self.socket.getsockname()[1]
        self.host = f"127.0.0.1:{self.port}"

    def stop(self):
        self.socket.close()


def tree(root):
    """Every entry below `root`: type, mode, size, content digest or link
    target, and which entries share an inode."""
    seen, result = {}, {}
    for top, dirs, files in os.walk(root):
        dirs.sort()  # (the first name of a hard-linked inode: the same on both sides)
        for name in sorted(dirs + files):
            path = os.path.join(top, name)
            info = os.lstat(path)
            key = os.path.relpath(path, root)
            if stat.S_ISLNK(info.st_mode):
                what = os.readlink(path)
            elif stat.S_ISREG(info.st_mode):
                what = hashlib.sha256(Path(path).read_bytes()).hexdigest()
                what += f" links:{seen.setdefault(info.st_ino, key)}"
            else:
                what = ""
            result[key] = (stat.S_IFMT(info.st_mode), stat.S_IMODE(info.st_mode), what)
    return result
