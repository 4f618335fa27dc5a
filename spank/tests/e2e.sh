#!/usr/bin/env bash
# End to end: spank_berth.so under a real Slurm (slurmctld + slurmd + munge in
# one systemd container made from berth/node:bookworm), jobs run by an
# ordinary user. Proves flag checks before submission, and on the node: the
# runtime calls (import once, create once, start --detach), joining the
# container per task, workdir, env merge, mounts, named containers, save,
# teardown.
#   spank/tests/e2e.sh [fake|real]
# fake (default): spank/tests/fake-berth plays the runtime (its contract only);
# real: the berth runtime from runtime/, installed in the container.
# Needs docker and berth/node:bookworm (scripts/base-image.sh). About 1-2 min
# the first time (it builds bspk/slurm:bookworm), then about 40 s.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
mode=${1:-fake}
image=${BSPK_IMAGE:-bspk/slurm:bookworm}
name=${BSPK_CONTAINER:-bspk-e2e}
work=$(mktemp -d /tmp/bspk-e2e.XXXXXX)
cleanup() { [[ -n ${BSPK_KEEP:-} ]] || docker rm -f "$name" >/dev/null 2>&1 || true; rm -rf "$work"; }
trap cleanup EXIT

if ! docker image inspect "$image" >/dev/null 2>&1; then
    echo "e2e: building $image"
    printf '%s\n' "FROM ${BERTH_NODE_IMAGE:-berth/node:bookworm}" \
        "RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends slurmctld slurmd slurm-client munge squashfs-tools busybox-static libpmix2 libpmix-dev squashfuse fuse-overlayfs uidmap python3-venv python3-setuptools python3-wheel python3-requests python3-tqdm && apt-get clean && rm -rf /var/lib/apt/lists/*" \
        >"$work/Dockerfile"
    docker build -q -t "$image" "$work" >/dev/null
fi

make -s -C "$repo/spank" O="$work" all
docker run -d --name "$name" --hostname bspk-node \
    --cap-add ALL --cap-drop SYS_RESOURCE \
    --security-opt seccomp=unconfined --security-opt apparmor=unconfined \
    --cgroupns=host -v /sys/fs/cgroup:/sys/fs/cgroup:rw --tmpfs /run --tmpfs /run/lock \
    --device /dev/fuse -e container=docker "$image" /lib/systemd/systemd >/dev/null
for _ in $(seq 60); do
    state=$(docker exec "$name" systemctl is-system-running 2>/dev/null || true)
    [[ $state == running || $state == degraded ]] && break
    sleep 1
done

on_node() { docker exec -i "$name" "$@"; }
put() { on_node sh -c "cat > '$1' && chmod $2 '$1'"; }

plugin_dir=/usr/lib/x86_64-linux-gnu/slurm-wlm
put "$plugin_dir/spank_berth.so" 0755 <"$work/spank_berth.so"
if [[ $mode == fake ]]; then
    put /usr/local/bin/berth 0755 <"$here/fake-berth"
else
    # as the container_runtime role does: a venv on the distribution's packages
    # shellcheck disable=SC2016  # the node's shell expands these
    tar -C "$repo/runtime" --exclude=__pycache__ --exclude=tests -c . | on_node sh -ec '
        mkdir -p /opt/berth/src && tar -C /opt/berth/src -x
        python3 -m venv --system-site-packages /opt/berth
        /opt/berth/bin/pip install -q --no-deps --no-index --no-build-isolation /opt/berth/src
        ln -sf /opt/berth/bin/berth /usr/local/bin/berth
        mkdir -p /etc/enroot
        echo "ENROOT_RUNTIME_PATH /run/berth/\${UID}" >/etc/enroot/enroot.conf'
fi

put /etc/slurm/slurm.conf 0644 <<'EOF'
ClusterName=bspk
SlurmctldHost=bspk-node
AuthType=auth/munge
SlurmUser=slurm
StateSaveLocation=/var/lib/slurm/slurmctld
SlurmdSpoolDir=/var/lib/slurm/slurmd
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
SlurmdLogFile=/var/log/slurm/slurmd.log
SlurmctldLogFile=/var/log/slurm/slurmctld.log
PlugStackConfig=/etc/slurm/plugstack.conf
NodeName=bspk-node CPUs=2 State=UNKNOWN
PartitionName=debug Nodes=bspk-node Default=YES MaxTime=INFINITE State=UP
EOF
plugstack() { echo "required $plugin_dir/spank_berth.so runtime_path=/run/berth berth=/usr/local/bin/berth $*" |
    put /etc/slurm/plugstack.conf 0644; }
plugstack

# A tiny image: busybox, a marker file, a workdir.
on_node sh -e <<'EOF'
useradd -m -u 1000 alice
root=/tmp/imgroot
mkdir -p $root/bin $root/usr/bin $root/etc $root/work $root/proc $root/sys $root/dev $root/run $root/tmp $root/mnt $root/home $root/root $root/var
cp /bin/busybox $root/bin/
for applet in sh cat pwd env id ls echo sleep true test mount; do
    ln -s /bin/busybox $root/bin/$applet
    ln -s /bin/busybox $root/usr/bin/$applet
done
echo ID=berth-test >$root/etc/os-release
printf '#!/bin/sh\necho image-only\n' >$root/usr/bin/only-in-image
chmod 0755 $root/usr/bin/only-in-image
mkdir -p $root/etc/berth
cat >$root/etc/berth/image.json <<'JSON'
{"env": ["PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/root", "IMAGE_VAR=from-image",
         "SLURM_JOB_ID=from-image", "LD_LIBRARY_PATH=/image/lib"],
 "entrypoint": null, "cmd": null, "workdir": "/work", "user": "", "source": "e2e", "digest": ""}
