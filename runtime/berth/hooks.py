"""hooks.d: executables run before the container command.

Order: `$ENROOT_SYSCONF_PATH/hooks.d/*.sh` sorted, then
`$ENROOT_CONFIG_PATH/hooks.d/*.sh` sorted. A file without the execute bit
is skipped (`chmod -x` disables a hook). Each hook runs as root of a new
user namespace mapped onto the caller (so it may mount into the root, and
write where the caller may) and in the new mount namespace, but still sees
the host's filesystem, with the caller's environment, the container
environment, every ENROOT_* setting and:
  ENROOT_PID        pid of the process that becomes the container
  ENROOT_ROOTFS     host path of the container root
  ENROOT_MOUNTS     a file the hook may append fstab lines to
  ENROOT_ENVIRON    a file the hook may append KEY=VALUE lines to
  BERTH_RUNTIME_DIR a private scratch directory removed when the container ends
  BERTH_UID, BERTH_GID  the ids the container's processes will have inside
A hook that exits non-zero aborts the start. Its output goes to stderr.
"""

import os
import subprocess
import sys

from berth.config import files_in
from berth.errors import BerthError


def find(cfg):
    hooks = []
    for base in (cfg["ENROOT_SYSCONF_PATH"], cfg["ENROOT_CONFIG_PATH"]):
        hooks += [p for p in files_in(f"{base}/hooks.d", ".sh") if os.access(p, os.X_OK)]
    return hooks


def run(hooks, env):
    for hook in hooks:
        try:
            # stdout goes to stderr: berth's stdout may be the --detach pid channel.
            status = subprocess.run([hook], env=env, stdin=subprocess.DEVNULL,
                                    stdout=sys.stderr.fileno(), check=False).returncode
        except OSError as e:
            raise BerthError(f"hook {hook}: cannot run: {e.strerror}") from None
        if status:
            raise BerthError(f"hook {hook} failed with exit status {status}")
