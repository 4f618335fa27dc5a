"""berth_sacctmgr: what it adds, idempotence, check mode and refusals.

sacctmgr here is a small stand-in keeping the database in a JSON file (this
machine runs no slurmdbd); the multinode scenario runs the module against a
real slurmdbd on MariaDB (molecule/multinode/tests/test_accounting.py)."""

import json
import textwrap

import pytest

import ansible_module

FAKE = textwrap.dedent("""\
    #!/usr/bin/env python3
    import json, os, sys
    state_file = os.environ.get("FAKE_SACCTMGR_STATE") or sys.argv[0] + ".json"
    db = json.load(open(state_file)) if os.path.exists(state_file) else {"clusters": [], "assoc": []}
    args = sys.argv[1:]
    open(sys.argv[0] + ".log", "a").write(" ".join(args) + "\\n")
    if "down" in db:
        sys.exit("sacctmgr: error: Problem talking to the database: Connection refused")
    words = [a for a in args if not a.startswith("--")]
    kv = dict(w.split("=", 1) for w in words if "=" in w)
    if words[0] == "show" and words[1] == "cluster":
        print("".join(c + "\\n" for c in db["clusters"]), end="")
    elif words[0] == "show" and words[1] == "association":
        print("".join(f"{a}|{u}\\n" for c, a, u in db["assoc"] if c == kv["cluster"]), end="")
    elif words[0] == "add" and "--immediate" in args:
        kind, name = words[1], words[2]
        if kind == "cluster":
            db["clusters"].append(name)
            db["assoc"] += [[name, "root", ""], [name, "root", "root"]]
        elif kind == "account":
            db["assoc"].append([kv["cluster"], name, ""])
        elif kind == "user":
            if [kv["cluster"], kv["account"], ""] not in db["assoc"]:
                sys.exit(f"sacctmgr: error: no account {kv['account']}")
            db["assoc"].append([kv["cluster"], kv["account"], name])
        json.dump(db, open(state_file, "w"))
    else:
        sys.exit("fake sacctmgr: unexpected " + " ".join(args))
""")


@pytest.fixture
def sacctmgr(tmp_path):
    program = tmp_path / "sacctmgr"
    program.write_text(FAKE)
    program.chmod(0o755)
    return program


def state(program):
    return json.loads(program.with_name("sacctmgr.json").read_text())


def calls(program):
    log = program.with_name("sacctmgr.log")
    return [line for line in log.read_text().splitlines() if " add " in f" {line} "] \
        if log.exists() else []


def args(sacctmgr, accounts):
    return {"cluster": "berth", "accounts": accounts, "sacctmgr": str(sacctmgr)}


def run(sacctmgr, accounts, check=False):
    return ansible_module.call_module("berth_sacctmgr", args(sacctmgr, accounts), check)


ACCOUNTS = {"physics": {"users": ["alice", "bob"]}, "biology": {"users": ["alice"]}}


@pytest.mark.playbook
def test_registers_cluster_accounts_and_users_then_changes_nothing(tmp_path, sacctmgr):
    first = ansible_module.run_module(tmp_path, "berth_sacctmgr", args(sacctmgr, ACCOUNTS))
    assert first["changed"] is True, first
    assert first["added"] == [
        "add cluster berth",
        "add account physics cluster=berth",
        "add user alice account=physics cluster=berth",
        "add user bob account=physics cluster=berth",
        "add account biology cluster=berth",
        "add user alice account=biology cluster=berth",
    ]
    assert sorted(map(tuple, state(sacctmgr)["assoc"])) == sorted([
        ("berth", "root", ""), ("berth", "root", "root"), ("berth", "physics", ""),
        ("berth", "physics", "alice"), ("berth", "physics", "bob"), ("berth", "biology", ""),
        ("berth", "biology", "alice")])
    adds = len(calls(sacctmgr))
    again = ansible_module.run_module(tmp_path, "berth_sacctmgr", args(sacctmgr, ACCOUNTS))
    assert again["changed"] is False and again["added"] == []
    assert len(calls(sacctmgr)) == adds  # nothing added twice


def test_a_new_user_only_adds_that_user(sacctmgr):
    run(sacctmgr, ACCOUNTS)
    more = run(sacctmgr, {**ACCOUNTS, "physics": {"users": ["alice", "bob", "carol"]}})
    assert more["changed"] is True
    assert more["added"] == ["add user carol account=physics cluster=berth"]
    assert "account physics user carol" in more["diff"]["after"]
    assert "account physics user carol" not in more["diff"]["before"]


def test_check_mode_reports_and_adds_nothing(sacctmgr):
    result = run(sacctmgr, ACCOUNTS, check=True)
    assert result["changed"] is True
    assert "add cluster berth" in result["added"]
    assert not sacctmgr.with_name("sacctmgr.json").exists()
    assert calls(sacctmgr) == []


def test_accounts_left_out_are_left_alone(sacctmgr):
    run(sacctmgr, ACCOUNTS)
    fewer = run(sacctmgr, {"physics": {"users": ["alice"]}})
    assert fewer["changed"] is False
    assert ["berth", "biology", "alice"] in state(sacctmgr)["assoc"]


@pytest.mark.parametrize("accounts, message", [
    ({"Physics": {"users": []}}, "accounts.Physics: not a lower-case account name"),
    ({"physics": {"members": ["alice"]}}, "accounts.physics: expected a mapping with only the key 'users'"),
    ({"physics": {"users": "alice"}}, "accounts.physics.users: expected a list of login names"),
    ({"physics": {"users": ["Alice Smith"]}}, "accounts.physics.users: 'Alice Smith' is not a lower-case login name"),
])
def test_bad_accounts_are_refused_before_any_change(sacctmgr, accounts, message):
    result = run(sacctmgr, accounts)
    assert result.get("failed") is True
    assert message in result["msg"]
    assert not sacctmgr.with_name("sacctmgr.json").exists()
    assert not sacctmgr.with_name("sacctmgr.log").exists()  # sacctmgr never ran


def test_an_unreachable_slurmdbd_fails_in_one_line_naming_the_command(sacctmgr):
    sacctmgr.with_name("sacctmgr.json").write_text(json.dumps({"down": 1}))
    result = run(sacctmgr, ACCOUNTS)
    assert result.get("failed") is True
    assert result["msg"] == ("sacctmgr show cluster format=cluster failed: sacctmgr: error: "
                             "Problem talking to the database: Connection refused")
