"""The shared image store (runtime/README.md, "Shared image store"): one
image cache on a filesystem every node mounts, written only by the store's
account, read by every user.

`berth store serve` is the store's side: systemd starts one per connection
to the store's socket (Accept=yes, the connection as stdin and stdout), as
BERTH_IMAGE_STORE_OWNER. It reads one request line, a registry reference,
imports it into BERTH_IMAGE_STORE as `import --cache-only` would, with the
admin's enroot.conf and registries.conf and without any credentials, and
answers one line:

    ok PATH            the store's entry (images/<key>.sqsh), or this
                       node's copy of it with BERTH_IMAGE_STORE_LOCAL
                       (local.py)
    private REASON     the registry wants credentials (401, 403, or a 404
                       that may hide a private repository)
    error REASON       anything else (a refused request, a blocked registry,
                       a broken image)

The user's side is in `berth import --cache-only` (image/importer.py): ask(),
reused() and entry(), which accepts a path only if it is an entry of the
store (or this node's copy of one) owned by its account and writable by
nobody else, in directories nobody else may write (checked()). Nothing on
the user's side writes in the store: no lock, no mark of use but a read,
no removal.

`berth store list` shows the entries, reading only; `berth store prune`
(prune.py) removes the least recently used, as the store's account.
"""

import contextlib
import errno
import json
import os
import pwd
import select
import signal
import stat
import sys
import time
import types

from berth import safedir
from berth.errors import AccessDenied, BerthError, ImageNotFound, Terminated, raise_terminated
from berth.image import archive, reference, registries, squash
from berth.image.cache import (IMAGE_NAME, CacheDirs, ImageCache, human_size, is_link,
                               open_followed, scan)

REQUEST_MAX = 4096  # bytes of a request line, its newline not counted
REQUEST_TIMEOUT = 30  # seconds a connection has to send its request
_ANSWER_MAX = 8192  # "ok " and a path; more is not an answer of ours
_DIRS = (("images",), ("blobs",), ("blobs", "sha256"), ("locks",), ("uris",))


def path_of(cfg):
    """BERTH_IMAGE_STORE, or None when no store is configured."""
    store = cfg["BERTH_IMAGE_STORE"].strip()
    if not store:
        return None
    if not os.path.isabs(store):
        raise BerthError(f"BERTH_IMAGE_STORE={store}: not an absolute path")
    return store


def configured_path(cfg):
    """BERTH_IMAGE_STORE, for a verb that has nothing to do without one."""
    store = path_of(cfg)
    if store is None:
        raise BerthError("no image store here: BERTH_IMAGE_STORE is not set")
    return store


def owned_store(cfg, command):
    """BERTH_IMAGE_STORE, for `command` (which writes the store) run as the
    store's account: never as root, nor as any other uid."""
    if os.geteuid() == 0:
        raise BerthError(f"{command} refuses to run as root; run it as the store's "
                         f"account ({cfg['BERTH_IMAGE_STORE_OWNER']})")
    store = configured_path(cfg)
    uid = owner_uid(cfg)
    if os.geteuid() != uid:
        raise BerthError(f"{command} runs as uid {os.geteuid()}, not as "
                         f"BERTH_IMAGE_STORE_OWNER {cfg['BERTH_IMAGE_STORE_OWNER']} (uid {uid})")
    return store


def local_path(cfg):
    """BERTH_IMAGE_STORE_LOCAL, the node-local directory of copies of the
    store's entries, or None when not set."""
    local = cfg["BERTH_IMAGE_STORE_LOCAL"].strip()
    if not local:
        return None
    store = path_of(cfg)
    if store is None:
        raise BerthError(f"BERTH_IMAGE_STORE_LOCAL={local}: set without BERTH_IMAGE_STORE, "
                         "so there is nothing to copy")
    if not os.path.isabs(local):
        raise BerthError(f"BERTH_IMAGE_STORE_LOCAL={local}: not an absolute path")
    local = os.path.normpath(local)
    for inside in (store, os.path.realpath(store)):
        if os.path.commonpath([local, os.path.normpath(inside)]) == os.path.normpath(inside):
            raise BerthError(f"BERTH_IMAGE_STORE_LOCAL={local}: inside BERTH_IMAGE_STORE="
                             f"{store}; it must be a node-local directory")
    return local


