#!/usr/bin/env bash
# The scale test bed: the controller (also the login node and the registry
# host, as berth-ctl is in molecule/multinode), a stand-in public registry
# and N compute nodes (2..32), from the multinode scenario's node image and
# container options, set up by its prepare.yml and deployed by site.yml with
# the shared image store on. Runs beside the demo and CI clusters: its
# containers are berth-scale-*, on networks of its own, its /shared is
# .cache/shared/scale. On its network the controller is also called
# berth-ctl and the upstream berth-upstream, the names
# inventories/local/group_vars gives the registries.
#   bash scripts/scale.sh N            create (or grow to) N compute nodes, prepare, site.yml
#   bash scripts/scale.sh create N     the containers alone (missing ones), and the inventory
#   bash scripts/scale.sh prepare      the scenario's test fixtures (prepare.yml)
#   bash scripts/scale.sh site [ARGS]  site.yml with ARGS (ansible-playbook's)
#   bash scripts/scale.sh memory       each node's memory use (docker stats)
#   bash scripts/scale.sh destroy      remove the containers, networks and /shared
# Memory limits (docker --memory): BERTH_SCALE_NODE_MEMORY per compute node
# (default 512m), BERTH_SCALE_CTL_MEMORY for the controller (2g); 32 nodes
# then take at most 16 GiB + 2.4 GiB. create raises the host's
# fs.inotify.max_user_instances to 8192 where it is lower (each node's
# systemd takes some; 128, the kernel's default, holds 24 nodes).
# Ansible: BERTH_ANSIBLE_STRATEGY (mitogen_linear, as the scenario),
# BERTH_SCALE_FORKS (default 40: every host at once up to N=32).
# What site.yml and prepare.yml run from: a snapshot of HEAD (git archive,
# made by create), so that edits in the working tree while the bed is up
# change nothing on it (a no-op run stays one); BERTH_SCALE_TREE=worktree
# runs them from the working tree itself.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="${BERTH_DEV_VENV:-/opt/berth-dev/venv}/bin:$PATH"

PREFIX=berth-scale
NET=$PREFIX-net
UPSTREAM_NET=$PREFIX-upstream-net
SUITE=${BERTH_NODE_SUITE:-bookworm}
IMAGE=berth/node:$SUITE
SHARED=$PWD/.cache/shared/scale
WORK=$PWD/.cache/scale
INVENTORY=$WORK/hosts.yml
if [[ "${BERTH_SCALE_TREE:-HEAD}" == worktree ]]; then TREE=$PWD; else TREE=$WORK/tree; fi
NODE_MEMORY=${BERTH_SCALE_NODE_MEMORY:-512m}
CTL_MEMORY=${BERTH_SCALE_CTL_MEMORY:-2g}
UPSTREAM_MEMORY=384m
INOTIFY_INSTANCES=8192  # the host's fs.inotify.max_user_instances, at least

# molecule/multinode/molecule.yml's options for every node
node_options=(
    --cgroupns private
    --cap-add SYS_ADMIN --cap-add NET_ADMIN --cap-add SYS_PTRACE --cap-add SYS_NICE
    --cap-add MKNOD --cap-add SYS_CHROOT
    --security-opt seccomp=unconfined --security-opt apparmor=unconfined
    --tmpfs /run --tmpfs /run/lock --tmpfs /tmp
    --env container=docker
)
slurm_options=(
    --device /dev/fuse --device /dev/loop-control
    --volume "$PWD/.cache/images/$SUITE:/opt/berth-images:ro"
    --volume "$PWD/.cache/images:/opt/berth-test-images:ro"
    --volume "$SHARED:/shared:rw"
    --tmpfs "/var/lib/berth:exec,mode=0755"
)
# systemd in a cgroup namespace of its own, on the node's cgroup subtree made
# writable (as the scenario's nodes)
# shellcheck disable=SC2016  # the node's shell expands these
node_init='for tree in /sys/fs/cgroup/*/; do mount -o remount,bind,rw "$tree"; done;
exec /lib/systemd/systemd'

# Where a node's store imports unpack: a directory on the host's disk (a
# real node's local disk), not the scenario's tmpfs, whose pages would count
# against the node's memory limit: the node that imports a new image for
# the whole cluster would need its unpacked size in memory besides.
unpack_dir() {  # NAME
    local dir=$WORK/unpack/$1
    mkdir -p "$dir" && chmod 0700 "$dir"
    echo "--volume=$dir:/var/lib/berth-store:rw"
}

start_node() {  # NAME MEMORY OPTIONS...: run the node unless it exists
    local name=$1 memory=$2
    shift 2
    docker container inspect "$name" >/dev/null 2>&1 && return 0
    docker run -d --name "$name" --hostname "$name" --memory "$memory" --memory-swap "$memory" \
        --label berth.scale=1 "${node_options[@]}" "$@" \
        --stop-signal SIGRTMIN+3 "$IMAGE" sh -c "$node_init" >/dev/null
}

write_inventory() {  # N
    local n=$1 i
    mkdir -p "$WORK"
    ln -sfn "$TREE/inventories/local/group_vars" "$WORK/group_vars"
    {
        echo "# made by scripts/scale.sh for $n compute nodes"
        echo "all:"
        echo "  vars:"
        echo "    ansible_connection: docker"
        echo "    container_runtime_image_store: /shared/berth/images"
        echo "  children:"
        for group in slurm_controller slurm_login registry_cache; do
            echo "    $group: {hosts: {$PREFIX-ctl: }}"
        done
        echo "    registry_upstream: {hosts: {$PREFIX-upstream: }}"
        echo "    slurm_compute:"
        echo "      hosts:"
        for ((i = 1; i <= n; i++)); do echo "        $PREFIX-cn$i:"; done
    } >"$INVENTORY"
}