JSON
mkdir -p /srv/registry /srv/data
mksquashfs $root /srv/img.sqsh -quiet -noappend -all-root >/dev/null
cp /srv/img.sqsh /srv/registry/image.sqsh
# the same image with an entrypoint that exports a variable and execs "$@"
printf '#!/bin/sh\necho entrypoint says hello\nexport EP_VAR=from-entrypoint\nexec "$@"\n' >$root/usr/bin/ep
chmod 0755 $root/usr/bin/ep
sed -i 's|"entrypoint": null|"entrypoint": ["/usr/bin/ep"]|' $root/etc/berth/image.json
mksquashfs $root /srv/ep.sqsh -quiet -noappend -all-root >/dev/null
echo not-a-squashfs >/srv/bad.sqsh
echo hello-from-host >/srv/data/hello
chmod 0666 /dev/fuse
mkdir -p /var/lib/slurm/slurmctld /var/lib/slurm/slurmd /run/munge /var/log/slurm
chown slurm /var/lib/slurm/slurmctld
systemctl restart munge slurmctld slurmd
for _ in $(seq 30); do sinfo -h -o %T 2>/dev/null | grep -q idle && exit 0; sleep 1; done
echo "e2e: slurm did not come up" >&2; sinfo >&2; exit 1
EOF

failures=0
as_alice() { on_node runuser -u alice -- sh -c "cd /home/alice && $1" 2>&1; }
# as_alice_apart COMMAND: run it as alice, its stdout in $out and its stderr
# in $err. The checks read each stream on its own: a step's two streams
# reach srun apart, so their lines interleave in no fixed order (the
# plugin's "pyxis: imported ..." line may land between two of stdout's).
as_alice_apart() {
    out=$(on_node runuser -u alice -- sh -c "cd /home/alice && $1" 2>"$work/stderr" || true)
    err=$(<"$work/stderr")
}
check() { # description, command, expected substring (of stdout or of stderr)
    local out err
    as_alice_apart "$2"
    if [[ $out == *"$3"* || $err == *"$3"* ]]; then
        echo "ok   $1"
    else
        echo "FAIL $1: '$2' gave:"; printf '%s\n%s\n' "$out" "$err" | sed 's/^/     /'
        failures=$((failures + 1))
    fi
}
absent() { # description, command, substring that must appear in neither stream
    local out err
    as_alice_apart "$2"
    if [[ $out != *"$3"* && $err != *"$3"* ]]; then
        echo "ok   $1"
    else
        echo "FAIL $1: '$2' gave: $out $err"; failures=$((failures + 1))
    fi
}
# the node's state once it settles: "idle" within 30 s, else the last seen
# (a drained node never gets there; "planned" or "completing" soon pass)
# shellcheck disable=SC2016  # run by the node's shell (as_alice_apart)
settled_state='for _ in $(seq 30); do s=$(sinfo -h -o %T); [ "$s" = idle ] && break; sleep 1; done; echo "$s"'
jobs_so_far() { on_node sh -c 'scontrol show jobs -o 2>/dev/null | grep -c JobId= || true'; }
# the exit status the runtime ends a resolve with when asking again will not mend it
status_permanent=$(sed -n 's/^#define BERTH_STATUS_PERMANENT //p' "$repo/spank/answer_status.h")
# submitted IMAGE [VAR=VALUE...]: the command of an srun of IMAGE with the
# role's 5 retries, cut at 10 s; it prints srun's exit status (124: cut),
# how many nodes failed to import it, and the plugin's line at submission
submitted() {
    echo "out=\$(${2:-} ENROOT_TRANSFER_RETRIES=5 ENROOT_ALLOW_HTTP=yes timeout 10 srun --container-image=$1 true 2>&1); rc=\$?; echo \"exit=\$rc imports=\$(echo \"\$out\" | grep -c 'failed to import')\"; echo \"\$out\" | grep -o -e 'spank_berth: --container-image: .*' -e 'spank_berth: warning: cannot resolve .*'"
}

