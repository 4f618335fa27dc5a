#!/usr/bin/env bash
# Build the node image the Molecule scenarios and the demo cluster start from,
# offline from Debian's mirror: debootstrap minbase, then systemd + python3.
# One image per Debian suite, chosen by BERTH_NODE_SUITE (bookworm, the
# default, or trixie); it is tagged berth/node:SUITE (BERTH_NODE_IMAGE
# overrides the tag), with its minbase beside it as berth/node:SUITE-minbase.
# Skips the build when the image exists and was built from this recipe (its
# label berth.recipe), and the debootstrap when the minbase exists (pass
# --rebuild to redo both).
# The apt lists are dropped and dated 1970, so the roles' cache_valid_time
# refreshes them on first use, as on a real node with stale lists.
# dpkg does not fsync what it unpacks (force-unsafe-io, as in Docker's own
# Debian images): a node container that crashes is made again, never
# repaired, and the clusters' package installs take a fifth less time.
set -euo pipefail
SUITE=${BERTH_NODE_SUITE:-bookworm}
case "$SUITE" in
    bookworm|trixie) ;;
    *) echo "base-image: BERTH_NODE_SUITE=$SUITE: not bookworm or trixie" >&2; exit 2 ;;
esac
IMAGE=${BERTH_NODE_IMAGE:-berth/node:$SUITE}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}

recipe=$(cat <<DOCKERFILE
FROM $IMAGE-minbase
ENV DEBIAN_FRONTEND=noninteractive container=docker
RUN echo force-unsafe-io >/etc/dpkg/dpkg.cfg.d/unsafe-io \
 && apt-get update \
 && apt-get install -y --no-install-recommends systemd systemd-sysv dbus python3 \
      python3-apt iproute2 procps ca-certificates sudo kmod \
 && apt-get clean && rm -rf /var/lib/apt/lists/* \
 && touch -d @0 /var/lib/apt/lists \
 && systemctl mask getty@tty1.service console-getty.service systemd-logind.service \
      systemd-remount-fs.service
STOPSIGNAL SIGRTMIN+3
CMD ["/lib/systemd/systemd"]
DOCKERFILE
)
stamp=$(sha256sum <<<"$recipe" | cut -c1-16)
if [[ "${1:-}" != "--rebuild" ]] && [[ "$(docker image inspect \
        -f '{{index .Config.Labels "berth.recipe"}}' "$IMAGE" 2>/dev/null)" == "$stamp" ]]; then
    echo "base-image: $IMAGE present"
    exit 0
fi

work=$(mktemp -d /var/tmp/berth-base.XXXXXX)
trap 'rm -rf "$work"' EXIT
if [[ "${1:-}" == "--rebuild" ]] || ! docker image inspect "$IMAGE-minbase" >/dev/null 2>&1; then
    echo "base-image: debootstrap $SUITE (minbase)"
    debootstrap --variant=minbase "$SUITE" "$work/root" "$MIRROR" >"$work/debootstrap.log" 2>&1 \
        || { tail -20 "$work/debootstrap.log" >&2; exit 1; }
    tar -C "$work/root" -c . | docker import - "$IMAGE-minbase" >/dev/null
fi

printf '%s\nLABEL berth.recipe=%s\n' "$recipe" "$stamp" >"$work/Dockerfile"
echo "base-image: adding systemd and python3"
docker build -q -t "$IMAGE" "$work" >/dev/null
echo "base-image: built $IMAGE"