def owner_uid(cfg):
    """The uid of BERTH_IMAGE_STORE_OWNER (a user name, or a uid)."""
    owner = cfg["BERTH_IMAGE_STORE_OWNER"].strip()
    if owner.isdigit():
        return int(owner)
    try:
        return pwd.getpwnam(owner).pw_uid
    except KeyError:
        raise BerthError(f"BERTH_IMAGE_STORE_OWNER={owner}: no such user here") from None


# -- the user's side (berth import --cache-only) -------------------------------

def serves(args, cfg, ref):
    """Whether this import goes through the store: --cache-only of a
    registry reference without USER@ (the store pulls anonymously) for this
    node's platform, with a store configured."""
    if not (args.cache_only and isinstance(ref, reference.Reference) and not ref.user
            and not args.arch):
        return False
    if path_of(cfg) is None:
        local_path(cfg)  # set without a store: refused, naming it
        return False
    return True


def reused(cfg, uri, options, quiet):
    """For --reuse: the store's entry last imported for `uri`, checked, or
    None. With BERTH_IMAGE_STORE_LOCAL, this node's copy of it, or None
    (the socket makes the copy). Reads only: the store is not the caller's
    to mark or repair."""
    store, local = path_of(cfg), local_path(cfg)
    images = ImageCache(store)
    key = images.remembered(uri, options, None)  # (the store serves this node's platform)
    if key is None:
        return None
    path = images.path(key) if local is None else os.path.join(local, f"{key}.sqsh")
    if not os.path.lexists(path):
        return None
    try:
        found = entry(cfg, path)
    except BerthError as e:
        if not quiet:
            print(f"berth: not reusing the image store's entry of {uri}: {e}", file=sys.stderr)
        return None
    if local is not None and not _mark(images.path(key)):
        return None  # pruned from the store: the socket imports it again
    return found


def _mark(image):
    """Read the first block of the store's entry `image`, as a step mounting
    it would: its atime tells prune it is in use (under relatime, at most once
    a day). False when the store no longer has it."""
    try:
        fd = os.open(image, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    except OSError:
        return True  # (a mark is worth no failed step)
    try:
        with contextlib.suppress(OSError):
            os.read(fd, 4096)
    finally:
        os.close(fd)
    return True


def ask(cfg, uri, quiet):
    """The store's entry of `uri`, asked of the store's socket; None when
    the caller must import into its own cache (said on stderr unless
    quiet). Waits as long as the import takes: SIGTERM ends the wait."""
    import socket  # (only here: not on a cached step's way)
    path = cfg["BERTH_IMAGE_STORE_SOCKET"]
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC) as sock:
        try:
            sock.connect(path)
        except OSError as e:
            return _own_cache(quiet, f"no image store answers at {path} ({e.strerror or e})")
        with contextlib.suppress(OSError):  # (an early answer is read all the same)
            sock.sendall(uri.encode() + b"\n")
            sock.shutdown(socket.SHUT_WR)
        answer = _read_answer(sock, path)
    if answer is None:
        return _own_cache(quiet, f"the image store at {path} closed without answering")
    kind, _, rest = answer.partition(" ")
    if kind == "ok":
        return entry(cfg, rest)
    if kind == "private":
        return _own_cache(quiet, f"the image store cannot pull {uri} without credentials")
    if kind == "error":
        raise BerthError(f"the image store: {rest}")
    raise BerthError(f"the image store at {path} answered {answer[:100]!r}, "
                     "not ok, private or error; refusing it")


def _own_cache(quiet, why):
    if not quiet:
        print(f"berth: {why}; importing into your own cache", file=sys.stderr)
    return None