img=--container-image=/srv/img.sqsh
check "image file runs the command inside" "srun $img cat /etc/os-release" "ID=berth-test"
check "cwd is the image workdir" "srun $img pwd" "/work"
check "--container-workdir" "srun $img --container-workdir=/tmp pwd" "/tmp"
check "a missing workdir fails the task naming it" "srun $img --container-workdir=/nope pwd" "--container-workdir: cannot chdir to /nope"
check "command found in the image's PATH" "srun $img only-in-image" "image-only"
check "image env fills in" "srun $img env" "IMAGE_VAR=from-image"
check "image PATH beats the task's" "srun $img env" "PATH=/usr/local/bin:/usr/bin:/bin"
absent "Slurm variables come from the task" "srun $img env" "SLURM_JOB_ID=from-image"
check "the image's value beats the task's" "IMAGE_VAR=task srun $img env" "IMAGE_VAR=from-image"
check "--container-env keeps the task's value" "IMAGE_VAR=task srun $img --container-env=IMAGE_VAR env" "IMAGE_VAR=task"
check "--container-env unset in the task: the image's value" "srun $img --container-env=IMAGE_VAR,X env" "IMAGE_VAR=from-image"
check "BERTH_VERSION marker" "srun $img env" "BERTH_VERSION=0.1.0"
check "tasks run under the container's seccomp filter" "srun $img cat /proc/self/status" $'Seccomp:\t2'
check "a fake root's chgrp succeeds in a task" "srun $img sh -c 'touch /tmp/fakeroot && chgrp 0 /tmp/fakeroot && echo chgrp-ok'" "chgrp-ok"
absent "--container-env keeps the task's PATH" "srun $img --container-env=PATH env" "PATH=/usr/local/bin:/usr/bin:/bin"
absent "the submitter's LANG, LANGUAGE, LC_ALL are dropped" "LANG=xx_YY.UTF-8 LANGUAGE=xx LC_ALL=xx_YY.UTF-8 srun $img env" "xx"
check "--container-env=LANG keeps it" "LANG=xx_YY.UTF-8 srun $img --container-env=LANG env" "LANG=xx_YY.UTF-8"
check "--container-mounts" "srun $img --container-mounts=/srv/data:/data:ro cat /data/hello" "hello-from-host"
check "--container-mounts SRC alone" "srun $img --container-mounts=/srv/data cat /srv/data/hello" "hello-from-host"
check "--container-mounts relative source, from the step's cwd" "mkdir -p rel/sub && echo rel-ok >rel/sub/f && cd rel && srun $img --container-mounts=./sub:/r1,.:/r2:ro cat /r1/f /r2/sub/f" "rel-ok
rel-ok"
check "--container-mounts tmpfs with options" "srun $img --container-mounts=tmpfs:/scratch:size=1M sh -c 'cat /proc/mounts'" "/scratch tmpfs"
check "--container-mounts umount" "srun $img --container-mounts=/srv/data:/data,umount:/data sh -c 'ls /data; echo listed'" "listed"
absent "--container-mounts umount removes the mount" "srun $img --container-mounts=/srv/data:/data,umount:/data ls /data" "hello"
check "--container-mounts relative destination, from the container's root" "srun $img --container-mounts=/srv/data:./data/rel cat /data/rel/hello" "hello-from-host"
check "--container-mounts ./mnt mounts at the container's /mnt" "srun $img --container-mounts=/srv/data:./mnt cat /mnt/hello" "hello-from-host"
check "--container-mounts relative destination escaping the root: refused on the node, named, in enroot's errno words" "srun $img --container-mounts=/srv/data:../up true" "mount destination ../up escapes the container root: Invalid cross-device link"
check "relative --container-workdir, inside the container" "srun $img --container-workdir=tmp sh -c 'echo cwd=\$(pwd)'" "cwd=/tmp"
check "relative --container-workdir: ../ from / is /" "srun $img --container-workdir=../../tmp sh -c 'echo cwd=\$(pwd)'" "cwd=/tmp"
check "PYXIS_CONTAINER_IMAGE acts as the flag" "PYXIS_CONTAINER_IMAGE=/srv/img.sqsh srun cat /etc/os-release" "ID=berth-test"
check "PYXIS_CONTAINER_WORKDIR acts as the flag" "PYXIS_CONTAINER_IMAGE=/srv/img.sqsh PYXIS_CONTAINER_WORKDIR=/tmp srun pwd" "/tmp"
check "a flag wins over its PYXIS_ variable" "PYXIS_CONTAINER_WORKDIR=/tmp srun $img --container-workdir=/etc pwd" "/etc"
check "PYXIS_CONTAINER_MOUNTS" "PYXIS_CONTAINER_MOUNTS=/srv/data:/data srun $img cat /data/hello" "hello-from-host"
check "sbatch with PYXIS_CONTAINER_IMAGE: the batch script runs in the image" "PYXIS_CONTAINER_IMAGE=/srv/img.sqsh sbatch -W -o pxs.txt --wrap 'cat /etc/os-release' >/dev/null && cat pxs.txt" "ID=berth-test"
check "two tasks, one container each node" "srun -n2 $img cat /etc/os-release | grep -c berth-test" "2"
check "relative image path" "cp /srv/img.sqsh rel.sqsh && srun --container-image=./rel.sqsh cat /etc/os-release" "ID=berth-test"

check "PMIx server dir visible at the same path" "srun --mpi=pmix $img sh -c 'test -d \$PMIX_SERVER_TMPDIR && echo pmix-dir-ok'" "pmix-dir-ok"
check "PMIX_MCA_* forms passed" "srun --mpi=pmix $img env" "PMIX_MCA_gds="

check "sbatch --container-image: the batch script runs in the image" "sbatch -W -o out.txt $img --wrap 'cat /etc/os-release' >/dev/null && cat out.txt" "ID=berth-test"
check "sbatch --export=NONE --container-image: the batch script still runs in the image" "sbatch -W -o none.txt --export=NONE $img --wrap 'cat /etc/os-release' >/dev/null && cat none.txt" "ID=berth-test"
# what an srun inside reads its flags from, under pyxis's name
check "sbatch flags reach the batch script's environment for its sruns" "sbatch -W -o opt.txt $img --wrap 'echo opt=\$SLURM_SPANK__SLURM_SPANK_OPTION_pyxis_container_image' >/dev/null && cat opt.txt" "opt=/srv/img.sqsh"
check "sbatch without flags: the script on the host, its srun steps in the image" "sbatch -W -o host.txt --wrap 'test -x /usr/bin/sbatch && echo on-host; srun $img cat /etc/os-release' >/dev/null && cat host.txt" "on-host
ID=berth-test"
# a step's container joined from another step of the job, by JOBID.STEPID
check "an unnamed step's container joined as JOBID.STEPID" "sbatch -W -o join.txt --wrap 'srun $img --container-remap-root sh -c \"mount -t tmpfs none /mnt && touch /mnt/flag && sleep 8\" & sleep 4; srun --overlap --container-name=\$SLURM_JOB_ID.0:exec ls /mnt; wait' >/dev/null && cat join.txt" "flag"
check "the batch step's container joined as JOBID.batch" "sbatch -W -o joinb.txt $img --container-remap-root --wrap 'mount -t tmpfs none /mnt && touch /mnt/batch-flag && sleep 8' >/dev/null & sleep 4; id=\$(squeue -h -u alice -o %i | head -1); srun --jobid=\$id --overlap --container-name=\$id.batch:exec ls /mnt; wait" "batch-flag"
check "JOBID.STEPID of no running step" "srun --container-name=999.0:exec true" "'999.0' is not running on this node"

