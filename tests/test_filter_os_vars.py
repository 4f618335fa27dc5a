"""berth_os_vars_files: the family's vars file, then the release's where the
role has one; facts without the release are refused by name."""

import sys
from pathlib import Path

import pytest
from ansible.errors import AnsibleFilterError

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "plugins" / "filter"))
from berth_os_vars import berth_os_vars_files  # noqa: E402

DEBIAN_13 = {"os_family": "Debian", "distribution": "Debian", "distribution_major_version": "13"}


def test_family_then_release(tmp_path):
    (tmp_path / "Debian.yml").write_text("{}\n")
    (tmp_path / "Debian-13.yml").write_text("{}\n")
    assert berth_os_vars_files(str(tmp_path), DEBIAN_13) == [
        str(tmp_path / "Debian.yml"), str(tmp_path / "Debian-13.yml")]


def test_a_release_without_a_file_takes_the_familys_alone(tmp_path):
    (tmp_path / "Debian.yml").write_text("{}\n")
    (tmp_path / "Debian-13.yml").write_text("{}\n")
    facts = {**DEBIAN_13, "distribution_major_version": "12"}
    assert berth_os_vars_files(str(tmp_path), facts) == [str(tmp_path / "Debian.yml")]


@pytest.mark.parametrize("facts", [{}, {**DEBIAN_13, "distribution_major_version": ""},
                                   {**DEBIAN_13, "os_family": None}, "Debian"])
def test_facts_without_the_release_are_refused(tmp_path, facts):
    with pytest.raises(AnsibleFilterError, match="need os_family, distribution, "
                                                 "distribution_major_version"):
        berth_os_vars_files(str(tmp_path), facts)