def _read_answer(sock, path):
    data = b""
    while b"\n" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
        if len(data) > _ANSWER_MAX:
            raise BerthError(f"the image store at {path} answered more than "
                             f"{_ANSWER_MAX} bytes; refusing it")
    if not data:
        return None
    line, _, rest = data.partition(b"\n")
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is None or rest or not text.isprintable():
        raise BerthError(f"the image store at {path} answered {data[:100]!r}, not one line; "
                         "refusing it")
    return text


def entry(cfg, path):
    """`path` if it is a whole entry of the store (images/<key>.sqsh) or a
    node-local copy of one (BERTH_IMAGE_STORE_LOCAL/<key>.sqsh), as its
    resolved path: see checked()."""
    store = os.path.realpath(path_of(cfg))
    local = local_path(cfg)
    real = os.path.realpath(path)

    def refuse(why):
        return BerthError(f"the image store's answer {path}: {why}; refusing it")

    directory, name = os.path.split(real)
    if not os.path.isabs(path) or not IMAGE_NAME.fullmatch(name) \
            or directory not in (os.path.join(store, "images"), local):
        also = f" nor of BERTH_IMAGE_STORE_LOCAL={local}" if local else ""
        raise refuse(f"not an image of BERTH_IMAGE_STORE={path_of(cfg)}{also}")
    return checked(cfg, directory, name, refuse, strict_from=store)


_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


