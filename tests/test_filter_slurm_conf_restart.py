"""plugins/filter/berth_slurm_conf.py: which slurm.conf changes need a daemon
restart in Slurm 22.05, and which one `scontrol reconfigure` applies.

The base file is the one roles/slurm/templates/slurm.conf.j2 writes for a
two-node cluster; each case changes it the way an inventory change would."""

import importlib.util
from pathlib import Path

import pytest
from ansible.errors import AnsibleFilterError

REPO = Path(__file__).resolve().parent.parent

_spec = importlib.util.spec_from_file_location(
    "berth_slurm_conf", REPO / "plugins" / "filter" / "berth_slurm_conf.py")
conf = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(conf)

BASE = """\
# Ansible managed
ClusterName=berth
SlurmctldHost=head01
AuthType=auth/munge
CryptoType=crypto/munge
SlurmUser=slurm
StateSaveLocation=/var/lib/slurm/slurmctld
SlurmdSpoolDir=/var/lib/slurm/slurmd
SlurmctldLogFile=/var/log/slurm/slurmctld.log
MpiDefault=pmix
ProctrackType=proctrack/cgroup
TaskPlugin=task/affinity,task/cgroup
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
ReturnToService=2
PlugStackConfig=/etc/slurm/plugstack.conf
GresTypes=gpu

# Compute nodes
NodeName=dgx01 CPUs=256 Sockets=2 CoresPerSocket=64 ThreadsPerCore=2 RealMemory=2062913 Gres=gpu:h100:8 State=UNKNOWN
NodeName=dgx02 CPUs=256 Sockets=2 CoresPerSocket=64 ThreadsPerCore=2 RealMemory=2062913 Gres=gpu:h100:8 State=UNKNOWN
PartitionName=batch Nodes=dgx01,dgx02 Default=YES MaxTime=INFINITE State=UP
"""


def changed(old_line, new_line, text=BASE):
    assert old_line in text, old_line
    return text.replace(old_line, new_line)


def added(line, text=BASE):
    return text.replace("GresTypes=gpu\n", f"GresTypes=gpu\n{line}\n")


def restart(new, old=BASE):
    return conf.berth_slurm_conf_restart(old, new)


def daemons(new, old=BASE):
    return conf.berth_slurm_conf_restart_daemons(old, new)


def test_the_same_file_needs_nothing():
    assert restart(BASE) == []
    assert daemons(BASE) == {}


@pytest.mark.parametrize("new", [
    added("KillWait=45"),
    added("MessageTimeout=30"),
    added("DebugFlags=Steps"),
    changed("ReturnToService=2", "ReturnToService=1"),
    changed("MpiDefault=pmix", "MpiDefault=pmi2"),
    changed("SlurmctldLogFile=/var/log/slurm/slurmctld.log", "SlurmctldLogFile=/var/log/ctld.log"),
    # srun and each step's slurmstepd read the SPANK stack as they start
    changed("PlugStackConfig=/etc/slurm/plugstack.conf", "PlugStackConfig=/etc/slurm/other.conf"),
    # partitions are rebuilt from the file on a reconfigure (ReconfigFlags)
    changed("MaxTime=INFINITE", "MaxTime=1-00:00:00"),
    BASE + "PartitionName=debug Nodes=dgx01 MaxTime=30\n",
    # scheduler options other than no_backup_scheduling
    added("SchedulerParameters=bf_continue,bf_interval=60"),
    # each command loads its cli_filter plugins as it runs
    added("CliFilterPlugins=cli_filter/lua"),
    # comments, blank lines and the order of a node line's attributes
    BASE.replace("# Compute nodes\n", "\n# the compute nodes, from facts\n\n"),
    changed("CPUs=256 Sockets=2 CoresPerSocket=64 ThreadsPerCore=2 RealMemory=2062913 Gres=gpu:h100:8 State=UNKNOWN\nNodeName=dgx02",
            "Sockets=2 CPUs=256 CoresPerSocket=64 ThreadsPerCore=2 Gres=gpu:h100:8 RealMemory=2062913 State=UNKNOWN\nNodeName=dgx02"),
])
def test_reconfigure_is_enough(new):
    assert new != BASE
    assert restart(new) == []
    assert daemons(new) == {}