create() {  # N
    local n=$1 i
    { [[ "$n" =~ ^[0-9]+$ ]] && ((n >= 2 && n <= 32)); } || {
        echo "scale: N must be 2..32, not $n" >&2
        exit 2
    }
    # (made once: test-image.sh rebuilds it when its sources change, which
    # another cluster of this machine may be reading)
    [[ -f .cache/images/$SUITE/mpi-test.tar ]] || bash scripts/test-image.sh >/dev/null
    # each node's systemd holds inotify instances of the host's user root;
    # the kernel's default of 128 stops the 25th node's systemd at its start
    local instances
    instances=$(sysctl -n fs.inotify.max_user_instances)
    if ((instances < INOTIFY_INSTANCES)); then
        echo "scale: fs.inotify.max_user_instances $instances -> $INOTIFY_INSTANCES" \
            "(systemd in each node)" >&2
        sysctl -qw fs.inotify.max_user_instances=$INOTIFY_INSTANCES
    fi
    mkdir -p "$SHARED"
    for net in "$NET" "$UPSTREAM_NET"; do
        docker network inspect "$net" >/dev/null 2>&1 || docker network create "$net" >/dev/null
    done
    # the controller: on both networks, as berth-ctl on the nodes' one
    if ! docker container inspect "$PREFIX-ctl" >/dev/null 2>&1; then
        start_node "$PREFIX-ctl" "$CTL_MEMORY" "${slurm_options[@]}" "$(unpack_dir "$PREFIX-ctl")" \
            --sysctl net.ipv4.ip_unprivileged_port_start=1024 \
            --network "$NET" --network-alias berth-ctl
        docker network connect "$UPSTREAM_NET" "$PREFIX-ctl"
    fi
    start_node "$PREFIX-upstream" "$UPSTREAM_MEMORY" \
        --network "$UPSTREAM_NET" --network-alias berth-upstream
    for ((i = 1; i <= n; i++)); do
        start_node "$PREFIX-cn$i" "$NODE_MEMORY" "${slurm_options[@]}" \
            "$(unpack_dir "$PREFIX-cn$i")" --network "$NET"
    done
    # a smaller N than the bed has: the nodes past N go
    for ((i = n + 1; i <= 32; i++)); do
        docker rm -f "$PREFIX-cn$i" >/dev/null 2>&1 || true
        rm -rf "$WORK/unpack/$PREFIX-cn$i"
    done
    if [[ "$TREE" != "$PWD" ]]; then
        rm -rf "$TREE" && mkdir -p "$TREE"
        git archive HEAD | tar -x -C "$TREE"
        git rev-parse --short HEAD >"$WORK/commit"
    fi
    write_inventory "$n"
    # systemd up in every node before Ansible connects
    for name in $(docker ps -a --filter label=berth.scale=1 --format '{{.Names}}'); do
        for _ in $(seq 60); do
            state=$(docker exec "$name" systemctl is-system-running 2>/dev/null || true)
            [[ "$state" == running || "$state" == degraded ]] && break
            sleep 1
        done
        if [[ "$state" != running && "$state" != degraded ]]; then
            echo "scale: $name: systemd is not up after 60 s (${state:-not running}):" \
                "docker logs $name" >&2
            exit 1
        fi
    done
}

playbook() {  # PLAYBOOK ARGS...
    [[ -f "$INVENTORY" ]] || { echo "scale: no bed (scale.sh create N first)" >&2; exit 2; }
    cd "$TREE"
    ANSIBLE_STRATEGY=${BERTH_ANSIBLE_STRATEGY:-mitogen_linear} \
        ANSIBLE_FORKS=${BERTH_SCALE_FORKS:-40} ANSIBLE_TIMEOUT=60 \
        ANSIBLE_PYTHON_INTERPRETER=/usr/bin/python3 \
        ansible-playbook -i "$INVENTORY" "$@"
}

memory() {
    local -a names
    mapfile -t names < <(docker ps --filter label=berth.scale=1 --format '{{.Names}}')
    docker stats --no-stream --format '{{.Name}} {{.MemUsage}}' "${names[@]}" | sort -V
}

destroy() {
    local names
    local -a each
    names=$(docker ps -a --filter label=berth.scale=1 --format '{{.Names}}')
    mapfile -t each <<<"$names"
    [[ -z "$names" ]] || docker rm -f "${each[@]}" >/dev/null
    for net in "$NET" "$UPSTREAM_NET"; do
        docker network rm "$net" >/dev/null 2>&1 || true
    done
    rm -rf "$SHARED" "$WORK"
}

case "${1:-}" in
    destroy) destroy ;;
    create) create "${2:?scale: create N}" ;;
    prepare) playbook molecule/multinode/prepare.yml ;;
    site) shift; playbook site.yml "$@" ;;
    memory) memory ;;
    [0-9]*)
        create "$1"
        playbook molecule/multinode/prepare.yml
        playbook site.yml
        memory
        ;;
    *)
        echo "usage: scale.sh N | create N | prepare | site [ARGS] | memory | destroy" >&2
        exit 2
        ;;
esac
