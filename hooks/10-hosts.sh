#!/bin/sh
# Berth standard hook: the host's name and name service files, read-only, as
# enroot's default mounts give them: a container resolves the cluster's
# hosts (the Slurm controller, the other nodes) as the node does. nofail: a
# node without one of them starts containers with the image's.
set -eu

for file in /etc/hosts /etc/hostname /etc/resolv.conf /etc/machine-id; do
    echo "$file $file none bind,ro,nosuid,nodev,noexec,x-create=file,nofail" >>"$ENROOT_MOUNTS"
done
