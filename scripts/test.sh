#!/usr/bin/env bash
# The whole test suite: lint, unit and integration tests, the runtime's suite
# and the SPANK plugin's build on Debian 13, and the multi-node Molecule
# scenario on Debian 12 and on Debian 13 (both clusters at once, each on a
# Docker daemon of its own, the host's tests beside them). Exits non-zero on
# the first failing stage.
#
#   bash scripts/test.sh          everything, as CI runs it
#   bash scripts/test.sh --fast   a developer's loop: the unit tier first, lint,
#                                 the other tiers of pytest, and the cluster's
#                                 idempotence and verify steps on the demo
#                                 cluster already running (scripts/demo.sh)
#
# Each stage has a budget in seconds (STAGES below, measured on the 2-core
# machines CI runs on); the run ends with one table of each stage's seconds
# against its budget and the whole against CI's limit. A stage over its
# budget by half is marked there: a warning, not a failure (machines of one
# kind differ by a third). Each stage's output is kept in .cache/test-logs/.
set -euo pipefail
cd "$(dirname "$0")/.."

CI_LIMIT=5400  # CI stops a run after 90 minutes: past it, nothing lands
# key|budget in seconds|what it runs
STAGES=(
    "bootstrap|180|host bootstrap (packages, Docker daemon, venv, node images)"
    "unit|60|--fast only: the unit tier of pytest (pytest.ini; no root, network, playbook or namespaces)"
    "lint|45|ruff, shellcheck, ansible-lint (production profile), the AppArmor profile, syntax check, module documentation, the docs site"
    "images|240|test images (Open MPI, MPICH) of Debian 12 and 13"
    "pytest|800|unit and integration tests (tests, runtime/tests)"
    "runtime-trixie|240|runtime suite on Debian 13 (Python 3.13), SPANK plugin against Slurm 24.11"
    "cluster-bookworm|1800|multi-node cluster on Debian 12, Slurm 22.05 (molecule test -s multinode)"
    "cluster-trixie|1900|multi-node cluster on Debian 13, Slurm 24.11 (the same scenario and tests, at the same time)"
    "cluster-adopt|600|pyxis 0.24 + enroot 4.1.2 on Debian 12 moved to Berth and back (molecule test -s adopt)"
    "fast-cluster|1080|the running demo cluster: idempotence and verify (molecule)"
)

mode=full
case "${1:-}" in
    "") ;;
    --fast) mode=fast ;;
    *) echo "usage: $0 [--fast]" >&2; exit 2 ;;
esac

LOGS=.cache/test-logs
mkdir -p "$LOGS"
started=$SECONDS
ran=()  # key|seconds|passed, in order

declare -A STAGE_BUDGET=() STAGE_TITLE=()
for entry in "${STAGES[@]}"; do
    IFS='|' read -r key seconds title <<<"$entry"
    STAGE_BUDGET[$key]=$seconds
    STAGE_TITLE[$key]=$title
done

# The closing table: stage, seconds, budget, tests passed, and a mark for a
# stage over its budget by half; then the whole run against CI's limit.
summary() {
    local entry key seconds passed budget mark total=$((SECONDS - started))
    printf '\n=== stages (seconds; a stage over its budget by half is marked)\n'
    printf '%-18s %8s %8s %8s  %s\n' stage seconds budget passed ""
    for entry in "${ran[@]}"; do
        IFS='|' read -r key seconds passed <<<"$entry"
        budget=${STAGE_BUDGET[$key]}
        mark=""
        ((seconds * 2 > budget * 3)) && mark="OVER BUDGET by $((seconds * 100 / budget - 100)) %"
        printf '%-18s %8d %8d %8s  %s\n' "$key" "$seconds" "$budget" "${passed:--}" "$mark"
    done
    printf '%-18s %8d %8d %8s  %s\n' total "$total" "$CI_LIMIT" "" "CI's limit: 90 minutes"
}

# passed KEY: the tests the pytest runs of a stage passed (their summary
# lines, "== 96 passed, 1 warning in 52.1s ==" or without the rules under
# -q, summed); nothing for a stage without any.
passed() {
    grep -aoE '^(=+ )?([0-9]+ [a-z]+, )*[0-9]+ passed.* in [0-9.]+s' "$LOGS/$1.log" \
        | grep -oE '[0-9]+ passed' | awk '{n += $1} END {if (NR) print n}' || true
}

