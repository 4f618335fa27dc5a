"""The host side of RUN's mounts (runflags.RunMount): what each adds to the
step's key, and the mounts the step's container gets, none of them part of
the step's result.

- cache: a directory of the user's under the image cache,
  build-cache/<sha256 of the id>/data, kept between builds; its contents
  are not in the key. With from=, a new one begins as a copy of that
  stage's (or image's) source directory, whose key is in the step's.
  `shared` holds a shared lock on it for the step, `locked` an exclusive
  one (a second build waits), `private` an exclusive one or, while
  another step holds it, a fresh directory of the build's own. After the
  step, the caches together are kept under BERTH_BUILD_CACHE_MAX_SIZE by
  removing the least recently used (one in use is left alone); `berth
  cache` does not count them.
- bind: from the context (less what the ignore file leaves out, its
  checksum in the key), copied into the build's directory first, so that
  `rw` changes are discarded; from a stage, that stage's tree, bound read
  only (copied for `rw`).
- tmpfs: a new tmpfs.

A mount point the step's root lacked is made for it and removed after."""

import contextlib
import fcntl
import hashlib
import os
import shutil
import sys
import tempfile
import typing

from berth import rootpath, safedir, units
from berth.build import context, tree
from berth.container import mounts
from berth.errors import BerthError
from berth.image.cachelayout import CacheLayout
from berth.image.cachescan import disk_usage

_ORIGIN = "berth build RUN --mount"


class Bound(typing.NamedTuple):
    spec: object         # the runflags.RunMount
    key: list            # what the step's key takes of it
    sources: list = []   # a bind of the context: its context.Source values
    stage: int = None    # a bind of a stage, a cache from one: its index
    where: str = ""      # FILE:LINE of its RUN


def gather(builder, flags, *, where):
    """The Bound of each of the RunFlags `flags`' mounts."""
    bounds = []
    for spec in flags.mounts:
        if spec.kind == "cache" and spec.origin is None:
            bounds.append(Bound(spec, ["cache", spec.target, spec.cache_id, spec.sharing,
                                       spec.mode, spec.writable]))
        elif spec.kind == "cache":
            stage = builder.stage_named(spec.origin)
            bounds.append(Bound(spec, ["cache", spec.target, spec.cache_id, spec.sharing,
                                       spec.mode, spec.writable, builder.ends[stage].key,
                                       spec.source], stage=stage, where=where))
        elif spec.kind == "tmpfs":
            bounds.append(Bound(spec, ["tmpfs", spec.target, spec.size]))
        elif spec.origin is None:
            sources = context.gather([spec.source], context=builder.context, where=where,
                                     ignore=builder.ignore)
            bounds.append(Bound(spec, ["bind", spec.target, context.checksum(sources),
                                       spec.writable], sources=sources))
        else:
            stage = builder.stage_named(spec.origin)
            bounds.append(Bound(spec, ["bind", spec.target, builder.ends[stage].key,
                                       spec.source, spec.writable], stage=stage, where=where))
    return bounds


def _bind(source, target, writable):
    return mounts.Mount(source=source, target=target, fstype="none", origin=_ORIGIN,
                        options=("bind", "x-create=auto", *(() if writable else ("ro",))))


def _copied(builder, bound, stack):
    """A bind's source, copied into the build's directory for the step: its
    host path."""
    top = tempfile.mkdtemp(prefix="mount-", dir=builder.work)
    stack.callback(tree.remove, top)
    if bound.stage is None:
        context.copy(bound.sources, root=top, dest="/")
        source = bound.sources[0]
        return top if source.is_dir else os.path.join(top, os.path.basename(
            source.entries[0].path))
    found = _in_stage(builder, bound)
    if os.path.isdir(found) and not os.path.islink(found):
        shutil.copytree(found, f"{top}/tree", symlinks=True)
    else:
        shutil.copy2(found, f"{top}/tree", follow_symlinks=False)
    return f"{top}/tree"


def _in_stage(builder, bound):
    root = builder.tree_at(bound.stage, builder.ends[bound.stage])
    found = rootpath.resolve(root, bound.spec.source, follow_last=True)
    if not os.path.lexists(found):
        raise BerthError(f"{bound.where}: RUN --mount from={bound.spec.origin}: "
                         f"{bound.spec.source}: not found in that stage")
    return found


def _cache_root(cfg):
    safedir.ensure(cfg["ENROOT_CACHE_PATH"], "ENROOT_CACHE_PATH")
    path = CacheLayout(cfg["ENROOT_CACHE_PATH"]).dir("build-cache")
    os.makedirs(path, mode=0o700, exist_ok=True)
    return path


def _seed(builder, bound, data):
    """A new cache's first contents: from=STAGE's source directory, copied."""
    found = _in_stage(builder, bound)
    if not os.path.isdir(found):
        raise BerthError(f"{bound.where}: RUN --mount from={bound.spec.origin}: "
                         f"{bound.spec.source}: not a directory in that stage (a cache "
                         "mount's from= names one)")
    shutil.copytree(found, data, symlinks=True, dirs_exist_ok=True)