# nothing listens on localhost:1: the runtime's import fails at once
check "a failed import says so in pyxis's words, once per node and step" "srun -n2 --container-image=localhost:1#no/such:1 true 2>&1 | grep -c 'pyxis: failed to import docker image: localhost:1#no/such:1$'" "1"
check "a failed import: the runtime's reason in a line of its own" "srun --container-image=localhost:1#no/such:1 true" "error: spank_berth: berth import: "
if [[ $mode == fake ]]; then # the real import needs a registry: the runtime's own tests
    calls=/var/tmp/fake-berth-1000/calls
    # the fake's digest of a tag that moved N times (see fake-berth)
    pin() { echo "sha256:$(printf '%s %s' "docker://registry.local#test/$1" "$2" | sha256sum | cut -c1-64)"; }
    reg="--container-image=registry.local#test/img:1"
    check "registry image imported" "srun $reg cat /etc/os-release" "ID=berth-test"
    check "registry image reused" "srun $reg cat /etc/os-release" "ID=berth-test"
    # pyxis's two lines for each node of a step with a registry image, which scripts count on
    lines="--container-image=registry.local#test/lines:1"
    check "a registry image: pyxis's two lines" "srun $lines true 2>&1 | grep -c -e 'pyxis: importing docker image: registry.local#test/lines:1\$' -e 'pyxis: imported docker image: registry.local#test/lines:1\$'" "2"
    check "a registry image the node had: said so on the second line" "srun $lines true 2>&1 | grep -c 'pyxis: imported docker image: registry.local#test/lines:1 (this node had it: nothing was downloaded)'" "1"
    check "each srun resolves the tag once, on the submit side" "grep -c '^import --resolve docker://registry.local#test/img:1\$' $calls" "2"
    img_digest=$(pin img:1 0)
    check "each step has its keeper import the pinned URI" "grep -c '^start --detach .*--reuse docker://registry.local#test/img@$img_digest\$' $calls" "2"
    check "imported once" "grep -c test/img /var/tmp/fake-berth-1000/copies" "1"
    # a SIF image's oras:// tag is pinned at submission as a docker:// one is
    check "an oras:// tag: resolved on the submit side, the keeper imports it pinned" "srun --container-image=oras://registry.local/test/sif:1 cat /etc/os-release && grep -c '^start --detach .*--reuse oras://registry.local/test/sif@sha256:[0-9a-f]*\$' $calls" "ID=berth-test
1"
    check "an image named by its digest: not resolved, the nodes import that digest" "srun --container-image=registry.local#test/img@$img_digest cat /etc/os-release && grep -c '^import --resolve .*@sha256:' $calls" "ID=berth-test
0"
    # which image a job ran, for the admin: a line per step in slurmd's log (root's to read)
    logged=$(on_node grep -c "spank_berth: step [0-9]*\.[0-9]* of uid 1000 runs image docker://registry.local#test/img:1 digest $img_digest\$" /var/log/slurm/slurmd.log || true)
    if [[ $logged == 2 ]]; then echo "ok   each step's image and digest in slurmd's log"
    else echo "FAIL each step's image and digest in slurmd's log: $logged lines"; failures=$((failures + 1)); fi
    logged=$(on_node grep -c 'runs image /srv/img.sqsh digest (a squashfs file)$' /var/log/slurm/slurmd.log || true)
    if [[ $logged -ge 1 ]]; then echo "ok   a squashfs file step in slurmd's log"
    else echo "FAIL a squashfs file step in slurmd's log: $logged lines"; failures=$((failures + 1)); fi
    other="--container-image=registry.local#test/other:2"
    check "concurrent steps import once" "(srun $other true & srun $other true; wait) >/dev/null 2>&1; grep -c other /var/tmp/fake-berth-1000/copies" "1"
    # the tag moves between two sruns: the second sees it, at its submission
    moving="--container-image=registry.local#test/moving:1"
    check "a moved tag: the next srun runs the new digest" "srun $moving true && echo 1 >/var/tmp/fake-berth-1000/tags/docker___registry.local_test_moving_1 && srun $moving true && grep -o -- '--reuse docker://.*test/moving@.*' $calls" "--reuse docker://registry.local#test/moving@$(pin moving:1 0)
--reuse docker://registry.local#test/moving@$(pin moving:1 1)"
    # salloc resolves; its steps (the flag reaches them from salloc) inherit that
    inherit="--container-image=registry.local#test/inherit:1"
    check "steps inside an allocation run the allocation's digest" "salloc -Q $inherit sh -c 'echo 1 >/var/tmp/fake-berth-1000/tags/docker___registry.local_test_inherit_1; srun cat /etc/os-release 2>/dev/null; srun true 2>/dev/null' && grep -c '^start --detach .*--reuse docker://registry.local#test/inherit@$(pin inherit:1 0)\$' $calls" "ID=berth-test
2"
    check "an allocation resolves once" "grep -c '^import --resolve docker://registry.local#test/inherit:1\$' $calls" "1"
    batch="--container-image=registry.local#test/batch:1"
    check "sbatch resolves at submission; the batch step runs that digest" "sbatch -W -o pinned.txt $batch --wrap 'cat /etc/os-release' >/dev/null && cat pinned.txt && grep -c 'test/batch' $calls" "ID=berth-test
2"
    check "sbatch: the batch step imports the pinned URI" "grep -c '^start --detach .*--reuse docker://registry.local#test/batch@$(pin batch:1 0)\$' $calls" "1"
    # a submit host that cannot ask the registry: a warning, and the node imports the tag
    # (the second without stderr: srun may put the import's line between the output's)
    check "a failed resolve warns naming the image and why" "FAKE_BERTH_RESOLVE=fail srun --container-image=registry.local#test/unresolved:1 true" "spank_berth: warning: cannot resolve docker://registry.local#test/unresolved:1 to a digest here (cannot get docker://registry.local#test/unresolved:1 from any of 1 places: no route to host)"
    check "a failed resolve: the step runs the tag as the node finds it" "FAKE_BERTH_RESOLVE=fail srun --container-image=registry.local#test/unresolved:1 cat /etc/os-release 2>/dev/null && grep -c '^start --detach .*--reuse docker://registry.local#test/unresolved:1\$' $calls" "ID=berth-test
2"
    # one the runtime says will not pass: the job is refused, in the runtime's line
    permanent="FAKE_BERTH_RESOLVE=fail FAKE_BERTH_RESOLVE_STATUS=$status_permanent"
    before=$(jobs_so_far)
    check "a resolve that will not pass refuses sbatch in the runtime's line" "$permanent sbatch --container-image=registry.local#test/gone:1 --wrap true" "spank_berth: --container-image: cannot get docker://registry.local#test/gone:1 from any of 1 places: no route to host"
    after=$(jobs_so_far)
    if [[ $before == "$after" ]]; then echo "ok   ... and submits no job"; else
        echo "FAIL a refused resolve submitted a job ($before -> $after)"; failures=$((failures + 1)); fi
    check "a resolve that will not pass ends srun before any node imports" "$(submitted registry.local#test/gone:1 "$permanent")" "exit=1 imports=0
spank_berth: --container-image: cannot get docker://registry.local#test/gone:1 from any of 1 places: no route to host"
    # a user stopping her own runtime before it is ready: no step or node waits on it
    check "a keeper its user stopped before it was ready fails the step" "FAKE_BERTH_STOP_BEFORE_READY=1 timeout 60 srun $img true" "spank_berth: berth start was stopped (SIGSTOP) for 10 s before the container was ready; killed"
    check "... and leaves the node idle" "$settled_state" "idle"
    # srun asks the registry while slurmctld allocates: the resolve answers
    # only once the job runs, and the step still gets its digest
    check "srun resolves while its job is allocated" "FAKE_BERTH_RESOLVE_AFTER_JOB=overlap srun -J overlap --container-image=registry.local#test/overlap:1 cat /etc/os-release && grep -c '^start --detach .*--reuse docker://registry.local#test/overlap@$(pin overlap:1 0)\$' $calls" "ID=berth-test
1"
    # an srun that gets no allocation leaves no resolve behind
    check "an srun refused its allocation fails" "FAKE_BERTH_RESOLVE_AFTER_JOB=never srun -p no-such-partition --container-image=registry.local#test/refused:1 true" "Invalid partition name"
    absent "... and leaves no resolve running" "sleep 0.5; pgrep -a -f 'import --resolve docker://registry.local#test/refuse[d]'" "refused"
    absent "no image copy under runtime_path" "ls /run/berth/1000/spank" "images"
    absent "a quick import is quiet" "srun --container-image=registry.local#test/quick:1 true" "into this node's image cache"
    check "a slow import says so" "FAKE_BERTH_IMPORT_SECONDS=5 srun --container-image=registry.local#test/slow:1 true" "spank_berth: importing docker://registry.local#test/slow:1 into this node's image cache"
    plugstack importer=/usr/local/bin/berth
    custom="--container-image=registry.local#test/custom:3"
    check "importer=: its own copy, once per node" "srun $custom true && srun $custom cat /etc/os-release && grep -c '^import -o .*custom' /var/tmp/fake-berth-1000/calls" "ID=berth-test"
    check "importer=: called once" "grep -c '^import -o .*custom' /var/tmp/fake-berth-1000/calls" "1"
    plugstack
fi

if [[ $mode == real ]]; then
    # An air-gapped image: a `docker save` archive of the test image, made by
    # hand (manifest.json, the config, one layer), on a node with no registry.
    on_node python3 - <<'PY'
import hashlib, io, json, tarfile
layer = io.BytesIO()
with tarfile.open(fileobj=layer, mode="w") as t:
    for name in sorted(__import__("os").listdir("/tmp/imgroot")):
        t.add(f"/tmp/imgroot/{name}", arcname=name)
data = layer.getvalue()
diff = hashlib.sha256(data).hexdigest()
config = json.dumps({"architecture": "amd64", "os": "linux", "config": {"Env": ["PATH=/usr/bin:/bin"]},
                     "rootfs": {"type": "layers", "diff_ids": ["sha256:" + diff]}}).encode()
config_id = hashlib.sha256(config).hexdigest()
manifest = json.dumps([{"Config": config_id + ".json", "RepoTags": ["e2e/app:1"],
                        "Layers": [diff + "/layer.tar"]}]).encode()
with tarfile.open("/srv/app.tar", "w") as out:
    for name, body in ((config_id + ".json", config), (diff + "/layer.tar", data),
                       ("manifest.json", manifest)):
        info = tarfile.TarInfo(name)
        info.size, info.mode = len(body), 0o644
        out.addfile(info, io.BytesIO(body))
PY
    check "--container-image=docker-archive:PATH (relative) runs the saved image" "cp /srv/app.tar . && srun --container-image=docker-archive:app.tar cat /etc/os-release" "ID=berth-test"
    check "an archive that is not there fails naming it" "srun --container-image=docker-archive:/srv/none.tar true" "failed to import docker image: docker-archive:/srv/none.tar"

    # What asking again will not mend is refused at submission, in the
    # runtime's line, at once; what may pass goes to the nodes. The node
    # resolves names from /etc/hosts alone: nosuchhost.invalid (RFC 2606)
    # asks no DNS server. A plain HTTP server with nothing to serve answers
    # 404 to every manifest; nothing listens on 127.0.0.1:1.
    on_node sed -i 's/^hosts:.*/hosts: files/' /etc/nsswitch.conf
    on_node mkdir -p /srv/empty
    docker exec -d -w /srv/empty "$name" python3 -m http.server --bind 127.0.0.1 5999
    on_node bash -c 'for _ in {1..50}; do (: </dev/tcp/127.0.0.1/5999) 2>/dev/null && exit; sleep 0.1; done'
    check "a registry name that does not resolve: srun refused at submission, at once" "$(submitted nosuchhost.invalid#x/y:1)" "exit=1 imports=0
spank_berth: --container-image: registry nosuchhost.invalid: Name or service not known"
    check "an image the registry does not have (404): refused at submission, at once" "$(submitted 127.0.0.1:5999#x/y:1)" "exit=1 imports=0
spank_berth: --container-image: image not found: 127.0.0.1:5999/x/y:1"
    check "a refused connection may pass: the nodes try again, after one line" "$(submitted 127.0.0.1:1#no/such:1)" "exit=1 imports=1
spank_berth: warning: cannot resolve docker://127.0.0.1:1#no/such:1 to a digest here (registry 127.0.0.1:1: Connection refused); each node imports the tag as it finds it then"
    # A busy registry: its first two answers for the manifest are 503, then
    # the image. The resolve asks once (503) and leaves it to the node,
    # whose import waits (the role's enroot.conf: 5 retries) and runs it.
    on_node sh -c 'printf "ENROOT_TRANSFER_RETRIES 5\nENROOT_ALLOW_HTTP yes\n" >>/etc/enroot/enroot.conf'
    put /srv/busy-registry.py 0644 <<'PY'
import hashlib, http.server, io, json, os, tarfile
layer = io.BytesIO()
with tarfile.open(fileobj=layer, mode="w") as t:
    for name in sorted(os.listdir("/tmp/imgroot")):
        t.add(f"/tmp/imgroot/{name}", arcname=name)
blobs = {}
def blob(data):
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    blobs[digest] = data
    return digest
layer_digest = blob(layer.getvalue())
config = json.dumps({"architecture": "amd64", "os": "linux", "config": {"Env": ["PATH=/usr/bin:/bin"]},
                     "rootfs": {"type": "layers", "diff_ids": [layer_digest]}}).encode()
manifest = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
    "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": blob(config), "size": len(config)},
    "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": layer_digest,
                "size": len(blobs[layer_digest])}]}).encode()
