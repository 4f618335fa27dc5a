#!/bin/bash
# An SSH server inside the container, started with it and ending with it,
# that lets the container's user in with her own keys (a debugger or an
# editor's remote session on the compute node), as an enroot-protocol hook.
#
# On with BERTH_HOOK_SSH_ENABLE: the site's default in enroot.conf (off
# unless the admin says so), over it the job's environment, over both an
# EDF's com.hooks.ssh.enabled = "true" (or .enable = true).
#
# The server is the node's dropbear (Debian's dropbear-bin): it runs as an
# ordinary user, and from binds, through the node's own loader and the
# libraries it needs (under /usr/local/berth/ssh), so the image needs none
# of it. The runtime starts it once the container is ready (a service,
# BERTH_SERVICES), as the container's user, on TCP port BERTH_HOOK_SSH_PORT
# (com.hooks.ssh.port, default 15263) of every address of the node, and
# stops it with the container. Only that user logs in, by a key of her
# ~/.ssh/authorized_keys on the node or of the file that
# BERTH_HOOK_SSH_AUTHORIZE_SSH_KEY (com.hooks.ssh.authorize_ssh_key) names;
# never by password. The host key is the user's own, made once in
# $ENROOT_CONFIG_PATH/ssh and kept: every node and job shows the same one.
# A session lands in the container with the environment its tasks get (the
# runtime's BERTH_READY_ENVIRON, sourced by /usr/local/berth/ssh/session).
#
# Fails the start, in one line, when it is on and: the node has no
# dropbear, the port is not one from 1024 to 65535 or is taken (by another
# step's or another user's server: the runtime then checks that what
# listens there is its own), no key would let anyone in, the key file is
# not a small regular file she can read, or the host key cannot be made. Knobs, from the
# environment of berth start: BERTH_LDCONFIG (command printing the ld.so
# cache, default: ldconfig -p), BERTH_SSH_SERVER (default: dropbear from
# /usr/sbin:/usr/bin).
set -eu -o pipefail

