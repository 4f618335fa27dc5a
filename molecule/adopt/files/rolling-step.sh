#!/bin/sh
# The step of prepare.yml's job across the move, in pyxis's container on
# berth-adopt-cn2: a numbered line a second until the verify step writes
# /rolling/stop, at most 900 (a bound, so a broken verify cannot leave it
# running); then the image's name, from inside the container.
i=0
while [ ! -e /rolling/stop ] && [ "$i" -lt 900 ]; do
    i=$((i + 1))
    echo "tick $i"
    sleep 1
done
[ -e /rolling/stop ] && echo "stopped after tick $i"
grep '^VARIANT_ID=' /etc/os-release