busy = [503, 503]
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/v2/x/busy/manifests/1":
            if busy:
                return self.answer(busy.pop(), b"")
            return self.answer(200, manifest, "application/vnd.oci.image.manifest.v1+json")
        name = self.path.rsplit("/", 1)[-1]
        self.answer(200, blobs[name]) if "/blobs/" in self.path and name in blobs else self.answer(404, b"")
    def answer(self, status, body, kind="application/octet-stream"):
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
http.server.HTTPServer(("127.0.0.1", 5998), Handler).serve_forever()
PY
    docker exec -d "$name" python3 /srv/busy-registry.py
    on_node bash -c 'for _ in {1..50}; do (: </dev/tcp/127.0.0.1/5998) 2>/dev/null && exit; sleep 0.1; done'
    check "a busy registry (503, then the image): the node waits for it, after one line" "$(submitted 127.0.0.1:5998#x/busy:1)" "exit=0 imports=0
spank_berth: warning: cannot resolve docker://127.0.0.1:5998#x/busy:1 to a digest here (registry 127.0.0.1:5998: manifest 1 answered 503 Service Unavailable); each node imports the tag as it finds it then"
fi

# --environment: the real runtime resolves EDF files; fake-berth hands out
# the resolved lines (NAME.spank), so the plugin's part runs in both modes.
# shellcheck disable=SC2016  # the node's shell expands these
on_node sh -ec 'mkdir -p /srv/data/sub /home/alice/.edf
    printf "#!/bin/sh\necho HOOK_SAW=\${BERTH_HOOK_PROBE_FLAVOUR:-unset} >>\"\$ENROOT_ENVIRON\"\n" \
        >/srv/50-probe.sh'
