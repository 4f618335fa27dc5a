#!/usr/bin/env bash
# Build the node image molecule/adopt starts from: a Debian 12 node as a site
# runs it before Berth, with Debian's Slurm 22.05 and munge, and pyxis 0.24.0
# and enroot 4.1.2 built from their release tarballs and installed (enroot's
# commands in /usr/local/bin with their file capabilities, its configuration
# in /etc/enroot, pyxis's plugin in /usr/local/lib/slurm). Building here, once,
# keeps the scenario's prepare to configuring the site. The tarballs are read
# from BERTH_UPSTREAM_DIR (default: ../shared/upstream beside the checkout);
# a missing one fails in one line naming it. Tagged berth/adopt-site:bookworm
# (BERTH_ADOPT_IMAGE overrides); skipped when the image exists and was built
# from this recipe and these tarballs (its label berth.recipe).
set -euo pipefail
cd "$(dirname "$0")/.."
UPSTREAM=${BERTH_UPSTREAM_DIR:-../shared/upstream}
IMAGE=${BERTH_ADOPT_IMAGE:-berth/adopt-site:bookworm}
BASE=berth/node:bookworm
PYXIS=pyxis-0.24.0
ENROOT=enroot-4.1.2
for tarball in "$PYXIS" "$ENROOT"; do
    if [[ ! -f $UPSTREAM/$tarball.tar.gz ]]; then
        echo "site-image: $UPSTREAM/$tarball.tar.gz: missing (set BERTH_UPSTREAM_DIR to the directory holding the release tarballs)" >&2
        exit 2
    fi
done
BERTH_NODE_SUITE=bookworm bash scripts/base-image.sh

# enroot without its git submodules: Debian's libbsd and makeself stand in
# for the ones it would build (-o deps), glibc for musl (FORCE_GLIBC).
recipe=$(cat <<DOCKERFILE
FROM $BASE
ENV DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
 && apt-get install -y --no-install-recommends slurmctld slurmd slurm-client munge libpmix2 libpmix-dev \
      libslurm-dev gcc make libc6-dev libbsd-dev makeself jq curl bsdextrautils libcap2-bin \
      squashfs-tools squashfuse fuse-overlayfs pigz zstd parallel file \
 && apt-get clean && rm -rf /var/lib/apt/lists/* && touch -d @0 /var/lib/apt/lists
COPY $PYXIS.tar.gz $ENROOT.tar.gz /usr/src/
RUN cd /usr/src && tar xzf $PYXIS.tar.gz && tar xzf $ENROOT.tar.gz \
 && make -C $PYXIS && install -D -m 0644 $PYXIS/spank_pyxis.so /usr/local/lib/slurm/spank_pyxis.so \
 && mkdir -p $ENROOT/deps/dist/makeself/bin && ln -s /usr/bin/makeself $ENROOT/deps/dist/makeself/bin/enroot-makeself \
 && make -C $ENROOT -o deps FORCE_GLIBC=y prefix=/usr/local sysconfdir=/etc \
      CPPFLAGS="-D_GNU_SOURCE -include bsd/string.h" LDLIBS="-lbsd" DESTDIR=/usr/src/dest install \
 && sed -i 's|/usr/src/dest||g' /usr/src/dest/usr/local/bin/enroot /usr/src/dest/etc/enroot/enroot.conf \
 && cp -a /usr/src/dest/. / \
 && setcap cap_sys_admin,cap_mknod+pe /usr/local/bin/enroot-aufs2ovlfs \
 && setcap cap_sys_admin+pe /usr/local/bin/enroot-mksquashovlfs \
 && rm -rf /usr/src/$PYXIS /usr/src/$ENROOT /usr/src/dest
DOCKERFILE
)
stamp=$( (echo "$recipe"; cat "$UPSTREAM/$PYXIS.tar.gz" "$UPSTREAM/$ENROOT.tar.gz") | sha256sum | cut -c1-16)
if [[ "$(docker image inspect -f '{{index .Config.Labels "berth.recipe"}}' "$IMAGE" 2>/dev/null)" == "$stamp" ]]; then
    echo "site-image: $IMAGE present"
    exit 0
fi
work=$(mktemp -d /var/tmp/berth-site-image.XXXXXX)
trap 'rm -rf "$work"' EXIT
cp "$UPSTREAM/$PYXIS.tar.gz" "$UPSTREAM/$ENROOT.tar.gz" "$work/"
printf '%s\nLABEL berth.recipe=%s\n' "$recipe" "$stamp" >"$work/Dockerfile"
echo "site-image: building $IMAGE (Debian 12's Slurm, pyxis and enroot from $UPSTREAM)"
docker build -q -t "$IMAGE" "$work" >/dev/null