here=${BASH_SOURCE[0]%/*}
if [ -L "${BASH_SOURCE[0]}" ]; then here=$(readlink -f "${BASH_SOURCE[0]}") here=${here%/*}; fi
# shellcheck source=hooks/common.bash
. "$here/common.bash"
hook_begin ssh BERTH_HOOK_SSH_ENABLE

top=/usr/local/berth/ssh
key_limit=65536  # bytes of authorized keys: a few hundred keys

# The port, checked here for a message naming the annotation; the runtime
# checks again as the server starts.
port=${BERTH_HOOK_SSH_PORT:-15263}
{ [[ $port =~ ^[0-9]{1,5}$ ]] && ((10#$port >= 1024 && 10#$port <= 65535)); } ||
    die "BERTH_HOOK_SSH_PORT (com.hooks.ssh.port): '${port//[^[:print:]]/?}' is not a port from 1024 to 65535"
port=$((10#$port))
listening() {
    awk -v port="$(printf '%04X' "$1")" 'FNR > 1 && $4 == "0A" && $2 ~ (":" port "$") { found = 1 }
        END { exit !found }' /proc/net/tcp /proc/net/tcp6 2>/dev/null
}
if listening "$port"; then
    die "TCP port $port is taken on this node (another step's or user's server);" \
        "com.hooks.ssh.port (BERTH_HOOK_SSH_PORT) picks another"
fi

server=${BERTH_SSH_SERVER:-$(PATH=/usr/sbin:/usr/bin type -P dropbear || true)}
[[ -n $server && -x $server ]] ||
    die "it is on (BERTH_HOOK_SSH_ENABLE), but this node has no dropbear (Debian's dropbear-bin; BERTH_SSH_SERVER)"
plain_path BERTH_SSH_SERVER "$server"

# The container's passwd entry for its user: the copy an earlier hook
# made (10-shadow.sh's, the Slurm hook's over it), else the image's. Its
# home is where dropbear looks for .ssh/authorized_keys, its shell what
# runs the session.
home=''
for passwd in "$BERTH_RUNTIME_DIR/slurm-passwd" "$BERTH_RUNTIME_DIR/passwd" "$ENROOT_ROOTFS/etc/passwd"; do
    [[ -f $passwd && ! -L $passwd ]] || continue
    IFS= read -r home < <(awk -F: -v uid="${BERTH_UID:?}" \
        '$3 == uid { print $6; exit }' "$passwd") || true
    break
done
[ -n "$home" ] || die "the container's /etc/passwd has no user of uid $BERTH_UID to log in as"
plain_path "the user's home in the container" "$home"

# Who may log in: the keys of the user's authorized_keys on the node, then
# the annotation's file, each a regular file (a FIFO would hold the start)
# of at most $key_limit bytes.
host_uid=$(awk '{ print $2; exit }' /proc/self/uid_map)
node_home=$(getent passwd "$host_uid" | cut -d: -f6) || node_home=''
plain_path BERTH_RUNTIME_DIR "$BERTH_RUNTIME_DIR"
keys=$BERTH_RUNTIME_DIR/authorized_keys
: >"$keys"
chmod 600 "$keys"
add_keys() { # FILE WHAT
    [ -f "$1" ] || die "$2: '${1//[^[:print:]]/?}' is not a regular file"
    [ "$(stat -L -c %s -- "$1")" -le "$key_limit" ] || die "$2: $1 is larger than $key_limit bytes"
    head -c "$key_limit" -- "$1" >>"$keys" 2>/dev/null ||
        die "$2: '${1//[^[:print:]]/?}' cannot be read by this user"
    echo >>"$keys"
}
if [ -n "$node_home" ] && [ -f "$node_home/.ssh/authorized_keys" ]; then
    # shellcheck disable=SC2088  # the file's name in the messages, not a path
    add_keys "$node_home/.ssh/authorized_keys" "~/.ssh/authorized_keys"
fi
extra=${BERTH_HOOK_SSH_AUTHORIZE_SSH_KEY:-}
if [ -n "$extra" ]; then
    [[ $extra == /* ]] || die "BERTH_HOOK_SSH_AUTHORIZE_SSH_KEY (com.hooks.ssh.authorize_ssh_key):" \
        "'${extra//[^[:print:]]/?}' is not an absolute path"
    add_keys "$extra" "BERTH_HOOK_SSH_AUTHORIZE_SSH_KEY (com.hooks.ssh.authorize_ssh_key)"
fi
grep -q '^[[:space:]]*[^#[:space:]]' "$keys" ||
    die "no key would let anyone in: ${node_home:-the home}/.ssh/authorized_keys has none" \
        "and com.hooks.ssh.authorize_ssh_key names no file"

# The user's host key, made once (two nodes may both be first: each makes
# its own and links it, the first link wins, the other is dropped).
config=${ENROOT_CONFIG_PATH:?}/ssh
host_key=$config/dropbear_ed25519_host_key
plain_path ENROOT_CONFIG_PATH "$config"
if [ ! -f "$host_key" ]; then
    # shellcheck disable=SC2174  # 0700 is for the key's directory; its parents are the user's own
    mkdir -p -m 700 -- "$config" 2>/dev/null || die "cannot make $config for the host key"
    made=$config/.new-$$-$RANDOM
    keygen=$(PATH=${server%/*}:/usr/bin:/usr/sbin type -P dropbearkey) ||
        die "this node has no dropbearkey to make the host key $host_key"
    "$keygen" -t ed25519 -f "$made" >/dev/null 2>&1 ||
        { rm -f -- "$made"; die "cannot make the host key $host_key (dropbearkey failed)"; }
    ln -- "$made" "$host_key" 2>/dev/null || true
    rm -f -- "$made"
fi
[ -f "$host_key" ] || die "$host_key is not a regular file"

# The node's loader and the libraries dropbear needs, each bound alone.
loader=$(ld_cache_entries ld-linux-x86-64.so ld-linux-aarch64.so |
    awk '$2 == 64 && !found { found = $3 } END { print found }') || exit 1
[ -n "$loader" ] || die "no 64-bit ld-linux loader in the node's ld.so cache"
bind "$loader" "$top/ld.so" bind,ro,nosuid,nodev,x-create=file
bind "$server" "$top/dropbear" bind,ro,nosuid,nodev,x-create=file
while read -r name arrow path _; do
    [[ $arrow == "=>" && $path == /* ]] || continue
    plain_path "dropbear's library" "$path"
    bind "$path" "$top/lib/$name" bind,ro,nosuid,nodev,x-create=file
done < <("$loader" --list "$server" 2>/dev/null)
bind "$host_key" "$top/host_key" bind,ro,nosuid,nodev,noexec,x-create=file
bind "$keys" "$home/.ssh/authorized_keys" bind,ro,nosuid,nodev,noexec,x-create=file

# The session: the environment the container's tasks get, from the file
# the runtime fills once the container is ready (dropbear passes on only
# its own variables: no -e), over dropbear's variables of the session,
# which stay (its terminal, where it comes from); then the user's shell,
# with the client's command if it sent one, else interactive as a task's
# shell is (the login shell's profile already ran for the container).
# Written into the container's root: the runtime directory may be noexec.
plain_path BERTH_READY_ENVIRON "${BERTH_READY_ENVIRON:?}"
bind "$BERTH_READY_ENVIRON" "$top/environment" bind,ro,nosuid,nodev,noexec,x-create=file
session=$ENROOT_ROOTFS$top/session
make_in_root "${session%/*}"
rm -f -- "$session"
{
    echo '#!/bin/sh'
    echo "environment=$top/environment"
    cat <<'EOF'
if [ ! -s "$environment" ]; then
    echo "ssh hook: the container is not ready yet: try again" >&2
    exit 1
fi
berth_shell=$SHELL berth_command=${SSH_ORIGINAL_COMMAND-} berth_term=${TERM-}
berth_client=${SSH_CLIENT-} berth_connection=${SSH_CONNECTION-} berth_tty=${SSH_TTY-}
unset SSH_ORIGINAL_COMMAND
. "$environment"
if [ -n "$berth_term" ]; then export TERM="$berth_term"; fi
if [ -n "$berth_client" ]; then export SSH_CLIENT="$berth_client"; fi
if [ -n "$berth_connection" ]; then export SSH_CONNECTION="$berth_connection"; fi
if [ -n "$berth_tty" ]; then export SSH_TTY="$berth_tty"; fi
if [ -n "$berth_command" ]; then exec "$berth_shell" -c "$berth_command"; fi
exec "$berth_shell"
EOF
} >"$session"
chmod 755 "$session"

flush_mounts
# --argv0 without a slash: dropbear then serves each connection in a fork
# of itself rather than re-executing itself by that name, which would run
# it through the image's loader.
echo "tcp $port $top/ld.so --library-path $top/lib --argv0 dropbear $top/dropbear" \
    "-F -s -P /dev/null -p $port -r $top/host_key -c $top/session" >>"${BERTH_SERVICES:?}"