if [[ $mode == real ]]; then
    on_node install -D -m 0755 /srv/50-probe.sh /etc/enroot/hooks.d/50-probe.sh
    # Berth's home and SSH hooks, as the role installs them (the node has no dropbear)
    for hook in 10-home.sh 87-ssh.sh; do put /etc/enroot/hooks.d/$hook 0755 <"$repo/hooks/$hook"; done
    put /etc/enroot/hooks.d/common.bash 0644 <"$repo/hooks/common.bash"
    printf 'image = "/srv/img.sqsh"\n[annotations]\ncom.hooks.ssh.enabled = "true"\n' |
        put /home/alice/.edf/ssh.toml 0644
    printf 'image = "/srv/img.sqsh"\nmounts = ["/srv/data:mnt"]\n' | put /home/alice/.edf/reltarget.toml 0644
    reltarget_says="mount '/srv/data:mnt': destination 'mnt' is not an absolute path"
    # shellcheck disable=SC2016  # ${EDF_SRC} is the EDF's, which the runtime expands
    edf_file=toml edf_text='image = "/srv/img.sqsh"
workdir = "/data"
mounts = ["${EDF_SRC}:/data:ro"]
[env]
EDF_VAR = "from-edf"
IMAGE_VAR = "edf-beats-image"
EDF_CLASH = "edf-beats-task"
[annotations]
com.hooks.probe.flavour = "vanilla"'
else
    edf_file=spank edf_text='image=/srv/img.sqsh
workdir=/data
mount=/srv/data:/data:ro
env=EDF_VAR=from-edf
env=IMAGE_VAR=edf-beats-image
env=EDF_CLASH=edf-beats-task'
    printf 'image=/srv/img.sqsh\nmount=/srv/data:mnt\n' | put /home/alice/.edf/reltarget.spank 0644
    reltarget_says="mount target must be a relative path or an absolute path, in '/srv/data:mnt'"
