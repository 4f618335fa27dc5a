"""Numbers read from settings, files and names: ASCII digits only, within
what their users take. str.isdigit() took '²' (which int() refuses) and
int() refused 5,000 digits: both were tracebacks."""

import pytest

from berth import syscalls, units
from berth.container import services
from berth.errors import BerthError
from berth.store import paths, service


@pytest.mark.parametrize("text, value", [("0", 0), ("007", 7), ("9" * 100, int("9" * 100)),
                                         ("\u00b2", None), ("\u0663", None), (" 1", None),
                                         ("1_000", None), ("-1", None), ("", None),
                                         ("9" * 101, None), ("9" * 5000, None)])
def test_a_whole_number_is_ascii_digits(text, value):
    assert units.whole(text) == value


def test_a_size_or_duration_past_a_float_is_none():
    """float() of 400 digits is infinite: int() of it raised OverflowError."""
    assert units.size("9" * 400) is None and units.size("9" * 300 + "T") is None
    assert units.seconds("9" * 400) is None
    assert units.size("2G") == 2 << 30 and units.seconds("1h") == 3600


@pytest.mark.parametrize("port", ["\u00b2", "9" * 5000, "65536"])
def test_a_services_port_that_is_no_port_is_named(tmp_path, port):
    path = tmp_path / "services"
    path.write_text(f"tcp {port} /usr/sbin/sshd -D\n")
    with pytest.raises(BerthError, match=r"^BERTH_SERVICES line 1: port '.{1,20}' is not a number"):
        services.read(str(path))


@pytest.mark.parametrize("owner", ["\u00b2", "9" * 5000, str(2 ** 32)])
def test_a_store_owner_that_is_no_uid_is_named(owner):
    with pytest.raises(BerthError, match="no such user here$"):
        paths.owner_uid({"BERTH_IMAGE_STORE_OWNER": owner})


def test_a_store_users_line_that_is_no_numbers_is_dropped(tmp_path):
    (tmp_path / "users").mkdir()
    (tmp_path / "users" / "1000").write_text(f"\u00b2 1 2\n{'9' * 5000} 1 2\n")
    with service._imports_of(str(tmp_path), 1000) as imports:
        assert imports == []


def test_a_pid_past_any_pid_is_not_alive():
    """A temporary directory named berth-import-9999999999-...: os.kill
    raised OverflowError."""
    assert syscalls.pid_alive(9999999999) is False
