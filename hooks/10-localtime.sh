#!/bin/sh
# Berth standard hook: the container keeps the host's time zone.
# nofail: a read-only image whose /etc/localtime points at a missing
# zoneinfo file keeps its own setting.
set -eu

[ -e /etc/localtime ] || exit 0
echo "/etc/localtime /etc/localtime none bind,ro,x-create=file,nofail" >> "$ENROOT_MOUNTS"
