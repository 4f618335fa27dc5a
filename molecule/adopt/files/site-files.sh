#!/bin/sh
# Every file, link and directory of the trees the move to Berth touches on a
# node (Slurm's and enroot's configuration, enroot's commands, the plugins
# in /usr/local/lib/slurm), one per line: path, type, mode, owner, group,
# link target and SHA-256. prepare.yml records it before the move; the
# rollback test compares it after the way back.
set -eu
find /etc/slurm /etc/enroot /usr/local/bin /usr/local/lib/slurm -printf '%p %y %m %u %g %l ' \
    -exec sh -c 'if [ -f "$1" ] && [ ! -L "$1" ]; then sha256sum <"$1" | cut -d" " -f1; else echo -; fi' sh {} \; |
    LC_ALL=C sort
