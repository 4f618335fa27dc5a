#!/usr/bin/env bash
# Start Debian's dockerd if no daemon answers; test-net ranges only, so no
# container ever takes an address from the private ranges.
#
#   start-dockerd.sh            the host's daemon (the demo, the Debian 12 cluster)
#   start-dockerd.sh --beside   a second daemon, in a network namespace of its
#                               own (berth-beside), for a cluster beside the
#                               first: the scenario's container and network
#                               names, addresses and iptables rules are then
#                               its own. Prints the DOCKER_HOST that reaches
#                               it; it reaches Debian's mirror through the
#                               host, by a veth pair on 198.18.255.0/30.
set -euo pipefail
DOCKER=${DOCKER:-/usr/bin/docker}
BESIDE=berth-beside
BESIDE_SOCKET=/run/$BESIDE-docker.sock

wait_for() {  # wait_for LOG DOCKER-ARGS...: until `docker info` answers
    local log=$1
    shift
    for _ in $(seq 60); do
        "$DOCKER" "$@" info >/dev/null 2>&1 && return 0
        sleep 1
    done
    echo "start-dockerd: dockerd did not answer within 60 s; see $log" >&2
    return 1
}

if [[ "${1:-}" != --beside ]]; then
    "$DOCKER" info >/dev/null 2>&1 && exit 0
    log=/var/log/berth-dockerd.log
    setsid /usr/sbin/dockerd --bip 198.18.0.1/24 \
        --default-address-pool base=198.19.0.0/16,size=24 >"$log" 2>&1 </dev/null &
    wait_for "$log"
    exit
fi

echo "unix://$BESIDE_SOCKET"
"$DOCKER" -H "unix://$BESIDE_SOCKET" info >/dev/null 2>&1 && exit 0
if [[ ! -e /run/netns/$BESIDE ]]; then
    ip netns add "$BESIDE"
    ip link add "$BESIDE" type veth peer name uplink netns "$BESIDE"
    ip addr add 198.18.255.1/30 dev "$BESIDE"
    ip link set "$BESIDE" up
    ip -n "$BESIDE" addr add 198.18.255.2/30 dev uplink
    ip -n "$BESIDE" link set uplink up
    ip -n "$BESIDE" link set lo up
    ip -n "$BESIDE" route add default via 198.18.255.1
fi
# the namespace's traffic leaves through the host, as its containers' leaves it
sysctl -qw net.ipv4.ip_forward=1
for rule in "FORWARD -i $BESIDE -j ACCEPT" \
            "FORWARD -o $BESIDE -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT"; do
    # shellcheck disable=SC2086 # a rule is words
    iptables -C $rule 2>/dev/null || iptables -I $rule
done
iptables -t nat -C POSTROUTING -s 198.18.255.0/30 -j MASQUERADE 2>/dev/null \
    || iptables -t nat -A POSTROUTING -s 198.18.255.0/30 -j MASQUERADE
# nsenter, not `ip netns exec`: that one remounts /sys, and dockerd needs the
# host's cgroup tree under it
log=/var/log/$BESIDE-dockerd.log
setsid nsenter --net="/run/netns/$BESIDE" /usr/sbin/dockerd -H "unix://$BESIDE_SOCKET" \
    --data-root "/var/lib/$BESIDE-docker" --exec-root "/run/$BESIDE-docker" \
    --pidfile "/run/$BESIDE-docker.pid" --bip 198.18.1.1/24 \
    --default-address-pool base=198.19.0.0/16,size=24 >"$log" 2>&1 </dev/null &
wait_for "$log" -H "unix://$BESIDE_SOCKET"
