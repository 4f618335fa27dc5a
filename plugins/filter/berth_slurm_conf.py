"""What a slurm.conf change needs from the running daemons (Slurm 22.05).

berth_slurm_conf_restart          (old text, new text) -> ['SelectType', ...]:
                                  the keys whose change a restart must apply
berth_slurm_conf_restart_daemons  (old text, new text) -> {'slurmctld': [keys],
                                  'slurmd': [keys]}: which daemon each needs,
                                  only daemons that need one

Everything else in slurm.conf is applied by `scontrol reconfigure`: slurmctld
reads its file again and tells every slurmd to read theirs; running jobs go on.

The rule, from Slurm 22.05's own manuals (slurm.conf(5) and scontrol(1) of
Debian 12's 22.05.8, read for this filter):
- a change takes effect on a restart, on SIGHUP or on `scontrol reconfigure`,
  unless the parameter's entry says otherwise. The entries that say a restart
  is needed, and of which daemon: AccountingStorageEnforce, CredType,
  JobContainerType, MaxJobCount, MaxNodeCount, PowerPlugin, ProctrackType,
  SchedulerType, SelectTypeParameters, SlurmctldHost, SlurmctldParameters,
  SlurmctldPort, SlurmdPort, StateSaveLocation and SchedulerParameters'
  no_backup_scheduling (slurmctld); CoreSpecPlugin (slurmd); GresTypes,
  PluginDir, SelectType (both); AuthType and SwitchType (every daemon and
  command);
- nodes added to or removed from the cluster, or a node's definition changed
  (its processor count, say), need slurmctld and every slurmd restarted;
  partitions are rebuilt from the file by a reconfigure (ReconfigFlags),
  and a partition removed while jobs use it has those jobs cancelled, by a
  reconfigure as by a restart: no choice here saves them;
- moving the controller (SlurmctldHost) means stopping and starting every
  daemon (RELOCATING CONTROLLERS).
Beyond what the manual spells out, a daemon loads its plugins once, when it
starts: every other key that names plugins (ending in Type, Types, Plugin or
Plugins) is taken to need a restart of both daemons, except those only
slurmctld loads (accounting storage, job completion, job submit, priority,
preemption, burst buffer, MCS, alternative authentication), which restart
slurmctld alone, and CliFilterPlugins, which each command loads as it runs.
Where the manual names slurmctld for a plugin that slurmd loads too
(CredType and its older name CryptoType, JobContainerType, ProctrackType),
both restart: a restart never
costs a running job, a missed one leaves the old plugin in place. SlurmUser
and SlurmdUser are the users the daemons run as, which only a start sets;
the controller's address and ports (SlurmctldHost, SlurmctldPort, SlurmdPort)
restart both, as the daemons on either end must agree on them.
PlugStackConfig is no such key: srun, sbatch and each step's slurmstepd read
the SPANK stack when they start.

An Include line counts as a change needing both restarts when it changes,
since what the included file holds is not in the text compared.
"""

import re

from ansible.errors import AnsibleFilterError

SLURMCTLD = "slurmctld"
SLURMD = "slurmd"
BOTH = (SLURMCTLD, SLURMD)

# Keys (lower case) whose change needs a restart: their spelling, and which
# daemons. Keys not here that name plugins fall to the generic rule below.
_RESTART = {name.lower(): (name, daemons) for name, daemons in (
    ("AccountingStorageEnforce", (SLURMCTLD,)),
    ("AccountingStorageType", (SLURMCTLD,)),
    ("AuthAltTypes", (SLURMCTLD,)),
    ("AuthType", BOTH),
    ("BackupAddr", BOTH),
    ("BackupController", BOTH),
    ("BurstBufferType", (SLURMCTLD,)),
    ("ControlAddr", BOTH),
    ("ControlMachine", BOTH),
    ("CoreSpecPlugin", (SLURMD,)),
    ("CredType", BOTH),
    ("CryptoType", BOTH),
    ("GresTypes", BOTH),
    ("JobCompType", (SLURMCTLD,)),
    ("JobContainerType", BOTH),
    ("JobSubmitPlugins", (SLURMCTLD,)),
    ("MaxJobCount", (SLURMCTLD,)),
    ("MaxNodeCount", (SLURMCTLD,)),
    ("MCSPlugin", (SLURMCTLD,)),
    ("PluginDir", BOTH),
    ("PowerPlugin", (SLURMCTLD,)),
    ("PreemptType", (SLURMCTLD,)),
    ("PriorityType", (SLURMCTLD,)),
    ("ProctrackType", BOTH),
    ("SchedulerType", (SLURMCTLD,)),
    ("SelectType", BOTH),
    ("SelectTypeParameters", (SLURMCTLD,)),
    ("SlurmctldHost", BOTH),
    ("SlurmctldParameters", (SLURMCTLD,)),
    ("SlurmctldPort", BOTH),
    ("SlurmdPort", BOTH),
    ("SlurmdUser", (SLURMD,)),
    ("SlurmUser", (SLURMCTLD,)),
    ("StateSaveLocation", (SLURMCTLD,)),
    ("SwitchType", BOTH),
    ("TaskPlugin", BOTH),
    ("TopologyPlugin", BOTH),
)}

