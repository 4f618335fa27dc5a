"""rootfs.remove_tree on trees as images ship them."""

import os

from berth.container import rootfs


def test_remove_tree_with_links_to_directories_and_locked_dirs(tmp_path):
    root = tmp_path / "root"
    (root / "var" / "mail").mkdir(parents=True)
    (root / "var" / "mail" / "alice").write_text("")
    (root / "var" / "spool").mkdir()
    os.symlink("../mail", root / "var" / "spool" / "mail")  # as Debian ships it
    os.symlink("/etc", root / "var" / "outside")             # must not be followed
    (root / "locked").mkdir()
    (root / "locked" / "f").write_text("")
    os.chmod(root / "locked", 0o500)
    rootfs.remove_tree(root)
    assert not root.exists()
    assert os.path.isdir("/etc")