def checked(cfg, directory, name, refuse, strict_from=None):
    """directory/name if it is a regular file of the store's account that
    nobody else may write and a whole squashfs, in `directory` reached from
    / without following a symbolic link, through directories owned by root
    or the account that nobody else may write (see walk); else refuse(why)
    is raised."""
    uid = owner_uid(cfg)
    dir_fd = walk(directory, uid, refuse, strict_from=strict_from)
    try:
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                         dir_fd=dir_fd)
        except FileNotFoundError:
            raise refuse("no such file") from None
        except OSError as e:
            raise refuse("a symbolic link" if e.errno == errno.ELOOP else e.strerror) from None
    finally:
        os.close(dir_fd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise refuse("not a regular file")
        if st.st_uid != uid:
            raise refuse(f"owned by uid {st.st_uid}, not by BERTH_IMAGE_STORE_OWNER "
                         f"{cfg['BERTH_IMAGE_STORE_OWNER']} (uid {uid})")
        if st.st_mode & 0o022:
            raise refuse(f"writable by others (mode {stat.S_IMODE(st.st_mode):04o})")
        if not squash.looks_whole_fd(fd):
            raise refuse("not a whole squashfs")
    finally:
        os.close(fd)
    return os.path.join(directory, name)


def walk(directory, uid, refuse, make=False, strict_from=None):
    """The absolute `directory` open, reached from / without following a
    symbolic link: each directory on the way owned by root or `uid` and
    writable by nobody else (sticky ones such as /tmp aside: what is in
    them is checked next), `directory` itself and those from `strict_from`
    on not even sticky. With `make`, a missing last directory is made
    0755. Else refuse(why)."""
    strict_from = os.path.join(strict_from, "") if strict_from else None
    fd, current = os.open("/", _DIR), "/"
    try:
        names = [name for name in directory.split("/") if name]
        for i, name in enumerate(names):
            last = i == len(names) - 1
            current = os.path.join(current, name)
            strict = last or bool(strict_from) and os.path.join(current, "").startswith(strict_from)
            if last and make:
                try:
                    os.mkdir(name, 0o755, dir_fd=fd)
                except FileExistsError:
                    pass
                except OSError as e:
                    raise refuse(f"cannot create {current}: {e.strerror}") from None
            try:
                new = os.open(name, _DIR | os.O_NOFOLLOW, dir_fd=fd)
            except OSError as e:
                if e.errno in (errno.ELOOP, errno.ENOTDIR) and is_link(name, fd):
                    raise refuse(f"{current} is a symbolic link (give the resolved "
                                 "path)") from None
                raise refuse(f"{current}: {e.strerror}") from None
            os.close(fd)
            fd = new
            st = os.fstat(fd)
            writable = st.st_mode & 0o022 and (strict or not st.st_mode & stat.S_ISVTX)
            if st.st_uid not in (uid, 0) or writable:
                mode = f"owner uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o}"
                raise refuse(f"{current} is not the store account's alone ({mode})" if strict
                             else f"{current} lets others replace what is in it ({mode})")
        fd, opened = None, fd
        return opened
    finally:
        if fd is not None:
            os.close(fd)


# -- berth store serve | list | prune ----------------------------------------------

def cmd_store(args, cfg):
    if args.store_verb == "serve":
        return _serve(cfg)
    if args.store_verb == "prune":
        from berth.store import prune
        return prune.cmd_prune(args, cfg)
    return _list(cfg, args.json)


def _serve(cfg):
    """One request, one answer line on stdout; the reason of an error on
    stderr (the journal) too."""
    signal.signal(signal.SIGTERM, raise_terminated)
    os.umask(0o022)
    try:
        kind, text = "ok", _serve_request(cfg)
    except (AccessDenied, ImageNotFound) as e:  # may be there for those who log in
        kind, text = "private", str(e)
    except BerthError as e:
        kind, text = "error", str(e)
    except Terminated:
        kind, text = "error", "the image store's import was interrupted by SIGTERM"
    except OSError as e:
        where = f"{e.filename}: " if e.filename else ""
        kind, text = "error", f"{where}{e.strerror or e}"
    text = " ".join(text.split())  # one line, whatever the reason held
    _drain(sys.stdin.fileno())
    with contextlib.suppress(OSError):
        sys.stdout.write(f"{kind} {text}\n")
        sys.stdout.flush()
    if kind == "error":
        raise BerthError(f"store serve: {text}")
    _sweep(cfg)
    return 0


def _sweep(cfg):
    """Once the client has its answer: this node's copies of entries the
    store no longer holds go (local.sweep)."""
    from berth.store import local
    try:
        local.sweep(cfg, configured_path(cfg))
    except (BerthError, OSError) as e:
        print(f"berth: store serve: the node-local copies: {e}", file=sys.stderr)


def _drain(fd, most=1 << 20):
    """Read what the client sent past its request (bounded): a socket closed
    with unread data resets the connection, and the answer with it."""
    with contextlib.suppress(OSError, ValueError):
        while most > 0 and select.select([fd], [], [], 0.2)[0]:
            chunk = os.read(fd, min(most, 1 << 16))
            if not chunk:
                return
            most -= len(chunk)


def _serve_request(cfg):
    store = owned_store(cfg, "berth store serve")
    uri = _request(sys.stdin.fileno())
    ref = _registry_reference(uri)
    _make_store(store)
    local_path(cfg)  # a wrong BERTH_IMAGE_STORE_LOCAL: before any import
    image = _import(cfg, store, uri, ref)
    from berth.store import local
    return local.copied(cfg, image)


def _request(fd):
    """The request line: at most REQUEST_MAX bytes of UTF-8 text, ended by a
    newline or the end of the stream, and nothing after it."""
    data, deadline, ended = b"", time.monotonic() + REQUEST_TIMEOUT, False
    while b"\n" not in data and len(data) <= REQUEST_MAX:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise BerthError(f"no request line within {REQUEST_TIMEOUT} s")
        chunk = os.read(fd, REQUEST_MAX + 2 - len(data))
        if not chunk:
            ended = True
            break
        data += chunk
    line, newline, rest = data.partition(b"\n")
    if len(line) > REQUEST_MAX:
        raise BerthError(f"the request is longer than {REQUEST_MAX} bytes")
    if newline and not ended and not rest and select.select([fd], [], [], 0)[0]:
        rest = os.read(fd, 1)
    if rest:
        raise BerthError("the request is more than one line")
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError:
        raise BerthError("the request is not UTF-8 text") from None
    if not text:
        raise BerthError("empty request: send one registry reference")
    if not text.isprintable():
        raise BerthError("the request holds control characters")
    return text


def _registry_reference(uri):
    if archive.is_archive(uri):
        raise BerthError(f"{uri[:200]}: the image store imports registry images only, "
                         "no archives")
    ref = reference.parse(uri)
    if ref.user:
        raise BerthError(f"{uri}: the image store pulls without credentials; a reference "
                         "with USER@ is imported into the user's own cache")
    return ref


def _make_store(store):
    """The store's directories, 0755 and the account's: every user reads
    them, nobody else writes them. (The import itself would make them 0700.)"""
    for parts in ((), *_DIRS):
        path = os.path.join(store, *parts)
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o755)
        safedir.check(path, "BERTH_IMAGE_STORE" if not parts else "the image store's directory")
        if stat.S_IMODE(os.stat(path).st_mode) & 0o055 != 0o055:
            os.chmod(path, 0o755)