# Plugin keys that no daemon loads: each command reads them when it runs.
_NO_DAEMON = {"clifilterplugins"}
_PLUGIN_KEY = re.compile(r"(types?|plugins?)$")

# Lines that describe one record each rather than setting global keys.
_NODE_RECORDS = {"nodename", "frontendname"}
_OTHER_RECORDS = {"partitionname", "nodeset", "downnodes"}

_PAIR = re.compile(r'([^\s=]+)=("[^"]*"|\S*)')
_INCLUDE = re.compile(r"include\s+(\S.*)$", re.I)


def _lines(text):
    """Logical lines: comments ('#' up to the end, unless escaped as '\\#')
    dropped, a line ending in a backslash joined with the next."""
    joined, pending = [], ""
    for raw in text.splitlines():
        line = re.split(r"(?<!\\)#", raw, maxsplit=1)[0].rstrip()
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = (pending + line).strip()
        pending = ""
        if line:
            joined.append(line)
    if pending.strip():
        joined.append(pending.strip())
    return joined


def _pairs(line):
    return [(key, value[1:-1] if value.startswith('"') else value)
            for key, value in _PAIR.findall(line)]


def _parse(text, which):
    """(global keys {lower: (spelling, [values])}, node records, include lines).
    A key may be given more than once (SlurmctldHost for a backup): all count."""
    if text is None:
        text = ""
    if not isinstance(text, str):
        raise AnsibleFilterError(
            f"berth_slurm_conf_restart: the {which} slurm.conf must be text, "
            f"got {type(text).__name__}")
    settings, nodes, includes = {}, [], []
    for line in _lines(text):
        include = _INCLUDE.match(line)
        if include:
            includes.append(include.group(1).strip())
            continue
        pairs = _pairs(line)
        if not pairs:
            continue
        first = pairs[0][0].lower()
        if first in _NODE_RECORDS:
            # one node (or range of nodes) per line: its name, then its
            # attributes, whose order on the line does not matter
            nodes.append((first, pairs[0][1],
                          tuple(sorted((key.lower(), value) for key, value in pairs[1:]))))
        elif first in _OTHER_RECORDS:
            continue
        else:
            for key, value in pairs:
                settings.setdefault(key.lower(), (key, []))[1].append(value)
    return settings, nodes, includes


def _no_backup_scheduling(values):
    return "no_backup_scheduling" in [word.strip().lower()
                                      for value in values or [] for word in value.split(",")]


def berth_slurm_conf_restart_daemons(old, new):
    """{daemon: [keys]} for the daemons a change from `old` to `new` must restart."""
    old_settings, old_nodes, old_includes = _parse(old, "old")
    new_settings, new_nodes, new_includes = _parse(new, "new")
    needs = {}

    def need(key, daemons):
        for daemon in daemons:
            needs.setdefault(daemon, set()).add(key)

    if old_nodes != new_nodes:
        need("NodeName", BOTH)
    if old_includes != new_includes:
        need("Include", BOTH)
    for lower in sorted(set(old_settings) | set(new_settings)):
        spelled, before = old_settings.get(lower, (None, None))
        spelled, after = new_settings.get(lower, (spelled, None))
        if before == after:
            continue
        if lower in _RESTART:
            need(*_RESTART[lower])
        elif lower == "schedulerparameters":
            if _no_backup_scheduling(before) != _no_backup_scheduling(after):
                need("SchedulerParameters", (SLURMCTLD,))
        elif _PLUGIN_KEY.search(lower) and lower not in _NO_DAEMON:
            need(spelled, BOTH)
    return {daemon: sorted(keys) for daemon, keys in sorted(needs.items())}


def berth_slurm_conf_restart(old, new):
    """The keys whose change from `old` to `new` only a daemon restart applies."""
    daemons = berth_slurm_conf_restart_daemons(old, new)
    return sorted({key for keys in daemons.values() for key in keys})


class FilterModule:
    def filters(self):
        return {
            "berth_slurm_conf_restart": berth_slurm_conf_restart,
            "berth_slurm_conf_restart_daemons": berth_slurm_conf_restart_daemons,
        }
