#!/usr/bin/python
"""Ansible module: register a cluster, its accounts and their users with slurmdbd."""

DOCUMENTATION = r"""
---
module: berth_sacctmgr
short_description: Register a Slurm cluster, its accounts and their users in the accounting database
description:
  - Makes sure that slurmdbd knows the cluster O(cluster), each account of O(accounts) on that
    cluster, and each listed user in that account, through C(sacctmgr) on a host whose
    C(slurm.conf) names the slurmdbd host.
  - Only adds. An account, user or association that O(accounts) does not list is left as it is,
    since associations carry their jobs' history; removing one is an admin's explicit
    C(sacctmgr remove).
  - A user added to several accounts gets the first of them, in O(accounts) order, as the
    default account when the user is new.
  - Idempotent; C(changed) only when something was added. Check mode reports what would be
    added and adds nothing.
version_added: "0.1.0"
options:
  cluster:
    description: The cluster name, as C(ClusterName) in C(slurm.conf).
    type: str
    required: true
  accounts:
    description:
      - "Accounts and their users, C({account: {users: [login, ...]}})."
      - Names are lower case, as Slurm's database keeps them (a name in upper case would be
        added again on every run); letters, digits, C(_), C(.) and C(-).
    type: dict
    default: {}
  sacctmgr:
    description: The C(sacctmgr) program; default the one in C(PATH).
    type: path
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
requirements:
  - C(sacctmgr) (Debian C(slurm-client)), munge, and a slurmdbd that answers
author:
  - Berth authors
"""

EXAMPLES = r"""
- name: Register the cluster and the research accounts
  berth_sacctmgr:
    cluster: berth
    accounts:
      physics: {users: [alice, bob]}
      biology: {users: [carol]}
"""

RETURN = r"""
added:
  description: What was (or, in check mode, would be) added, one C(sacctmgr) command each.
  returned: always
  type: list
  elements: str
  sample:
    - add cluster berth
    - add account physics cluster=berth
    - add user alice account=physics cluster=berth
"""

import re

from ansible.module_utils.basic import AnsibleModule

NAME = re.compile(r"[a-z0-9_][a-z0-9_.-]{0,63}")
LOGIN = re.compile(r"[a-z_][a-z0-9_.-]{0,31}")


def check_accounts(accounts):
    """The accounts as {account: [users]}; ValueError naming the first bad entry."""
    checked = {}
    for account, entry in accounts.items():
        where = f"accounts.{account}"
        if not isinstance(account, str) or not NAME.fullmatch(account):
            raise ValueError(
                f"{where}: not a lower-case account name (letters, digits, '_', '.', '-')")
        if entry is None:
            entry = {}
        if not isinstance(entry, dict) or set(entry) - {"users"}:
            raise ValueError(f"{where}: expected a mapping with only the key 'users'")
        users = entry.get("users") or []
        if not isinstance(users, list):
            raise ValueError(f"{where}.users: expected a list of login names")
        for user in users:
            if not isinstance(user, str) or not LOGIN.fullmatch(user):
                raise ValueError(f"{where}.users: '{user}' is not a lower-case login name")
        checked[account] = users
    return checked


class Sacctmgr:
    def __init__(self, module, program):
        self.module = module
        self.program = program

    def rows(self, *what):
        """Lines of `sacctmgr show WHAT`, each split at '|'."""
        rc, out, err = self.module.run_command(
            [self.program, "--noheader", "--parsable2", "show", *what])
        if rc != 0:
            self.fail(" ".join(("show",) + what), out, err)
        return [line.split("|") for line in out.splitlines() if line]

    def add(self, words):
        rc, out, err = self.module.run_command([self.program, "--immediate", "add", *words])
        if rc != 0:
            self.fail("add " + " ".join(words), out, err)

    def fail(self, command, out, err):
        said = " ".join((err.strip() or out.strip() or "no output").split())
        self.module.fail_json(msg=f"sacctmgr {command} failed: {said}")


def plan(cluster, accounts, clusters, associations):
    """The sacctmgr add commands (word lists) that make the database hold what is asked."""
    commands = []
    if cluster not in clusters:
        commands.append(["cluster", cluster])
    for account, users in accounts.items():
        if (account, "") not in associations:
            commands.append(["account", account, f"cluster={cluster}"])
        for user in users:
            if (account, user) not in associations:
                commands.append(["user", user, f"account={account}", f"cluster={cluster}"])
    return commands


def listing(cluster, clusters, associations):
    lines = [f"cluster {name}" for name in sorted(clusters) if name == cluster]
    lines += [f"account {account}" + (f" user {user}" if user else "")
              for account, user in sorted(associations)]
    return "".join(line + "\n" for line in lines)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            cluster=dict(type="str", required=True),
            accounts=dict(type="dict", default={}),
            sacctmgr=dict(type="path"),
        ),
        supports_check_mode=True,
    )
    cluster = module.params["cluster"]
    if not NAME.fullmatch(cluster):
        module.fail_json(msg=f"cluster: '{cluster}' is not a lower-case cluster name")
    try:
        accounts = check_accounts(module.params["accounts"])
    except ValueError as e:
        module.fail_json(msg=str(e))
    program = module.params["sacctmgr"] or module.get_bin_path("sacctmgr", required=True)
    sacctmgr = Sacctmgr(module, program)

    clusters = {row[0] for row in sacctmgr.rows("cluster", "format=cluster")}
    associations = set()
    if cluster in clusters:
        associations = {(row[0], row[1]) for row in sacctmgr.rows(
            "association", f"cluster={cluster}", "format=account,user")}
    commands = plan(cluster, accounts, clusters, associations)

    after_clusters, after_associations = set(clusters) | {cluster}, set(associations)
    for words in commands:
        if words[0] == "account":
            after_associations.add((words[1], ""))
        elif words[0] == "user":
            after_associations.add((words[2].split("=", 1)[1], words[1]))
    if commands and not module.check_mode:
        for words in commands:
            sacctmgr.add(words)
    module.exit_json(
        changed=bool(commands),
        added=["add " + " ".join(words) for words in commands],
        diff=dict(before=listing(cluster, clusters, associations),
                  after=listing(cluster, after_clusters, after_associations),
                  before_header=f"slurmdbd: cluster {cluster}",
                  after_header=f"slurmdbd: cluster {cluster}"),
    )


if __name__ == "__main__":
    main()
