"""library/berth_tree.py, called directly (the first test runs it through
ansible-playbook): a directory made to hold exactly the given files, in one
module run."""

import errno
import os

import pytest
from ansible.module_utils import basic

import ansible_module


def run(dest, files, check=False, **options):
    return ansible_module.call_module("berth_tree", {"dest": str(dest), "files": files, **options}, check)


def tree(dest):
    return {os.path.relpath(os.path.join(root, name), dest): open(os.path.join(root, name)).read()
            for root, _, names in os.walk(dest) for name in names}


@pytest.mark.playbook
def test_writes_the_tree_then_changes_nothing(tmp_path):
    dest = tmp_path / "src"
    files = {"pyproject.toml": "[project]\n", "berth/__init__.py": "", "berth/cli.py": "x = 1\n"}
    first = ansible_module.run_module(tmp_path, "berth_tree", {"dest": str(dest), "files": files})
    assert first["changed"] and first["written"] == sorted(files)
    assert tree(dest) == files
    assert oct((dest / "berth" / "cli.py").stat().st_mode & 0o777) == "0o644"
    again = ansible_module.run_module(tmp_path, "berth_tree", {"dest": str(dest), "files": files})
    assert not again["changed"] and again["written"] == [] and again["removed"] == []


def test_writes_what_changed_and_removes_what_is_gone(tmp_path):
    dest = tmp_path / "src"
    run(dest, {"a.py": "1\n", "old/b.py": "2\n", "keep.py": "3\n"})
    (dest / "stray.pyc").write_text("left by a build")
    result = run(dest, {"a.py": "changed\n", "keep.py": "3\n"})
    assert result["written"] == ["a.py"]
    assert result["removed"] == ["old", "stray.pyc"]
    assert tree(dest) == {"a.py": "changed\n", "keep.py": "3\n"}


def test_a_planted_link_is_removed_not_followed(tmp_path):
    dest = tmp_path / "src"
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "a.py").write_text("not yours\n")
    run(dest, {"a.py": "1\n"})
    (dest / "a.py").unlink()
    (dest / "a.py").symlink_to(outside / "a.py")
    (dest / "sub").symlink_to(outside)
    result = run(dest, {"a.py": "1\n", "sub/b.py": "2\n"})
    assert result["changed"]
    assert (outside / "a.py").read_text() == "not yours\n" and not (outside / "b.py").exists()
    assert not (dest / "a.py").is_symlink() and not (dest / "sub").is_symlink()
    assert tree(dest) == {"a.py": "1\n", "sub/b.py": "2\n"}


def test_check_mode_reports_and_writes_nothing(tmp_path):
    dest = tmp_path / "src"
    run(dest, {"a.py": "1\n"})
    result = run(dest, {"a.py": "2\n", "b.py": "3\n"}, check=True)
    assert result["changed"] and result["written"] == ["a.py", "b.py"]
    assert tree(dest) == {"a.py": "1\n"}


def test_a_path_out_of_dest_is_refused_naming_it(tmp_path):
    dest = tmp_path / "src"
    result = run(dest, {"ok.py": "1\n", "../escape.py": "2\n"})
    assert result["failed"]
    assert result["msg"] == "berth_tree: files: '../escape.py' is not a relative path below dest"
    assert not dest.exists() and not (tmp_path / "escape.py").exists()


def test_purge_false_leaves_the_others_files(tmp_path):
    dest = tmp_path / "hooks.d"
    dest.mkdir()
    (dest / "50-site.sh").write_text("the site's own\n")
    (dest / "10-home.sh").symlink_to(tmp_path / "elsewhere")
    result = run(dest, {"10-home.sh": "ours\n"}, mode="0755", purge=False)
    assert result["written"] == ["10-home.sh"] and result["removed"] == ["10-home.sh"]
    assert tree(dest) == {"10-home.sh": "ours\n", "50-site.sh": "the site's own\n"}
    assert oct((dest / "10-home.sh").stat().st_mode & 0o777) == "0o755"
    assert not (tmp_path / "elsewhere").exists()
    assert not run(dest, {"10-home.sh": "ours\n"}, mode="0755", purge=False)["changed"]


def test_diff_shows_each_written_files_old_and_new_text(tmp_path):
    dest = tmp_path / "units"
    run(dest, {"a.timer": "OnCalendar=daily\n", "b.service": "same\n"})
    result = run(dest, {"a.timer": "OnCalendar=hourly\n", "b.service": "same\n",
                                  "c.service": "new\n"}, check=True)
    assert result["diff"] == [
        {"before_header": str(dest / "a.timer"), "after_header": str(dest / "a.timer"),
         "before": "OnCalendar=daily\n", "after": "OnCalendar=hourly\n"},
        {"before_header": str(dest / "c.service"), "after_header": str(dest / "c.service"),
         "before": "", "after": "new\n"}]


