"""hooks/86-mpi.sh against made-up MPIs: small shared libraries built here
with the MPI sonames (an image's MPICH and Open MPI, the node's MPICH and
the libfabric it needs), an image root whose ld.so cache `ldconfig -r`
wrote, as an image's build does. The tests read the lines the hook appends;
the multinode scenario runs an MPI job with the node's library
(molecule/multinode/tests/test_spank.py)."""

from pathlib import Path

import pytest

import fake_libraries
from fake_libraries import MULTIARCH, image, shared_library

REPO = Path(__file__).resolve().parent.parent
HOOK = REPO / "hooks" / "86-mpi.sh"
ON = {"BERTH_HOOK_MPI_ENABLE": "yes"}


@pytest.fixture
def node(tmp_path):
    """The node's MPICH (C and Fortran) and the libfabric it needs."""
    mpi = tmp_path / "node-mpi"
    mpi.mkdir()
    shared_library(mpi / "libfabric.so.1", "libfabric.so.1")
    shared_library(mpi / "libmpich.so.12", "libmpich.so.12", needs=mpi / "libfabric.so.1")
    shared_library(mpi / "libmpichfort.so.12", "libmpichfort.so.12")
    return mpi


def run_hook(root, node, env=None):
    return fake_libraries.run_hook(HOOK, root, {
        "BERTH_MPI_LIBRARY": str(node / "libmpich.so.12"), **(env or {})})


def mpich_over_the_images(node):
    """The mount lines of the node's libmpich and libmpichfort over the image's."""
    return [f"{node}/{soname} /{MULTIARCH}/{soname} none bind,ro,nosuid,nodev"
            for soname in ("libmpich.so.12", "libmpichfort.so.12")]


def bound_as_a_need(node, soname):
    """The mount line of a library the node's MPI needs, in the hook's own directory."""
    return (f"{node}/{soname} /usr/local/berth/mpi/lib/{soname} none "
            "bind,ro,nosuid,nodev,x-create=file")


def test_the_images_mpich_is_the_nodes_and_its_open_mpi_stays(tmp_path, node):
    root = image(tmp_path, ("libmpich.so.12.3.0", "libmpich.so.12"),
                 ("libmpichfort.so.12.3.0", "libmpichfort.so.12"), ("libmpi.so.40.30.4", "libmpi.so.40"))
    process, mounts, environ = run_hook(root, node, ON)
    assert process.returncode == 0 and process.stderr == ""
    assert sorted(mounts) == sorted(mpich_over_the_images(node)
                                    + [bound_as_a_need(node, "libfabric.so.1")])
    assert environ == ["LD_LIBRARY_PATH=/usr/local/berth/mpi/lib:/opt/app/lib"]


def test_a_need_named_like_the_family_is_bound_and_the_family_is_not(tmp_path):
    """Of what the node's MPI libraries need, only the MPICH-ABI family's six
    sonames stay out of /usr/local/berth/mpi/lib (the node's are bound over the
    image's); a support library whose name merely begins with libmpi is bound
    there, as any other need is."""
    mpi = tmp_path / "node-mpi"
    mpi.mkdir()
    shared_library(mpi / "libmpi_support.so.12", "libmpi_support.so.12")
    shared_library(mpi / "libmpich.so.12", "libmpich.so.12", needs=mpi / "libmpi_support.so.12")
    shared_library(mpi / "libmpichfort.so.12", "libmpichfort.so.12", needs=mpi / "libmpich.so.12")
    root = image(tmp_path, ("libmpich.so.12.3.0", "libmpich.so.12"),
                 ("libmpichfort.so.12.3.0", "libmpichfort.so.12"))
    process, mounts, environ = run_hook(root, mpi, ON)
    assert process.returncode == 0 and process.stderr == ""
    assert sorted(mounts) == sorted(mpich_over_the_images(mpi)
                                    + [bound_as_a_need(mpi, "libmpi_support.so.12")])
    assert environ == ["LD_LIBRARY_PATH=/usr/local/berth/mpi/lib:/opt/app/lib"]


@pytest.mark.parametrize("libraries, env, message", [
    ([("libmpi.so.40.30.4", "libmpi.so.40")], {},
     "the image's MPI is not MPICH-ABI (it has libmpi.so.40, Open MPI's): not replaced"),
    ([("libz.so.1", "libz.so.1")], {},
     "the image has no MPICH-ABI MPI to replace (no libmpi.so.12 or libmpich.so.12 in its ld.so cache)"),
    ([("libmpich.so.12.3.0", "libmpich.so.12"), ("libmpichcxx.so.12.3.0", "libmpichcxx.so.12")], {},
     "the image's libmpichcxx.so.12 has no counterpart beside {node}/libmpich.so.12 on this node: "
     "not replaced"),
    ([("libmpich.so.12.3.0", "libmpich.so.12")], {"BERTH_MPI_LIBRARY": ""},
     "this site names no MPI to put in (BERTH_MPI_LIBRARY is not set in enroot.conf)"),
    ([("libmpich.so.12.3.0", "libmpich.so.12")], {"BERTH_MPI_LIBRARY": "libmpich.so.12"},
     "BERTH_MPI_LIBRARY: 'libmpich.so.12' is not an absolute path without spaces"),
    ([("libmpich.so.12.3.0", "libmpich.so.12")], {"BERTH_MPI_LIBRARY": "/no/such/libmpi.so.12"},
     "BERTH_MPI_LIBRARY: /no/such/libmpi.so.12: no such library on this node"),
    ([("libmpich.so.12.3.0", "libmpich.so.12")], {"BERTH_HOOK_MPI_ENABLE": "often"},
     "BERTH_HOOK_MPI_ENABLE: expected yes or no, got 'often'"),
])
def test_refused_in_one_line_and_nothing_bound(tmp_path, node, libraries, env, message):
    root = image(tmp_path, *libraries)
    process, mounts, environ = run_hook(root, node, {**ON, **env})
    assert process.returncode == 1 and (mounts, environ) == ([], [])
    assert process.stderr == f"mpi hook: {message.format(node=node)}\n"


def test_an_image_whose_cache_is_a_link_has_no_mpi_to_replace(tmp_path, node):
    """A link could lead to the node's own cache, which lists the node's MPI."""
    root = image(tmp_path, ("libmpich.so.12.3.0", "libmpich.so.12"))
    (root / "etc/ld.so.cache").unlink()
    (root / "etc/ld.so.cache").symlink_to("/etc/ld.so.cache")
    process, mounts, _ = run_hook(root, node, ON)
    assert process.returncode == 1 and mounts == []
    assert "the image has no MPICH-ABI MPI to replace" in process.stderr


def test_off_by_default(tmp_path, node):
    root = image(tmp_path, ("libmpich.so.12.3.0", "libmpich.so.12"))
    assert run_hook(root, node)[1:] == ([], [])
    assert run_hook(root, node, {"BERTH_HOOK_MPI_ENABLE": "no"})[1:] == ([], [])
