"""Shared libraries and image roots for the hook tests that bind a node's
libraries over an image's (the MPI and CXI hooks): small libraries built
here with the sonames and file names of the real ones, and an image root
whose ld.so cache `ldconfig -r` writes, as an image's build does."""

import os
import subprocess

MULTIARCH = "usr/lib/x86_64-linux-gnu"


def shared_library(path, soname, needs=None):
    """A shared library called `soname` at `path` (and a link named `soname`
    beside it); `needs`: a library it links."""
    source = path.parent / f"{path.name}.c"
    source.write_text("int hook_test_symbol(void) { return 1; }\n")
    link = ["-Wl,--no-as-needed", f"-L{needs.parent}", f"-l:{needs.name}",
            f"-Wl,-rpath,{needs.parent}"] if needs else []
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", path, f"-Wl,-soname,{soname}", source, *link],
                   check=True)
    source.unlink()
    if path.name != soname:
        (path.parent / soname).symlink_to(path.name)
    return path.parent / soname


def image(tmp_path, *libraries):
    """An image root whose ld.so cache lists `libraries` (file name, soname)."""
    root = tmp_path / "root"
    (root / MULTIARCH).mkdir(parents=True)
    (root / "etc").mkdir()
    for name, soname in libraries:
        shared_library(root / MULTIARCH / name, soname)
    (root / "etc/ld.so.conf").write_text(f"/{MULTIARCH}\n")
    subprocess.run(["ldconfig", "-r", root], check=True)
    return root


def run_hook(hook, root, env):
    """Run `hook` on the image root `root` with its ENROOT_MOUNTS and
    ENROOT_ENVIRON files beside it (the environment's first line the
    image's own) and `env` added: (the process, the mount lines, the
    environment lines the hook appended)."""
    mounts, environ = root.parent / "mounts", root.parent / "environ"
    mounts.write_text("")
    environ.write_text("LD_LIBRARY_PATH=/opt/app/lib\n")
    process = subprocess.run(
        ["bash", hook], capture_output=True, text=True, check=False, timeout=30,
        env={"PATH": os.environ["PATH"], "ENROOT_ROOTFS": str(root), "ENROOT_MOUNTS": str(mounts),
             "ENROOT_ENVIRON": str(environ), **env})
    return process, mounts.read_text().splitlines(), environ.read_text().splitlines()[1:]