def test_dir_mode_makes_and_keeps_a_private_directory(tmp_path):
    dest = tmp_path / "config" / "enroot"
    files = {".credentials": "machine r login a password p\n"}
    first = run(dest, files, mode="0600", dir_mode="0700", purge=False)
    assert first["changed"]
    assert oct(dest.stat().st_mode & 0o777) == "0o700"
    assert oct((dest / ".credentials").stat().st_mode & 0o777) == "0o600"
    dest.chmod(0o755)
    again = run(dest, files, mode="0600", dir_mode="0700", purge=False)
    assert again["changed"] and again["written"] == []
    assert oct(dest.stat().st_mode & 0o777) == "0o700"
    assert not run(dest, files, mode="0600", dir_mode="0700", purge=False)["changed"]


def test_missing_parents_are_made_0755_under_a_group_writable_umask(tmp_path):
    # A user's umask on Debian 13 is 002: a ~/.config made with it would be
    # group-writable, and berth refuses a config directory others may replace.
    dest = tmp_path / "home" / ".config" / "enroot"
    run_umask = ansible_module.call_module(
        "berth_tree", {"dest": str(dest), "files": {".credentials": "x\n"},
                       "mode": "0600", "dir_mode": "0700", "purge": False},
        umask=0o002)
    assert run_umask["changed"]
    assert [oct(p.stat().st_mode & 0o777) for p in (tmp_path / "home", dest.parent, dest)] \
        == ["0o755", "0o755", "0o700"]


def test_a_bad_dir_mode_is_refused_naming_it(tmp_path):
    dest = tmp_path / "d"
    result = run(dest, {"a": "1\n"}, dir_mode="rwx")
    assert result["failed"] and result["msg"] == "berth_tree: dir_mode 'rwx' is not octal"
    assert not dest.exists()


def test_a_shared_dest_reached_through_a_link_is_followed_a_tree_of_ours_is_not(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (real / "site.conf").write_text("the site's\n")
    shared = tmp_path / "shared"
    shared.symlink_to(real)
    assert run(shared, {"ours.conf": "1\n"}, purge=False)["changed"]
    assert shared.is_symlink() and tree(real) == {"site.conf": "the site's\n", "ours.conf": "1\n"}
    owned = tmp_path / "owned"
    owned.symlink_to(real)
    run(owned, {"a": "1\n"})
    assert not owned.is_symlink() and tree(owned) == {"a": "1\n"}
    assert tree(real) == {"site.conf": "the site's\n", "ours.conf": "1\n"}


def test_a_change_of_mode_alone_rewrites_an_existing_file_with_the_new_mode(tmp_path):
    dest = tmp_path / "hooks.d"
    files = {"10-home.sh": "#!/bin/sh\n"}
    run(dest, files)
    result = run(dest, files, mode="0755")
    assert result["written"] == ["10-home.sh"]
    assert oct((dest / "10-home.sh").stat().st_mode & 0o777) == "0o755"
    assert not run(dest, files, mode="0755")["changed"]
    run(dest, {"10-home.sh": "#!/bin/sh\nexit 0\n"}, mode="0700")
    assert oct((dest / "10-home.sh").stat().st_mode & 0o777) == "0o700"


def test_a_new_private_file_is_never_readable_by_others_on_its_way(tmp_path, monkeypatch):
    # atomic_move makes a file it creates 0666 & ~umask before the module sets
    # the file's mode: what others could read in between, under umask 002.
    seen = {}
    real_move = basic.AnsibleModule.atomic_move

    def move_and_look(self, src, dest, **options):
        real_move(self, src, dest, **options)
        seen[os.path.basename(dest)] = os.stat(dest).st_mode & 0o777

    monkeypatch.setattr(basic.AnsibleModule, "atomic_move", move_and_look)
    dest = tmp_path / "enroot"
    result = ansible_module.call_module(
        "berth_tree", {"dest": str(dest), "files": {".credentials": "x\n", "run.sh": "y\n"},
                       "mode": "0600"}, umask=0o002)
    assert result["changed"] and seen and all(mode & 0o077 == 0 for mode in seen.values())
    assert oct((dest / ".credentials").stat().st_mode & 0o777) == "0o600"


def test_a_rename_that_fails_is_one_line_naming_the_file(tmp_path, monkeypatch):
    def refuse(src, dest):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), dest)

    monkeypatch.setattr(os, "rename", refuse)
    dest = tmp_path / "src"
    result = run(dest, {"a.py": "1\n"})
    assert result["failed"] and result["msg"].startswith("berth_tree: ")
    assert str(dest / "a.py") in result["msg"] and "\n" not in result["msg"]
    assert os.listdir(dest) == []