def _import(cfg, store, uri, ref):
    """`berth import --cache-only --quiet URI` into the store, anonymously."""
    from berth.image import pull  # (the HTTP stack: only where a request is made)
    store_cfg = _store_config(cfg, store)
    plan = registries.load(cfg["ENROOT_SYSCONF_PATH"]).endpoints(ref)  # blocked: refused
    # no credentials: only what the registry gives anyone goes into the store
    answer = pull.first_answer(plan, ref, store_cfg, None, None, None, True)
    args = types.SimpleNamespace(uri=uri, arch=None, quiet=True)
    with pull.build_cached(args, store_cfg, ImageCache(store), squash.options(cfg), ref,
                           answer.source, answer.manifest, answer.digest,
                           answer.manifest_digest) as image:
        return image


def _store_config(cfg, store):
    from berth.config import Config
    # ENROOT_CONFIG_PATH is never read here (no .credentials): it names
    # nothing, so that a later change that reads it finds no file.
    return Config({**dict(cfg.items()), "ENROOT_CACHE_PATH": store,
                   "ENROOT_CONFIG_PATH": "/nonexistent/berth-store"})


def _list(cfg, as_json):
    """One line per entry, least recently used first: size, last use, the
    URI it was imported from (image.json's source; "(older)" when the
    store's latest for that URI is another entry), path. As JSON (for
    programs: the berth_store_image module): a list, in the same order, of
    {"path", "size" (bytes), "used" (seconds since the epoch), "source",
    "latest"}."""
    store = configured_path(cfg)
    uris = os.path.join(store, "uris")
    latest = set()
    with contextlib.suppress(FileNotFoundError):
        for name in os.listdir(uris):
            with contextlib.suppress(OSError):
                latest.add(os.path.basename(os.readlink(os.path.join(uris, name))))
    # The scan prune takes its order from: one meaning of "last use".
    with CacheDirs(store, open_followed(store), strict=False) as dirs:
        found = [entry for entry in scan(dirs) if entry.kind == "images"]
    if as_json:
        print(json.dumps([{"path": entry.path, "size": entry.size, "used": int(entry.used),
                           "source": source(entry.path), "latest": entry.name in latest}
                          for entry in found], indent=1))
        return 0
    for entry in found:
        older = "" if entry.name in latest else " (older)"
        print(entry_line(entry, f"{source(entry.path)}{older}"))
    return 0


def entry_line(entry, what):
    """A line of `store list` and `store prune`: size, last use, `what`, path."""
    used = time.strftime("%Y-%m-%d %H:%M", time.localtime(entry.used))
    return f"{human_size(entry.size):>8}  {used}  {what}  {entry.path}"


def source(image):
    """The URI an entry was imported from, as its image.json records it.
    Reading it is no use of the entry: the atime goes back where it was,
    when this process may set it (the store's account, root)."""
    try:
        before = os.stat(image, follow_symlinks=False)
    except OSError:
        before = None
    uri = squash.recorded(image, "source")
    if before is not None:
        with contextlib.suppress(OSError):
            after = os.stat(image, follow_symlinks=False)
            if after.st_atime_ns != before.st_atime_ns and after.st_mtime_ns == before.st_mtime_ns:
                os.utime(image, ns=(before.st_atime_ns, before.st_mtime_ns), follow_symlinks=False)
    return uri if uri and uri.isprintable() else "?"
