"""A container made by enroot, as pyxis names it, started by Berth.

A site moving from pyxis+enroot keeps its enroot.conf and its users'
named containers: `pyxis_NAME` directories that `enroot create` unpacked
into ENROOT_DATA_PATH, which the site's file makes with the shell
(`$(id -u)`, `${XDG_DATA_HOME}`). The container here is laid out as
enroot 4.1.2 lays one out: the unpacked root, with the files its import
writes under it (etc/rc, which runs the entrypoint or command in the
working directory after sourcing etc/rc.local; etc/rc.local; etc/fstab,
the image's volumes; etc/environment, the image's variables) and no
etc/berth/image.json, plus a file the user made in it under enroot.
"""

import pytest

from container_fixture import build_root

# enroot's etc/rc for an image with a label, WorkingDir /work and no
# entrypoint or command (so /bin/sh): the labels as comments, then the
# working directory, rc.local, and the exec.
ENROOT_RC = """# org.opencontainers.image.title made-by-enroot

mkdir -p "/work" 2> /dev/null
cd "/work" && unset OLDPWD || exit 1

if [ -s /etc/rc.local ]; then
    . /etc/rc.local
fi

if [ $# -gt 0 ]; then
    exec  "$@"
else
    exec  '/bin/sh'
fi
"""


def enroot_container(root):
    build_root(root, rc=False)
    (root / "etc/rc").write_text(ENROOT_RC)
    (root / "etc/rc.local").write_text("# sourced by /etc/rc\nexport FROM_RC_LOCAL=sourced\n")
    (root / "etc/fstab").write_text(
        "${ENROOT_ROOTFS}/srv/vol /srv/vol none x-create=dir,bind,rw,nosuid,nodev\n")
    (root / "etc/environment").write_text("FOO=from-enroot\nPATH=/usr/local/bin:/bin\n")
    (root / "srv/vol").mkdir(parents=True)
    (root / "work/made-under-enroot.txt").write_text("kept\n")


@pytest.mark.parametrize("data_path, env", [
    ("{base}/enroot-data/user-$(id -u)", {}),
    ("${{XDG_DATA_HOME}}/enroot", {"XDG_DATA_HOME": "{base}/xdg"}),
])
def test_a_pyxis_container_made_by_enroot_starts_by_name(berth, data_path, env):
    del berth.env["ENROOT_DATA_PATH"]  # the site's enroot.conf says where
    env = {key: value.format(base=berth.base) for key, value in env.items()}
    berth.write("sys/enroot.conf", "# the site's, from its pyxis+enroot days\n"
                                   f"ENROOT_DATA_PATH {data_path.format(base=berth.base)}\n")
    data = (berth.base / "enroot-data" / f"user-{berth.user.pw_uid}" if not env
            else berth.base / "xdg/enroot")
    enroot_container(data / "pyxis_job")
    berth.chown(berth.base)

    assert berth.ok("list", env=env).split() == ["pyxis_job"]
    shown = berth.ok("start", "pyxis_job", "sh", "-c",
                     'pwd; cat made-under-enroot.txt; echo "$FOO $FROM_RC_LOCAL"', env=env)
    assert shown.splitlines() == ["/work", "kept", "from-enroot sourced"]
    assert (data / "pyxis_job/work/made-under-enroot.txt").read_text() == "kept\n"
    assert berth.leftovers() == []