fi
for f in e2e once; do put /home/alice/.edf/$f.$edf_file 0644 <<<"$edf_text"; done
printf 'imagee = "/srv/img.sqsh"\n' | put /home/alice/.edf/broken.toml 0644
on_node chown -R alice /home/alice/.edf
edf="EDF_SRC=/srv/data srun --environment=e2e"
check "--environment runs in the EDF's image" "$edf cat /etc/os-release" "ID=berth-test"
check "--environment mounts" "$edf cat /data/hello" "hello-from-host"
check "--environment workdir" "$edf pwd" "/data"
check "--container-workdir beats the EDF's" "$edf --container-workdir=/work pwd" "/work"
check "--environment env reaches the task" "$edf env" "EDF_VAR=from-edf"
check "--environment env beats the image's" "$edf env" "IMAGE_VAR=edf-beats-image"
check "--environment env beats the task's" "EDF_CLASH=task $edf env" "EDF_CLASH=edf-beats-task"
check "flag mounts go after (inside) the EDF's" "$edf --container-mounts=/srv/registry:/data/sub ls /data/sub" "image.sqsh"
# resolved once at submission: the steps run after the file and \${EDF_SRC} are gone
# held until its EDF file is gone: the batch script runs in the EDF resolved at submission
check "sbatch --environment, resolved at submission only" "id=\$(EDF_SRC=/srv/data sbatch -H --parsable -o edf.txt --environment=once --wrap 'cat /data/hello; pwd'); rm ~/.edf/once.*; scontrol release \$id; while squeue -h -j \$id 2>/dev/null | grep -q .; do sleep 1; done; cat edf.txt" "hello-from-host
/data"
check "salloc --environment" "EDF_SRC=/srv/data salloc -Q --environment=e2e srun cat /data/hello" "hello-from-host"
if [[ $mode == real ]]; then
    # a flag, or its PYXIS_CONTAINER_* variable, beats the enroot variable of the task's environment
    check "--container-readonly beats ENROOT_ROOTFS_WRITABLE=yes of the environment" "ENROOT_ROOTFS_WRITABLE=yes srun $img --container-readonly sh -c 'touch /probe 2>/dev/null && echo writable || echo read-only'" "read-only"
    check "PYXIS_CONTAINER_WRITABLE=0 beats it as the flag does" "ENROOT_ROOTFS_WRITABLE=yes PYXIS_CONTAINER_WRITABLE=0 srun $img sh -c 'touch /probe 2>/dev/null && echo writable || echo read-only'" "read-only"
    check "--no-container-remap-root beats ENROOT_REMAP_ROOT=yes of the environment" "ENROOT_REMAP_ROOT=yes srun $img --no-container-remap-root id -u" "1000"
    # --container-unshare=uts: a remapped root names its own host; an ordinary task holds no
    # capability to (enroot's switchroot leaves an ordinary user none either); the node keeps its name
    check "--container-unshare=uts, remapped root: its own host name, the node's untouched" "srun $img --container-unshare=uts --container-remap-root sh -c 'busybox hostname container-test && busybox hostname' && hostname" "container-test
bspk-node"
    check "--container-unshare=uts, not remapped: no capability to rename the host" "srun $img --container-unshare=uts sh -c 'busybox hostname container-test'" "Operation not permitted"
    check "--environment \${VAR} from the submitter" "EDF_SRC=/srv/registry srun --environment=e2e ls /data" "image.sqsh"
    check "--environment annotations reach the hooks" "$edf env" "HOOK_SAW=vanilla"
    check "--environment=PATH.toml" "EDF_SRC=/srv/data srun --environment=/home/alice/.edf/e2e.toml cat /data/hello" "hello-from-host"
    # the job's umount: entries come after every hook's mounts, as under pyxis and enroot
    home_at_root="srun $img --container-mount-home --container-remap-root"
    check "--container-mount-home, remapped root: the home hook mounts it at /root" "$home_at_root sh -c 'echo at-root=\$(busybox grep -c \" /root \" /proc/mounts)'" "at-root=1"
    check "umount:/root after the home hook's mount leaves /root unmounted" "$home_at_root --container-mounts=umount:/root sh -c 'echo at-root=\$(busybox grep -c \" /root \" /proc/mounts)'" "at-root=0"
    # a hook's refusal: its own reason is the one line the step shows
    check "a hook's refusal reaches the user in its own words" "srun --environment=ssh true" "spank_berth: berth start failed: berth: error: hook 87-ssh.sh: ssh hook: "
    absent "... not only that it failed" "srun --environment=ssh true" "failed with exit status"
    check "sbatch --export=NONE: the batch step still gets the EDF of submission" "EDF_SRC=/srv/data sbatch -W -o exn.txt --export=NONE --environment=e2e --wrap 'cat /data/hello' >/dev/null; cat exn.txt" "hello-from-host"
fi
before=$(jobs_so_far)
check "missing EDF refused" "sbatch --environment=nothere --wrap true" "spank_berth: --environment: environment 'nothere' not found"
check "an EDF mount target neither absolute nor relative refused" "srun --environment=reltarget true" "$reltarget_says"
if [[ $mode == real ]]; then
    check "broken EDF refused naming file, line and key" "srun --environment=broken true" "spank_berth: --environment: /home/alice/.edf/broken.toml:1: unknown key 'imagee'"
    check "unset \${VAR} refused" "srun --environment=e2e true" "\${EDF_SRC} in 'mounts' is not set"
fi
after=$(jobs_so_far)
if [[ $before == "$after" ]]; then echo "ok   refused environments submitted no job"; else
    echo "FAIL refused environments submitted a job ($before -> $after)"; failures=$((failures + 1)); fi

