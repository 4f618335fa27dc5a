"""A user's first hour on the login node (the controller here): the Slurm
prolog makes a user's berth directories on compute nodes; on login nodes a
PAM session hook makes them when her session opens, so that `berth import`
and `enroot import` work there from her first login."""

import shlex

from conftest import CONTROLLER, node

REGISTRY_IMAGE = f"docker://{CONTROLLER}:5000#berth/mpi-test:1"
USER = "victor"


def user_paths(host):
    uid = host.check_output(f"id -u {USER}")
    return [f"/var/lib/berth/cache/{uid}", f"/var/lib/berth/data/{uid}", f"/run/berth/{uid}"]


def login(host, command):
    """A session of the user's own, as ssh or login opens one (su goes
    through PAM's common session; runuser does not)."""
    return host.run(f"cd /tmp && su {USER} -c {shlex.quote(command)}")


def test_a_first_login_makes_the_users_directories_and_imports_work():
    ctl = node(CONTROLLER)
    paths = user_paths(ctl)
    # as right after site.yml: nothing of hers on the login node yet
    ctl.check_output(f"rm -rf {' '.join(paths)} /tmp/{USER}-first.sqsh")
    before = ctl.run(f"cd /tmp && runuser -u {USER} -- berth -q import -o /tmp/{USER}-first.sqsh "
                     f"'{REGISTRY_IMAGE}'")
    assert before.rc != 0 and "ENROOT_CACHE_PATH" in before.stderr, before.stderr
    first = login(ctl, f"berth -q import -o /tmp/{USER}-first.sqsh '{REGISTRY_IMAGE}' && "
                       f"enroot import -o /tmp/{USER}-again.sqsh '{REGISTRY_IMAGE}' >/dev/null 2>&1 && "
                       f"ls /tmp/{USER}-first.sqsh /tmp/{USER}-again.sqsh")
    assert first.rc == 0, first.stderr
    for path in paths:
        made = ctl.file(path)
        assert (made.is_directory, made.user, made.mode) == (True, USER, 0o700), path
    ctl.check_output(f"rm -f /tmp/{USER}-first.sqsh /tmp/{USER}-again.sqsh")


def test_her_own_broken_paths_never_fail_her_login_and_are_logged():
    ctl = node(CONTROLLER)
    paths = user_paths(ctl)
    home = ctl.user(USER).home
    ctl.check_output(f"rm -rf {' '.join(paths)}")
    # her own doing: ~/.config a file, where her ENROOT_CONFIG_PATH must go
    ctl.check_output(f"mv {home}/.config {home}/.config.kept 2>/dev/null; "
                     f"runuser -u {USER} -- touch {home}/.config")
    try:
        session = login(ctl, "echo logged-in")
        assert (session.rc, session.stdout.strip()) == (0, "logged-in"), session.stderr
        assert "berth" not in session.stderr  # the warning goes to syslog, not her terminal
        logged = ctl.check_output("journalctl -q -t berth-login -n 5 --no-pager")
        assert f"{home}/.config" in logged, logged
    finally:
        ctl.check_output(f"rm -f {home}/.config; mv {home}/.config.kept {home}/.config 2>/dev/null; true")
    # and her next login, her paths mended, makes them
    assert login(ctl, "true").rc == 0
    assert all(ctl.file(path).is_directory for path in paths)
