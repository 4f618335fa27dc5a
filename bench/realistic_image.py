#!/usr/bin/env python3
"""A synthetic image shaped like NGC's PyTorch image, made once and cached.

    /opt/berth-dev/venv/bin/python bench/realistic_image.py CACHE_DIR
        [--size-gib 10] [--files 250000] [--layers 40] [--seed 1]

Writes an OCI layout under CACHE_DIR/<shape>/oci (gzip layers, as
registries serve them) and pushes it to a docker-registry whose storage is
CACHE_DIR/<shape>/registry, so later runs only start the registry; the
layout's blobs are then hard links to the registry's. The same arguments
make the same bytes, on any machine.

The shape, whatever the size: about 70% of the bytes in "shared
libraries" (one per 1,000 files, sizes spread over a factor of 50, each with
a symlink to it), the rest in small files (log-normal, median 4 KiB: about
four in five under 16 KiB) spread over package directories; 40 layers, of
which three hold nearly every library and so most of the bytes, a few
empty (a Dockerfile's ENV lines), the others a base system and pip
installs; later layers replace a few files, delete some (`.wh.NAME`), one
directory whole and empty another (`.wh..wh..opq`); a few hard links.
Contents come from two seeded corpora, source-like text of Zipf-distributed
words and machine-code-like bytes (Zipf-distributed tokens with runs of
zeros and stretches of noise), each file a slice at its own offset: gzip
and zstd shrink them about as they do real ones (text about 3.5x, binaries
about 2.5x), and no two files are the same. Layers are compressed with
pigz, several at a time.

As a module: `cached(cache_dir, size_gib, files, ...)` returns the image's
directory (made if missing) and `serve(directory)` a running Registry with
the image pushed as bench/pytorch:v1; `berth_env(work)` the environment
a bench runs berth in. scripts/test-image.sh makes the
layout of CLUSTER_TEST_SHAPE for the clusters' store test.
"""

import argparse
import collections
import gzip
import hashlib
import io
import itertools
import json
import math
import multiprocessing
import os
import posixpath
import random
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import requests

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "runtime"), str(REPO / "runtime" / "tests")]
from registry_fixture import OCI_MANIFEST, Registry  # noqa: E402

from berth.image.imageconfig import goarch  # noqa: E402

REPOSITORY, TAG = "bench/pytorch", "v1"
# The image of the clusters' store test (scripts/test-image.sh makes it):
# the same shape, small enough to cost a cluster's run seconds.
CLUSTER_TEST_SHAPE = {"size_gib": 0.25, "files": 8000, "layers": 40, "seed": 1}
LAYER_TYPE = "application/vnd.oci.image.layer.v1.tar+gzip"
CONFIG_TYPE = "application/vnd.oci.image.config.v1+json"
CORPUS_BYTES = 32 << 20  # per corpus: far beyond gzip's and zstd's windows
MTIME = 1_700_000_000
LIBRARY_SHARE = 0.7  # of the bytes
FILES_PER_LIBRARY = 1000
HEAVY_LAYERS = (3, 11, 24)  # CUDA, cuDNN and NCCL, PyTorch
EMPTY_LAYERS = (1, 7, 15, 30, 38)
SITE = "usr/local/lib/python3.10/dist-packages"


# -- the runtime a bench runs ---------------------------------------------------

