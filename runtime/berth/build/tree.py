"""The stage's root as a directory a step can change: its base unpacked
from a squashfs when a step must run (restore.py puts the cached steps'
layers over it), and the image packed from it at the end."""

import os
import subprocess

from berth import rootpath
from berth.container import rootfs
from berth.errors import BerthError
from berth.image import parts, squash


def unpack(image, target):
    """`image` (a squashfs; an imported one may be kept as parts) into the
    new directory `target`, every directory writable to its owner (the
    caller: COPY writes there from the host)."""
    os.mkdir(target, 0o700)
    top = parts.top_of_file(image)
    if top:
        parts.unpack(image, target, top)
    else:  # (unprivileged, unsquashfs cannot make device nodes: not an error)
        tolerate = ["-no-exit-code"] if os.getuid() else []
        result = subprocess.run(["unsquashfs", "-no-progress", "-no-xattrs", *tolerate, "-f",
                                 "-d", target, image], capture_output=True, text=True,
                                check=False)
        if result.returncode:
            detail = (result.stderr.strip().splitlines() or ["no message"])[-1]
            raise BerthError(f"{image}: unsquashfs failed: {detail}")
    owner_writable(target)


def owner_writable(root):
    """Give the owner rwx on every directory of `root`, each before the walk
    enters it: COPY writes from the host, mksquashfs reads as the caller,
    and what a RUN made 0500 or 0000 must be packed and removed too."""
    for top_dir, dirs, _ in os.walk(root):
        for d in [top_dir, *(os.path.join(top_dir, d) for d in dirs)]:
            mode = os.lstat(d).st_mode
            if mode & 0o700 != 0o700 and not os.path.islink(d):
                os.chmod(d, mode | 0o700)


def pack(root, output, cfg):
    """`root` into the squashfs `output`, every file root's (the tree is
    all the caller's), setuid bits kept: what RUN made as root."""
    squash.make_squashfs(root, output, cfg, show_progress=False, all_root=True)


def path_in(root, name):
    """The host path of `name` in `root`, its symbolic links read as the
    container reads them (never out of the root)."""
    return rootpath.resolve(root, name, follow_last=True)


def remove(path):
    rootfs.remove_tree(path)


def read_config(image):
    """The JSON text of the image's etc/berth/image.json, or None."""
    top = parts.top_of_file(image)
    name = "etc/berth/image.json"
    result = subprocess.run(["unsquashfs", "-cat", image, f"{top}/{name}" if top else name],
                            capture_output=True, check=False)
    return result.stdout.decode(errors="replace") if result.returncode == 0 else None