@pytest.mark.parametrize("new, keys, ctld, slurmd", [
    # nodes added, removed or redefined: slurmctld and every slurmd
    (BASE.replace("NodeName=dgx02", "NodeName=dgx03"), ["NodeName"], True, True),
    (BASE + "NodeName=dgx03 CPUs=8 State=UNKNOWN\n", ["NodeName"], True, True),
    ("\n".join(line for line in BASE.splitlines() if not line.startswith("NodeName=dgx02")),
     ["NodeName"], True, True),
    (changed("NodeName=dgx01 CPUs=256", "NodeName=dgx01 CPUs=128"), ["NodeName"], True, True),
    (changed("RealMemory=2062913 Gres=gpu:h100:8 State=UNKNOWN\nNodeName=dgx02",
             "RealMemory=2000000 Gres=gpu:h100:8 State=UNKNOWN\nNodeName=dgx02"), ["NodeName"], True, True),
    # the manual's own list
    (changed("SlurmctldHost=head01", "SlurmctldHost=head02"), ["SlurmctldHost"], True, True),
    (changed("AuthType=auth/munge", "AuthType=auth/none"), ["AuthType"], True, True),
    (changed("CryptoType=crypto/munge", "CryptoType=crypto/openssl"), ["CryptoType"], True, True),
    (changed("SelectType=select/cons_tres", "SelectType=select/linear"), ["SelectType"], True, True),
    (changed("SelectTypeParameters=CR_Core", "SelectTypeParameters=CR_Core_Memory"),
     ["SelectTypeParameters"], True, False),
    (changed("ProctrackType=proctrack/cgroup", "ProctrackType=proctrack/linuxproc"),
     ["ProctrackType"], True, True),
    (changed("TaskPlugin=task/affinity,task/cgroup", "TaskPlugin=task/cgroup"), ["TaskPlugin"], True, True),
    (changed("GresTypes=gpu", "GresTypes=gpu,shard"), ["GresTypes"], True, True),
    (changed("StateSaveLocation=/var/lib/slurm/slurmctld", "StateSaveLocation=/srv/slurmctld"),
     ["StateSaveLocation"], True, False),
    (changed("SlurmUser=slurm", "SlurmUser=root"), ["SlurmUser"], True, False),
    (changed("SchedulerType=sched/backfill", "SchedulerType=sched/builtin"), ["SchedulerType"], True, False),
    (added("SlurmctldPort=6900"), ["SlurmctldPort"], True, True),
    (added("SlurmdPort=6901"), ["SlurmdPort"], True, True),
    (added("SwitchType=switch/hpe_slingshot"), ["SwitchType"], True, True),
    (added("MaxJobCount=50000"), ["MaxJobCount"], True, False),
    (added("AccountingStorageEnforce=associations"), ["AccountingStorageEnforce"], True, False),
    (added("CoreSpecPlugin=core_spec/none"), ["CoreSpecPlugin"], False, True),
    (added("PluginDir=/opt/slurm/lib"), ["PluginDir"], True, True),
    (added("SchedulerParameters=no_backup_scheduling,bf_continue"), ["SchedulerParameters"], True, False),
    # plugins the manual does not mention: loaded once, when the daemon starts
    (added("JobAcctGatherType=jobacct_gather/cgroup"), ["JobAcctGatherType"], True, True),
    (added("AccountingStorageType=accounting_storage/slurmdbd"), ["AccountingStorageType"], True, False),
    # removing a key is a change too
    (BASE.replace("GresTypes=gpu\n", ""), ["GresTypes"], True, True),
    # the spelling of the key does not matter: slurm.conf keys ignore case
    (BASE.replace("SelectType=select/cons_tres", "selecttype=select/linear"), ["SelectType"], True, True),
])
def test_restart_needed(new, keys, ctld, slurmd):
    assert restart(new) == keys
    expected = {}
    if ctld:
        expected["slurmctld"] = keys
    if slurmd:
        expected["slurmd"] = keys
    assert daemons(new) == expected


def test_a_first_run_without_a_file_restarts_both():
    needs = conf.berth_slurm_conf_restart_daemons("", BASE)
    assert "NodeName" in needs["slurmctld"] and "NodeName" in needs["slurmd"]
    assert conf.berth_slurm_conf_restart_daemons(None, BASE) == needs


def test_several_changes_name_each_key_once_per_daemon():
    new = changed("SchedulerType=sched/backfill", "SchedulerType=sched/builtin",
                  changed("TaskPlugin=task/affinity,task/cgroup", "TaskPlugin=task/cgroup",
                          added("KillWait=45")))
    assert restart(new) == ["SchedulerType", "TaskPlugin"]
    assert daemons(new) == {"slurmctld": ["SchedulerType", "TaskPlugin"], "slurmd": ["TaskPlugin"]}


def test_a_second_controller_line_counts():
    with_backup = added("SlurmctldHost=head02")
    assert restart(with_backup) == ["SlurmctldHost"]
    assert restart(changed("SlurmctldHost=head02", "SlurmctldHost=head03", with_backup), old=with_backup) \
        == ["SlurmctldHost"]


def test_continued_lines_and_quoted_values():
    old = BASE + 'NodeName=dgx03 CPUs=8 \\\n  Feature="a b" State=UNKNOWN\n'
    assert restart(BASE + 'NodeName=dgx03 CPUs=8 Feature="a b" State=UNKNOWN\n', old=old) == []
    assert restart(BASE + 'NodeName=dgx03 CPUs=8 \\\n  Feature="a c" State=UNKNOWN\n', old=old) == ["NodeName"]


def test_commented_out_key_is_a_removal():
    assert restart(BASE.replace("SelectType=select/cons_tres", "#SelectType=select/cons_tres")) == ["SelectType"]
    # an escaped '#' is part of the value
    assert restart(added(r"Prolog=/etc/slurm/pro\#log.sh")) == []


def test_include_lines_restart_both():
    assert daemons(BASE + "Include /etc/slurm/nodes.conf\n") == {"slurmctld": ["Include"], "slurmd": ["Include"]}
    assert restart(BASE + "Include /etc/slurm/nodes.conf\n", old=BASE + "include /etc/slurm/nodes.conf\n") == []


@pytest.mark.parametrize("old, new", [(42, BASE), (BASE, ["SelectType=x"])])
def test_non_text_is_refused(old, new):
    with pytest.raises(AnsibleFilterError, match="berth_slurm_conf_restart: the (old|new) slurm.conf must be text"):
        conf.berth_slurm_conf_restart(old, new)


def test_filters_are_registered():
    assert set(conf.FilterModule().filters()) == {"berth_slurm_conf_restart", "berth_slurm_conf_restart_daemons"}