def berth_env(work):
    """The environment a bench runs berth in: every path of its own under
    `work`, this checkout's runtime, and the settings that shape an import
    as the machine's defaults give them."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(work),
           "PYTHONPATH": str(REPO / "runtime"), "ENROOT_TEMP_PATH": str(work),
           "ENROOT_ALLOW_HTTP": "yes"}
    for key in ("SYSCONF", "CONFIG", "CACHE", "DATA", "RUNTIME"):
        env[f"ENROOT_{key}_PATH"] = str(work / key.lower())
    from berth import config  # (on the path this module put first)
    settings = config.load(env)
    for key in ("ENROOT_SQUASH_OPTIONS", "ENROOT_GZIP_PROGRAM", "ENROOT_MAX_PROCESSORS",
                "ENROOT_MAX_CONNECTIONS"):
        env[key] = settings[key]
    return env


# -- contents -------------------------------------------------------------------

def _zipf(rng, tokens):
    """count -> `count` of `tokens`, the first ones the most frequent."""
    cumulative = list(itertools.accumulate(1 / (rank + 1) for rank in range(len(tokens))))
    return lambda count: rng.choices(tokens, cum_weights=cumulative, k=count)


def corpus_bytes(size_gib):
    """Each corpus's size: CORPUS_BYTES, less for a small image (still far
    beyond the compressors' windows)."""
    return min(CORPUS_BYTES, max(1 << 20, int(size_gib * (1 << 30)) // 8))


def text_corpus(seed, size=CORPUS_BYTES):
    """Source-like text: lines of Zipf-distributed words, keywords and
    punctuation, the lines themselves Zipf-distributed (code repeats itself)."""
    rng = random.Random(f"text-{seed}")
    letters = "abcdefghijklmnopqrstuvwxyz_"
    words = ["".join(rng.choices(letters, k=rng.randint(2, 12))) for _ in range(3000)]
    words[0:0] = [" ", "(", ")", " = ", ", ", ".", "self", "def ", "return ", "import ",
                  "if ", "None", '"', "#", "[", "]"]
    word = _zipf(rng, words)
    lines = ["    " * rng.randint(0, 3) + "".join(word(rng.randint(2, 12))) + "\n"
             for _ in range(20000)]
    line = _zipf(rng, lines)
    out, made = [], 0
    while made < size:
        piece = "".join(line(1 << 12)).encode()
        out.append(piece)
        made += len(piece)
    return b"".join(out)[:size]


def binary_corpus(seed, size=CORPUS_BYTES):
    """Machine-code-like bytes: Zipf-distributed short tokens, runs of zeros
    (padding, tables) and stretches of noise (packed data)."""
    rng = random.Random(f"binary-{seed}")
    token = _zipf(rng, [rng.randbytes(rng.randint(2, 8)) for _ in range(4096)])
    out, made = [], 0
    while made < size:
        roll = rng.random()
        if roll < 0.08:
            piece = bytes(rng.randint(16, 1024))
        elif roll < 0.14:
            piece = rng.randbytes(rng.randint(256, 4096))
        else:
            piece = b"".join(token(rng.randint(512, 4096)))
        out.append(piece)
        made += len(piece)
    return b"".join(out)[:size]


class Slice:
    """`size` bytes of `corpus` from `offset`, wrapping, after a header that
    names the file (so no two files are alike); read() as a file is."""

    def __init__(self, corpus, offset, size, header):
        self.corpus, self.position, self.left = corpus, offset % len(corpus), size
        self.header = header[:size]
        self.left -= len(self.header)

    def read(self, count=-1):
        """Exactly `count` bytes while any are left (tarfile asks no less)."""
        count = len(self.header) + self.left if count < 0 else count
        out = bytearray(self.header[:count])
        self.header = self.header[count:]
        while len(out) < count and self.left:
            take = min(count - len(out), self.left, len(self.corpus) - self.position)
            out += self.corpus[self.position:self.position + take]
            self.position = (self.position + take) % len(self.corpus)
            self.left -= take
        return bytes(out)


# -- the plan: every entry of every layer ---------------------------------------

def plan(size_gib, files, layers, seed):
    """Per layer, its entries in tar order: (kind, path, size, offset, extra),
    kind one of dir, file, text, symlink, hardlink, whiteout, opaque."""
    rng = random.Random(f"plan-{seed}")
    total = int(size_gib * (1 << 30))
    library_count = max(2, files // FILES_PER_LIBRARY)
    heavy = [n for n in HEAVY_LAYERS if n < layers] or [layers - 1]
    empty = {n for n in EMPTY_LAYERS if n < layers and n not in heavy and n != 0}
    busy = [n for n in range(layers) if n not in empty]
    contents = {n: [] for n in range(layers)}

    shapes = [50 ** (rng.random() ** 2) for _ in range(library_count)]
    scale = total * LIBRARY_SHARE / sum(shapes)
    libraries = []
    for number, shape in enumerate(shapes):
        layer = rng.choice(heavy) if rng.random() < 0.95 else rng.choice(busy)
        where = rng.choice(["usr/local/cuda/lib64", "usr/lib/x86_64-linux-gnu",
                            f"{SITE}/torch/lib", "opt/hpcx/ucx/lib"])
        name = f"{where}/lib{_word(rng)}{number}.so"
        libraries.append(name)
        contents[layer].append(("file", f"{name}.{number % 13}", int(shape * scale),
                                rng.randrange(CORPUS_BYTES), None))
        contents[layer].append(("symlink", name, 0, 0, posixpath.basename(f"{name}.{number % 13}")))

    small_count = max(1, files - 2 * library_count)
    packages = [f"{SITE}/{_word(rng)}{n}" for n in range(max(3, files // 400))]
    packages += [f"usr/share/doc/{_word(rng)}{n}" for n in range(max(1, files // 2000))]
    directories, package_of = [], {}
    for package in packages:
        first = len(directories)
        directories.append(package)
        for sub in range(rng.randint(0, 8)):
            directories.append(f"{package}/{_word(rng)}{sub}")
            if rng.random() < 0.3:
                directories.append(f"{directories[-1]}/{_word(rng)}")
        package_of.update((directory, package) for directory in directories[first:])
    directory_weights = [1 / (rank + 1) ** 0.5 for rank in range(len(directories))]
    rng.shuffle(directory_weights)
    layer_weights = [8 if n == 0 else 4 if n in heavy else 0 if n in empty else 1
                     for n in range(layers)]
    sizes = [min(rng.lognormvariate(math.log(4096), 1.6), 4 << 20) for _ in range(small_count)]
    scale = total * (1 - LIBRARY_SHARE) / sum(sizes)
    places = rng.choices(directories, weights=directory_weights, k=small_count)
    owners = rng.choices(range(layers), weights=layer_weights, k=small_count)
    small = []
    for number, (size, directory, layer) in enumerate(zip(sizes, places, owners, strict=True)):
        kind = "text" if rng.random() < 0.8 else "file"
        suffix = ".py" if kind == "text" else ".so" if rng.random() < 0.5 else ".pyc"
        path = f"{directory}/{_word(rng)}{number}{suffix}"
        small.append((layer, path))
        contents[layer].append((kind, path, max(1, int(size * scale)),
                                rng.randrange(CORPUS_BYTES), None))

    # What later layers do to earlier ones: replace, delete, a few hard links.
    changes = max(1, files // 500)
    changed = rng.sample(small, min(3 * changes, len(small)))  # (none both replaced and deleted)
    for layer, path in changed[:changes]:
        later = [n for n in busy if n > layer]
        if later:
            contents[rng.choice(later)].append(("text", path, rng.randint(100, 20000),
                                                rng.randrange(CORPUS_BYTES), None))
    for layer, path in changed[changes:]:
        later = [n for n in busy if n > layer]
        if later:
            parent, base = posixpath.split(path)
            contents[rng.choice(later)].append(("whiteout", f"{parent}/.wh.{base}", 0, 0, None))
    for layer, path in rng.sample(small, min(max(1, files // 20000), len(small))):
        contents[layer].append(("hardlink", f"{path}.link", 0, 0, path))
    site_packages = [p for p in packages if p.startswith(f"{SITE}/")]
    if len(site_packages) > 2 and layers > 2:
        # the last layer deletes one small package whole and empties another
        held = collections.Counter(package_of[directory] for directory in places)
        deleted, emptied = sorted(site_packages, key=lambda p: (held[p] == 0, held[p]))[:2]
        last = busy[-1]
        contents[last] = [e for e in contents[last] if not e[1].startswith(f"{deleted}/")]
        contents[last].append(("whiteout", f"{SITE}/.wh.{posixpath.basename(deleted)}",
                               0, 0, None))
        contents[last].append(("opaque", f"{emptied}/.wh..wh..opq", 0, 0, None))
        contents[last].append(("text", f"{emptied}/__init__.py", 200,
                               rng.randrange(CORPUS_BYTES), None))

    ordered = []
    for layer in range(layers):
        entries = contents[layer]
        # the parents of everything, as tar archives of a layer hold them
        parents = set()
        for _, path, *_rest in entries:
            parent = posixpath.dirname(path)
            while parent and parent not in parents:
                parents.add(parent)
                parent = posixpath.dirname(parent)
        dirs = [("dir", path, 0, 0, None) for path in parents]
        # hard links after their targets; a replaced file's last version wins
        ordered.append(sorted(dirs + entries, key=lambda e: (e[0] == "hardlink", e[1])))
    return ordered


def final_paths(layers):
    """The paths of the tree `layers` (plan's) make, applied as overlayfs
    would: a whiteout deletes its path and all below it, an opaque marker
    what lower layers put in its directory."""
    paths = set()
    for entries in layers:
        made = set()
        for kind, path, *_rest in entries:
            parent, base = posixpath.split(path)
            if kind == "opaque":
                paths = {p for p in paths if not p.startswith(f"{parent}/") or p in made}
            elif kind == "whiteout":
                hidden = posixpath.join(parent, base.removeprefix(".wh."))
                paths = {p for p in paths if p != hidden and not p.startswith(f"{hidden}/")}
            else:
                paths.add(path)
                made.add(path)
    return paths


def _word(rng):
    return "".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=rng.randint(3, 9)))


# -- writing and pushing ----------------------------------------------------------

_CORPORA = {}


def _write_layer(job):
    """Write one layer (gzip, by pigz) into `blobs`; its digest, size and diff id."""
    entries, blobs, processors = job
    partial = blobs / f"partial-{os.getpid()}"
    with open(partial, "wb") as out:
        pigz = subprocess.Popen(["pigz", "-6", "-n", "-p", str(processors)],
                                stdin=subprocess.PIPE, stdout=out)
        diff = _Hashing(pigz.stdin)
        with tarfile.open(fileobj=diff, mode="w|", format=tarfile.GNU_FORMAT) as tar:
            for kind, path, size, offset, extra in entries:
                info = tarfile.TarInfo(path)
                info.mtime, info.uname, info.gname = MTIME, "root", "root"
                data = None
                if kind == "dir":
                    info.type, info.mode = tarfile.DIRTYPE, 0o755
                elif kind in ("file", "text"):
                    info.size, info.mode = size, 0o755 if path.endswith(".so") else 0o644
                    data = Slice(_CORPORA[kind], offset, size, f"# {path}\n".encode())
                elif kind == "symlink":
                    info.type, info.linkname = tarfile.SYMTYPE, extra
                elif kind == "hardlink":
                    info.type, info.linkname = tarfile.LNKTYPE, extra
                else:  # whiteout, opaque: empty files of their names
                    info.mode = 0o644
                tar.addfile(info, data)
        pigz.stdin.close()
        if pigz.wait() != 0:
            raise SystemExit("pigz failed")
    digest = _sha256_file(partial)
    os.rename(partial, blobs / digest)
    return f"sha256:{digest}", os.path.getsize(blobs / digest), f"sha256:{diff.digest()}"


class _Hashing:
    """A write-only stream that hashes what passes through (the diff id)."""

    def __init__(self, out):
        self.out, self.hash = out, hashlib.sha256()

    def write(self, data):
        self.hash.update(data)
        self.out.write(data)
        return len(data)

    def digest(self):
        return self.hash.hexdigest()


def _sha256_file(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def shape_name(size_gib, files, layers, seed):
    return f"pytorch-{size_gib:g}g-{files}f-{layers}l-s{seed}"


def cached(cache_dir, size_gib=10, files=250_000, layers=40, seed=1, quiet=False):
    """The image's directory under `cache_dir`: its OCI layout (`oci`), made
    now if missing."""
    top = Path(cache_dir) / shape_name(size_gib, files, layers, seed)
    oci = top / "oci"
    if (oci / "index.json").exists():
        return top
    shutil.rmtree(top, ignore_errors=True)  # a run stopped half way
    blobs = oci / "blobs" / "sha256"
    blobs.mkdir(parents=True)
    started = time.monotonic()
    _say(quiet, f"planning {size_gib:g} GiB, {files} files, {layers} layers...")
    entries = plan(size_gib, files, layers, seed)
    size = corpus_bytes(size_gib)
    _CORPORA["text"], _CORPORA["file"] = text_corpus(seed, size), binary_corpus(seed, size)
    processors = os.cpu_count() or 1
    # the largest layers first, so the last one to finish is a small one
    order = sorted(range(layers), key=lambda n: -sum(e[2] for e in entries[n]))
    done = {}
    with multiprocessing.get_context("fork").Pool(processors) as pool:
        jobs = [(entries[n], blobs, processors) for n in order]
        for n, result in zip(order, pool.imap(_write_layer, jobs), strict=True):
            done[n] = result
            _say(quiet, f"layer {len(done)}/{layers} written ({result[1] >> 20} MiB gzip, "
                        f"{time.monotonic() - started:.0f} s)")
    layer_rows = [done[n] for n in range(layers)]
    config = json.dumps({
        "architecture": goarch(), "os": "linux",
        "config": {"Env": ["PATH=/usr/local/bin:/usr/bin:/bin"], "Cmd": ["/bin/sh"]},
        "rootfs": {"type": "layers", "diff_ids": [diff for _, _, diff in layer_rows]},
    }, sort_keys=True).encode()
    config_digest = hashlib.sha256(config).hexdigest()
    (blobs / config_digest).write_bytes(config)
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": OCI_MANIFEST,
        "config": {"mediaType": CONFIG_TYPE, "digest": f"sha256:{config_digest}",
                   "size": len(config)},
        "layers": [{"mediaType": LAYER_TYPE, "digest": digest, "size": size}
                   for digest, size, _ in layer_rows],
    }, sort_keys=True).encode()
    manifest_digest = hashlib.sha256(manifest).hexdigest()
    (blobs / manifest_digest).write_bytes(manifest)
    (oci / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    (oci / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [{
        "mediaType": OCI_MANIFEST, "digest": f"sha256:{manifest_digest}",
        "size": len(manifest), "annotations": {"org.opencontainers.image.ref.name": TAG}}]}))
    _say(quiet, f"made {oci} in {time.monotonic() - started:.0f} s")
    return top


def with_shell(top, busybox="/bin/busybox"):
    """The image of `top` with one more layer: a static busybox as /bin/sh,
    find, sort and sha256sum (the synthetic image has no program of its
    own, and a container step needs a shell), as the OCI layout
    `top`/oci-shell, made if missing; its other blobs are links to the
    image's. The clusters' store test runs it."""
    oci = Path(top) / "oci-shell"
    if (oci / "index.json").exists():
        return oci
    shutil.rmtree(oci, ignore_errors=True)
    blobs, source = oci / "blobs" / "sha256", Path(top) / "oci" / "blobs" / "sha256"
    blobs.mkdir(parents=True)
    manifest = json.loads(manifest_of(top))
    for layer in manifest["layers"]:
        name = layer["digest"].removeprefix("sha256:")
        if not (blobs / name).exists():
            os.link(source / name, blobs / name)
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.GNU_FORMAT) as tar:
        directory = tarfile.TarInfo("bin")
        directory.type, directory.mode, directory.mtime = tarfile.DIRTYPE, 0o755, MTIME
        tar.addfile(directory)
        with open(busybox, "rb") as program:
            info = tar.gettarinfo(fileobj=program, arcname="bin/busybox")
            info.mode, info.mtime, info.uid, info.gid = 0o755, MTIME, 0, 0
            tar.addfile(info, program)
        for tool in ("sh", "find", "sort", "sha256sum"):
            link = tarfile.TarInfo(f"bin/{tool}")
            link.type, link.linkname, link.mtime = tarfile.SYMTYPE, "busybox", MTIME
            tar.addfile(link)
    layer = gzip.compress(raw.getvalue(), mtime=0)

    def write(data):
        digest = hashlib.sha256(data).hexdigest()
        (blobs / digest).write_bytes(data)
        return {"digest": f"sha256:{digest}", "size": len(data)}

    config = json.loads((source / manifest["config"]["digest"].removeprefix("sha256:"))
                        .read_bytes())
    config["rootfs"]["diff_ids"].append(f"sha256:{hashlib.sha256(raw.getvalue()).hexdigest()}")
    manifest["config"].update(write(json.dumps(config, sort_keys=True).encode()))
    manifest["layers"].append({"mediaType": LAYER_TYPE, **write(layer)})
    (oci / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    (oci / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [{
        "mediaType": OCI_MANIFEST, **write(json.dumps(manifest, sort_keys=True).encode()),
        "annotations": {"org.opencontainers.image.ref.name": TAG}}]}))
    return oci


def manifest_of(top):
    """The image's manifest (bytes) from its layout."""
    index = json.loads((Path(top) / "oci" / "index.json").read_text())
    digest = index["manifests"][0]["digest"].removeprefix("sha256:")
    return (Path(top) / "oci" / "blobs" / "sha256" / digest).read_bytes()


def serve(top, quiet=False):
    """A docker-registry on 127.0.0.1 storing in `top`/registry, with the
    image pushed (once: later calls find it there)."""
    top = Path(top)
    (top / "registry").mkdir(exist_ok=True)
    registry = Registry(top / "registry")
    try:
        manifest = manifest_of(top)
        url = f"{registry.url}/v2/{REPOSITORY}/manifests/{TAG}"
        if requests.head(url, headers={"Accept": OCI_MANIFEST}, timeout=10).ok:
            return registry
        _say(quiet, f"pushing {top.name} to the cached registry...")
        parsed = json.loads(manifest)
        for blob in [parsed["config"], *parsed["layers"]]:
            _push_file(registry, top / "oci" / "blobs" / "sha256" / blob["digest"][7:],
                       blob["digest"])
        registry.push_manifest(REPOSITORY, TAG, parsed, OCI_MANIFEST)
        _link_blobs(top, parsed)
        return registry
    except BaseException:
        registry.stop()
        raise


def _push_file(registry, path, digest):
    start = requests.post(f"{registry.url}/v2/{REPOSITORY}/blobs/uploads/", timeout=60)
    start.raise_for_status()
    location = requests.compat.urljoin(registry.url, start.headers["Location"])
    separator = "&" if "?" in location else "?"
    with open(path, "rb") as body:
        done = requests.put(f"{location}{separator}digest={digest}", data=body, timeout=600,
                            headers={"Content-Type": "application/octet-stream",
                                     "Content-Length": str(os.path.getsize(path))})
    done.raise_for_status()


def _link_blobs(top, manifest):
    """The layout's layers as hard links to the registry's copies: one copy on disk."""
    stored = top / "registry" / "storage" / "docker" / "registry" / "v2" / "blobs" / "sha256"
    for hexdigest in {blob["digest"][7:] for blob in manifest["layers"]}:
        data = stored / hexdigest[:2] / hexdigest / "data"
        if data.exists():
            target = top / "oci" / "blobs" / "sha256" / hexdigest
            temporary = target.with_name(f"{hexdigest}.link")
            os.link(data, temporary)
            os.replace(temporary, target)


def _say(quiet, line):
    if not quiet:
        print(f"realistic_image: {line}", file=sys.stderr, flush=True)


def shape_arguments(parser):
    """The image's shape as both benches take it: where it is kept, its size."""
    parser.add_argument("cache_dir")
    parser.add_argument("--size-gib", type=float, default=10)
    parser.add_argument("--files", type=int, default=250_000)
    parser.add_argument("--layers", type=int, default=40)
    parser.add_argument("--seed", type=int, default=1)


def main():
    # a SIGTERM unwinds: the pool's workers and their pigz stop with it
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    shape_arguments(parser)
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args()
    top = cached(args.cache_dir, args.size_gib, args.files, args.layers, args.seed, args.quiet)
    serve(top, args.quiet).stop()
    print(top)


if __name__ == "__main__":
    main()