def _cache(builder, bound, stack):
    """The host directory of the cache mount `bound`, locked for the step;
    a new one holds what its from= gives."""
    spec = bound.spec
    path = os.path.join(_cache_root(builder.cfg),
                        hashlib.sha256(spec.cache_id.encode(errors="surrogateescape")).hexdigest())
    os.makedirs(path, mode=0o700, exist_ok=True)
    lock = stack.enter_context(open(os.path.join(path, "lock"), "a+b"))
    if spec.sharing == "private":
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # (in use: this step gets one of its own)
            fresh = tempfile.mkdtemp(prefix="cache-", dir=builder.work)
            stack.callback(tree.remove, fresh)
            os.chmod(fresh, spec.mode | 0o700)
            if bound.stage is not None:
                _seed(builder, bound, fresh)
            return fresh
    else:
        fcntl.flock(lock, fcntl.LOCK_EX if spec.sharing == "locked" else fcntl.LOCK_SH)
    with open(os.path.join(path, "id"), "w", encoding="utf-8", errors="surrogateescape") as f:
        f.write(spec.cache_id + "\n")
    data = os.path.join(path, "data")
    if not os.path.isdir(data):
        made = f"{data}.new"  # (whole or not at all: a seed that fails leaves none)
        if os.path.lexists(made):
            tree.owner_writable(made)
            tree.remove(made)
        os.mkdir(made, 0o700)
        try:
            if bound.stage is not None:
                _seed(builder, bound, made)
        except BaseException:
            tree.owner_writable(made)
            tree.remove(made)
            raise
        os.chmod(made, spec.mode)
        os.rename(made, data)
    os.utime(path)  # (its last use, for the bound)
    return data


def _stubs(root, targets):
    """The mount points `targets` will make in `root`: for each, the first
    of its directories (or itself) that is not there yet, and the target."""
    made = []
    for target in targets:
        path = rootpath.resolve(root, target, follow_last=True)
        top = None
        while not os.path.lexists(path) and path != root:
            top, path = path, os.path.dirname(path)
        if top:
            made.append((top, rootpath.resolve(root, target, follow_last=True)))
    return made


def _remove_stubs(made):
    """What _stubs found missing, removed where the step left it empty."""
    for top, path in made:
        while True:
            try:
                if os.path.isdir(path) and not os.path.islink(path):
                    os.rmdir(path)
                elif os.path.isfile(path) and not os.path.getsize(path):
                    os.unlink(path)
            except OSError:
                return  # (the step put something there: it stays)
            if path == top:
                break
            path = os.path.dirname(path)


@contextlib.contextmanager
def mounted(builder, bounds, *, root):
    """The Mounts of `bounds` for a step in `root`, ready while inside:
    caches locked, copies made; after, the mount points made for them gone
    and the caches kept under their bound."""
    made = _stubs(root, [b.spec.target for b in bounds])
    found = []
    with contextlib.ExitStack() as stack:
        for bound in bounds:
            spec = bound.spec
            if spec.kind == "cache":
                found.append(_bind(_cache(builder, bound, stack), spec.target, spec.writable))
            elif spec.kind == "tmpfs":
                found.append(mounts.Mount(
                    source="tmpfs", target=spec.target, fstype="tmpfs", origin=_ORIGIN,
                    options=("nosuid", "nodev", "mode=755", "x-create=dir",
                             *((f"size={spec.size}",) if spec.size else ()))))
            elif spec.writable or bound.stage is None:
                found.append(_bind(_copied(builder, bound, stack), spec.target, spec.writable))
            else:
                found.append(_bind(_in_stage(builder, bound), spec.target, False))
        try:
            yield found
        finally:
            _remove_stubs(made)
    if any(b.spec.kind == "cache" for b in bounds):
        keep_bound(builder.cfg)


def _size(path):
    """The bytes on disk under the cache mount `path` (0: not a directory)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return 0
    try:
        return disk_usage(fd)
    finally:
        os.close(fd)


def keep_bound(cfg):
    """Remove the least recently used cache mounts (none in use) until they
    hold at most BERTH_BUILD_CACHE_MAX_SIZE together."""
    limit, top = cfg.size("BERTH_BUILD_CACHE_MAX_SIZE"), _cache_root(cfg)
    caches = sorted((os.lstat(os.path.join(top, n)).st_mtime, os.path.join(top, n))
                    for n in os.listdir(top))
    sizes = {path: _size(path) for _, path in caches}
    total = sum(sizes.values())
    for _, path in caches:
        if total <= limit:
            return
        with open(os.path.join(path, "lock"), "a+b") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue
            with contextlib.suppress(FileNotFoundError), \
                    open(os.path.join(path, "id"), encoding="utf-8", errors="replace") as f:
                shown = f.read().strip()
            tree.owner_writable(path)
            tree.remove(path)
        total -= sizes[path]
        print(f"berth build: removed the cache mount {shown!r} (the least recently used): "
              f"the cache mounts hold more than BERTH_BUILD_CACHE_MAX_SIZE "
              f"({units.human_size(limit)})",
              file=sys.stderr)
