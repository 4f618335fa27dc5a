#!/usr/bin/env bash
# Check the AppArmor profile the container_runtime role installs (its
# template rendered with the role's defaults) with apparmor_parser -Q:
# parsed and compiled, never loaded. The profile needs AppArmor 4 (the
# userns rule, abi 4.0), which Debian 12's parser (3.0) does not know, so
# the check runs Debian 13's parser in a container made from the trixie
# node image's minbase (scripts/base-image.sh), built once and kept as
# berth/apparmor:trixie. No kernel here has the userns restriction, so
# whether the loaded profile lets berth in is not checked on this bed.
set -euo pipefail
cd "$(dirname "$0")/.."
IMAGE=berth/apparmor:trixie
PYTHON=${PYTHON:-python3}
recipe=$(cat <<'DOCKERFILE'
FROM berth/node:trixie-minbase
RUN apt-get update -qq \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends apparmor \
 && rm -rf /var/lib/apt/lists/*
DOCKERFILE
)
stamp=$(sha256sum <<<"$recipe" | cut -c1-16)
if [[ "$(docker image inspect -f '{{index .Config.Labels "berth.recipe"}}' "$IMAGE" \
        2>/dev/null)" != "$stamp" ]]; then
    docker image inspect berth/node:trixie-minbase >/dev/null 2>&1 \
        || BERTH_NODE_SUITE=trixie bash scripts/base-image.sh
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    printf '%s\nLABEL berth.recipe=%s\n' "$recipe" "$stamp" >"$work/Dockerfile"
    docker build -q -t "$IMAGE" "$work" >"$work/build.log" 2>&1 \
        || { tail -20 "$work/build.log" >&2; exit 1; }
fi
profile=$(mktemp)
trap 'rm -f "$profile"; [[ -z ${work:-} ]] || rm -rf "$work"' EXIT
"$PYTHON" - "$profile" <<'RENDER'
import sys

import jinja2
import yaml

role = "roles/container_runtime"
defaults = yaml.safe_load(open(f"{role}/defaults/main.yml"))
template = jinja2.Environment(undefined=jinja2.StrictUndefined).from_string(
    open(f"{role}/templates/apparmor-berth.j2").read())
with open(sys.argv[1], "w") as f:
    f.write(template.render(defaults, ansible_managed="rendered by scripts/check-apparmor.sh"))
RENDER
chmod 0644 "$profile"
# (its one line on stderr where it succeeds says that this kernel has no
# AppArmor: kept to the failures)
if ! said=$(docker run --rm --network none -v "$profile:/etc/apparmor.d/berth:ro" "$IMAGE" \
        apparmor_parser -Q -K /etc/apparmor.d/berth 2>&1); then
    printf 'check-apparmor: %s\n' "$said" >&2
    exit 1
fi
echo "check-apparmor: roles/container_runtime/templates/apparmor-berth.j2 parses"