check "named container created" "srun --container-name=keep --container-writable $img sh -c 'echo kept > /state && echo done'" "done"
check "named container reused" "srun --container-name=keep cat /state" "kept"
check "named container as pyxis names it" "berth list" "pyxis_keep"
check "named container mode create refuses an existing one" "srun --container-name=keep:create $img true" "exists already"
# A tmpfs mounted by a running step is seen only from that step's mount namespace.
as_alice "srun --container-name=live --container-remap-root $img sh -c 'mount -t tmpfs none /mnt && echo up > /mnt/flag && sleep 12'" >/dev/null &
sleep 3
check "named container :exec joins the running one" "srun --container-name=live:exec cat /mnt/flag" "up"
check "attaching: --container-mounts ignored, saying so in pyxis's words" "srun --container-name=live --container-mounts=/srv/data:/data cat /mnt/flag" "spank_berth: warning: ignoring --container-mounts when attaching to a running container 'live'"
check "attaching with --container-unshare needs the container's own namespace" "srun --container-name=live:exec --container-unshare=net true" "--container-unshare=net requested but the container is not in a separate network namespace: the running container 'live' was started without it"
check "named container :no_exec starts its own" "srun --container-name=live:no_exec ls /mnt | grep -c flag" "0"
wait
# Removed while a step still runs in it (cleanup scripts do): the name is
# free, as in pyxis; joining the old step's root, deleted, failed every task.
# The old and the new step run until cancelled (at most two jobs at once).
running() { as_alice "for i in \$(seq 60); do squeue -h -n $1 -t R | grep -q . && exit; sleep 0.5; done"; }
# a job is R before its step's container exists: wait for the container's process
started() { as_alice "for i in \$(seq 120); do berth list -f | grep -q '^$1 *[0-9]' && exit; sleep 0.5; done"; }
as_alice "srun -J gone-old --container-name=gone --container-remap-root $img sh -c 'mount -t tmpfs none /mnt && echo up > /mnt/flag && exec sleep 300'" >/dev/null &
running gone-old
started pyxis_gone
sleep 1
check "a removed named container: :exec finds none running" "berth remove -f pyxis_gone && srun --container-name=gone:exec true" "'gone' is not running on this node"
check "a removed named container: made anew from the image, with its mounts" "srun --container-name=gone --container-mounts=/srv/data:/data $img sh -c 'cat /data/hello; ls /mnt | grep -c flag || true'" "hello-from-host
0"
# the old step ends while the new one runs: the name's record stays the new one's
as_alice "berth remove -f pyxis_gone"
as_alice "srun -J gone-new --container-name=gone --container-remap-root $img sh -c 'mount -t tmpfs none /mnt && echo new > /mnt/mark && exec sleep 300'" >/dev/null &
running gone-new
sleep 3
as_alice "scancel -n gone-old; while squeue -h -n gone-old | grep -q .; do sleep 0.5; done"
check "a removed named container: the new one is joined, after the old one ended too" "srun --container-name=gone cat /mnt/mark" "new"
as_alice "scancel -n gone-new"
wait
check "named container exec needs it running" "srun --container-name=keep:exec true" "is not running on this node"
check "named container neither on disk nor given an image" "srun --container-name=nowhere true" "no --container-image to create it from"

check "--container-entrypoint: the entrypoint's environment" "srun --container-image=/srv/ep.sqsh --container-entrypoint sh -c 'echo ep=\$EP_VAR'" "ep=from-entrypoint"
check "no entrypoint unless asked" "srun --container-image=/srv/ep.sqsh sh -c 'echo ep=\$EP_VAR.'" "ep=."
check "--container-entrypoint-log: its output on stderr" "srun --container-image=/srv/ep.sqsh --container-entrypoint --container-entrypoint-log true" "entrypoint says hello"

check "--container-save" "srun $img --container-writable --container-save=/home/alice/saved.sqsh sh -c 'echo saved > /saved' && srun --container-image=/home/alice/saved.sqsh cat /saved" "saved"
check "unnamed container for save removed" "berth list | grep -c '^pyxis_[0-9]'" "0"

check "runtime failure fails the step with its message" "srun --container-image=/srv/bad.sqsh true" "spank_berth"
check "runtime failure makes srun exit non-zero" "srun --container-image=/srv/bad.sqsh true; echo srun-exit=\$?" "srun-exit=1"

plugstack container_scope=job
check "container_scope=job: the job's named container" "sbatch -W -o scoped.txt --wrap \"srun --container-name=scoped $img true; berth list | grep -c '^pyxis_[0-9]*_scoped\\\$'\" >/dev/null; cat scoped.txt" "1"
sleep 2
check "container_scope=job: removed by the epilog" "berth list | grep -c _scoped" "0"
plugstack container_scope=job container_prefix=site
check "container_prefix: the site's names" "sbatch -W -o prefixed.txt --wrap \"srun --container-name=pre $img true; berth list | grep -c '^site_[0-9]*_pre\\\$'\" >/dev/null; cat prefixed.txt" "1"
sleep 2
check "container_prefix: the epilog removes the site's names" "berth list | grep -c _pre" "0"
plugstack container_scope=job
# the user's own doing (a data directory open to all: the runtime refuses to
# list) must not fail the epilog, which would drain the node
check "container_scope=job: an unsafe data directory of the user drains no node" "d=\$HOME/.local/share/enroot; mkdir -p \$d; chmod 0777 \$d; sbatch -W -o /dev/null --wrap true >/dev/null; $settled_state; chmod 0700 \$d" "idle"
plugstack

before=$(jobs_so_far)
check "bad flag refused by srun" "srun --container-mounts=/data: true" "spank_berth: --container-mounts: missing destination in '/data:'"
check "bad image refused by srun" "srun --container-image=nvcr.io true" "registry host without an image"
# pyxis's rule: a target starts with '/' or '.'
check "a mount target neither absolute nor relative refused before anything runs" "srun $img --container-mounts=/tmp:mnt:ro true" "spank_berth: --container-mounts: mount target must be a relative path or an absolute path, in '/tmp:mnt:ro'"
check "... in PYXIS_CONTAINER_MOUNTS too" "PYXIS_CONTAINER_MOUNTS=/tmp:mnt srun $img true" "mount target must be a relative path or an absolute path, in '/tmp:mnt'"
after=$(jobs_so_far)
if [[ $before == "$after" ]]; then echo "ok   refused flags submitted no job"; else
    echo "FAIL refused flags submitted a job ($before -> $after)"; failures=$((failures + 1)); fi

sleep 1
absent "no keeper left after the steps" "pgrep -u alice -f '[u]nshare|[r]ead (-r )?_' >/dev/null && echo keeper-left" "keeper-left"
absent "no step dir left" "ls /run/berth/1000/spank" "."

if ((failures)); then
    echo "e2e: $failures check(s) failed; the plugin's step dirs left:"
    # shellcheck disable=SC2016  # the node's shell expands these
    on_node sh -c 'for f in /run/berth/1000/spank/*.*/*; do echo "== $f"; cat "$f"; done' || true
    exit 1
fi
echo "e2e: all checks passed ($mode runtime)"