# record KEY SECONDS EXIT: note a stage that ended; on failure, the stages
# still running beside it end first (a cluster must not outlive the run),
# then the table and the exit.
record() {
    local key=$1 seconds=$2 rc=$3
    ran+=("$key|$seconds|$(passed "$key")")
    if ((rc != 0)); then
        echo "test.sh: stage $key failed (exit $rc); waiting for the stages beside it" >&2
        finish_beside
        summary
        echo "test.sh: stage $key failed (exit $rc); its output: $LOGS/$key.log" >&2
        exit "$rc"
    fi
}

# The beside stages not collected yet: waited for, and noted as they ended.
finish_beside() {
    local key rc seconds
    for key in "${!beside_pids[@]}"; do
        [[ " ${ran[*]} " == *" $key|"* ]] && continue
        wait "${beside_pids[$key]}" 2>/dev/null || true
        [[ -f $LOGS/$key.status ]] || continue
        read -r rc seconds <"$LOGS/$key.status"
        ran+=("$key|$seconds|$(passed "$key")")
    done
}

announce() {
    printf '\n=== %s (at %d s, budget %d s%s)\n' "${STAGE_TITLE[$1]}" $((SECONDS - started)) \
        "${STAGE_BUDGET[$1]}" "${2:-}"
}

# stage KEY COMMAND...: run one stage, its output on the terminal and in
# $LOGS/KEY.log.
stage() {
    local key=$1 begin=$SECONDS rc
    shift
    announce "$key"
    # not `|| rc=$?`: that would switch off -e inside the stage's functions
    set +e
    (set -e; "$@") 2>&1 | tee "$LOGS/$key.log"
    rc=${PIPESTATUS[0]}
    set -e
    record "$key" $((SECONDS - begin)) "$rc"
}

# beside KEY FUNCTION [then KEY FUNCTION]...: start stages in the background,
# one after the other, beside the stages that follow; their output goes to
# $LOGS/KEY.log only. `collect KEY` waits for one, then shows its output and
# notes it; a stage after one that failed does not run.
declare -A beside_pids=()
beside() {
    local -a chain=("$@") keys=()
    local i
    for ((i = 0; i < ${#chain[@]}; i += 3)); do
        keys+=("${chain[i]}")
        rm -f "$LOGS/${chain[i]}.status"
    done
    announce "${keys[0]}" ", beside the next stages${keys[1]:+, then ${keys[*]:1}}; its output when it ends"
    (
        for ((i = 0; i < ${#chain[@]}; i += 3)); do
            ((i == 0)) || printf '\n=== %s (at %d s, beside)\n' "${STAGE_TITLE[${chain[i]}]}" \
                $((SECONDS - started))
            begin=$(date +%s)
            set +e
            (set -e; "${chain[i + 1]}") >"$LOGS/${chain[i]}.log" 2>&1
            rc=$?
            echo "$rc $(($(date +%s) - begin))" >"$LOGS/${chain[i]}.status"
            ((rc == 0)) || break
        done
    ) &
    for i in "${keys[@]}"; do
        beside_pids[$i]=$!
    done
}

collect() {
    local key=$1 rc=1 seconds=0
    wait "${beside_pids[$key]}" 2>/dev/null || true  # (a chain's second collect finds it reaped)
    if [[ -f $LOGS/$key.status ]]; then
        read -r rc seconds <"$LOGS/$key.status"
    else
        echo "(not run: a stage before it in its chain failed)" >"$LOGS/$key.log"
    fi
    printf '\n=== %s: ended after %d s, at %d s; its output:\n' "${STAGE_TITLE[$key]}" \
        "$seconds" $((SECONDS - started))
    cat "$LOGS/$key.log"
    record "$key" "$seconds" "$rc"
}

# The shell scripts lint checks, NUL-terminated: every tracked *.sh and
# *.bash file and every other whose first line runs sh or bash, but the
# roles' Jinja templates (*.j2), which are shell only once rendered.
shell_scripts() {
    local file line
    while IFS= read -r -d '' file; do
        case $file in
            *.j2) continue ;;
            *.sh | *.bash) printf '%s\0' "$file"; continue ;;
        esac
        [[ -f $file && ! -L $file ]] || continue
        line=''
        IFS= read -r line 2>/dev/null <"$file" || true
        if [[ $line =~ ^'#!'[[:space:]]*(/usr)?/bin/(env[[:space:]]+)?(ba)?sh([[:space:]]|$) ]]; then
            printf '%s\0' "$file"
        fi
    done < <(git ls-files -z)
}

lint() {
    # Python (ruff.toml: pyflakes, pycodestyle, bugbear, import order), then
    # the shell scripts, following the files they source (from the root)
    ruff check --quiet .
    local -a scripts
    mapfile -d '' scripts < <(shell_scripts)
    shellcheck --external-sources "${scripts[@]}"
    ansible-lint --profile production --offline
    bash scripts/check-apparmor.sh >/dev/null
    ansible-playbook --syntax-check -i inventories/example/hosts.yml site.yml
    ansible-playbook --syntax-check -i inventories/example/hosts.yml playbooks/upgrade.yml
    local module name
    for module in library/*.py; do
        name=$(basename "$module" .py)
        ansible-doc -M library "$name" >/dev/null \
            || { echo "ansible-doc fails for $name" >&2; return 1; }
    done
    # the documentation site: a broken link or anchor fails (mkdocs.yml: strict)
    NO_MKDOCS_2_WARNING=1 mkdocs build --strict --quiet --site-dir .cache/site
}

images() {
    BERTH_NODE_SUITE=bookworm bash scripts/test-image.sh
    BERTH_NODE_SUITE=trixie bash scripts/test-image.sh
}

unit_tests() {
    # Two workers, a test file to each at a time (tests/conftest.py starts
    # the SPANK end-to-end file first): most tests wait on subprocesses, not
    # the CPU. runtime/tests/conftest.py sets the machine-wide state once.
    # Arguments (--fast: -m "not unit") go to pytest; CI runs every tier.
    python -m pytest -q -rs -n 2 --dist loadfile --no-loadscope-reorder --durations=10 \
        "$@" tests runtime/tests
}

unit_tier() {
    python -m pytest -q -rs -m unit tests runtime/tests
}

runtime_suite_trixie() {
    bash scripts/test-runtime-suite.sh trixie
}

# The Debian 13 cluster on a second Docker daemon, in a network namespace of
# its own (scripts/start-dockerd.sh --beside): the same container and network
# names as the Debian 12 cluster's, which runs at the same time on the host's.
cluster_beside() {
    local host_image beside_image
    DOCKER_HOST=$(bash scripts/start-dockerd.sh --beside)
    export DOCKER_HOST
    host_image=$(env -u DOCKER_HOST docker image inspect -f '{{.Id}}' berth/node:trixie)
    beside_image=$(docker image inspect -f '{{.Id}}' berth/node:trixie 2>/dev/null || true)
    if [[ $host_image != "$beside_image" ]]; then
        env -u DOCKER_HOST docker save berth/node:trixie | docker load -q
    fi
    # Molecule's state and the verify step's tmp_path, apart from the other cluster's
    export MOLECULE_EPHEMERAL_DIRECTORY=$PWD/.cache/molecule-beside
    export PYTEST_DEBUG_TEMPROOT=$PWD/.cache/pytest-beside
    mkdir -p "$PYTEST_DEBUG_TEMPROOT"
    BERTH_NODE_SUITE=trixie molecule test -s multinode
}

# The site's node image (pyxis and enroot from BERTH_UPSTREAM_DIR's release
# tarballs), then the scenario that moves that cluster to Berth and back.
adopt_cluster() {
    bash scripts/site-image.sh
    molecule test -s adopt
}

fast_cluster() {
    docker inspect berth-ctl >/dev/null 2>&1 \
        || { echo "test.sh --fast: no demo cluster runs (bash scripts/demo.sh)" >&2; return 1; }
    molecule idempotence -s multinode
    molecule verify -s multinode
}

stage bootstrap bash scripts/bootstrap-host.sh
export PATH="${BERTH_DEV_VENV:-/opt/berth-dev/venv}/bin:$PATH" ANSIBLE_FORCE_COLOR=0 PY_COLORS=0
if [[ $mode == fast ]]; then
    stage unit unit_tier  # first: a broken unit fails the loop within a minute
fi
stage lint lint
if [[ $mode == fast ]]; then
    stage pytest unit_tests -m "not unit"
    stage fast-cluster fast_cluster
else
    stage images images
    # The two clusters at once, each on a Docker daemon of its own, and the
    # host's tests beside them, then the Debian 13 runtime suite: each leaves
    # a share of the two cores idle (waiting on jobs, services and
    # subprocesses), and nothing one changes is seen by another (the nodes
    # have their own /dev, users, network, /shared and cgroup namespace; the
    # runtime suite runs in a container of its own).
    beside cluster-trixie cluster_beside
    # then the adopt scenario, in the same lane: pytest and the runtime
    # suite end well before the clusters do
    beside pytest unit_tests "then" runtime-trixie runtime_suite_trixie "then" cluster-adopt adopt_cluster
    stage cluster-bookworm env BERTH_NODE_SUITE=bookworm molecule test -s multinode
    collect pytest
    collect runtime-trixie
    collect cluster-adopt
    collect cluster-trixie
fi
summary
