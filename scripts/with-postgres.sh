#!/usr/bin/env bash
# Run a command against a throwaway PostgreSQL server.
#
#   scripts/with-postgres.sh uv run pytest -q tests/core/unit/test_store.py
#
# Starts a private PostgreSQL cluster on 127.0.0.1 (free port; data and socket dirs in a
# mktemp dir), creates the database keel_test, exports
#   KEEL_TEST_POSTGRES_URL=postgresql+psycopg://keel:<random>@127.0.0.1:<port>/keel_test
# runs the command, then stops the server by its PID (SIGINT, fast shutdown; SIGKILL after
# 30 s) and deletes the temp dir.
# Exits with the command's status.
#
# PostgreSQL binaries: initdb on PATH (Debian's /usr/lib/postgresql/*/bin is searched
# too). If none, and we are root, `apt-get install -y postgresql`. initdb and postgres
# refuse to run as root, so as root they run as the `postgres` user (or `nobody`).
set -euo pipefail

log() { echo "with-postgres: $*" >&2; }
die() { log "error: $*"; exit 2; }

[[ $# -gt 0 ]] || die "usage: $0 COMMAND [ARGS...]"

find_bindir() {
    local initdb
    if initdb=$(command -v initdb 2>/dev/null); then
        dirname "$(readlink -f "$initdb")"
        return 0
    fi
    local candidates
    # Newest major version first.
    candidates=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r || true)
    for dir in $candidates; do
        if [[ -x "$dir/initdb" ]]; then
            echo "$dir"
            return 0
        fi
    done
    return 1
}

BINDIR=$(find_bindir) || BINDIR=""
if [[ -z "$BINDIR" ]]; then
    if [[ $(id -u) -ne 0 ]]; then
        die "PostgreSQL server binaries (initdb) not found; install them (Debian/Ubuntu: sudo apt-get install -y postgresql) or add their bin dir to PATH"
    fi
    command -v apt-get >/dev/null || die "initdb not found and apt-get is not available to install PostgreSQL"
    log "initdb not found; installing PostgreSQL with apt-get"
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-get install -y --no-install-recommends postgresql >&2; then
        apt-get update >&2
        apt-get install -y --no-install-recommends postgresql >&2
    fi
    BINDIR=$(find_bindir) || die "PostgreSQL was installed but initdb is still not found"
fi
for tool in initdb postgres createdb pg_isready; do
    [[ -x "$BINDIR/$tool" ]] || die "$BINDIR/$tool is missing"
done

# initdb and postgres refuse to run as root: drop to an unprivileged user.
RUN_AS=()
PG_USER=$(id -un)
if [[ $(id -u) -eq 0 ]]; then
    if id postgres >/dev/null 2>&1; then
        PG_USER=postgres
    else
        PG_USER=nobody
    fi
    # setpriv execs the server directly (its PID is ours to signal); runuser forks.
    if command -v setpriv >/dev/null; then
        RUN_AS=(setpriv --reuid="$PG_USER" --regid="$(id -g "$PG_USER")" --init-groups --)
    elif command -v runuser >/dev/null; then
        RUN_AS=(runuser -u "$PG_USER" --)
    else
        die "running as root, but neither runuser nor setpriv is available to drop privileges"
    fi
fi
# From inside the temp dir: the unprivileged user may not be able to read our cwd.
as_pg() { (cd "$TMP" && "${RUN_AS[@]}" "$@"); }

TMP_BASE=${TMPDIR:-/tmp}
if [[ ${#RUN_AS[@]} -gt 0 ]]; then
    # $TMPDIR may sit under root's home, which the server's user cannot traverse.
    TMP_BASE=/tmp
fi
TMP=$(mktemp -d "$TMP_BASE/keel-pg.XXXXXX")
DATA="$TMP/data"
SOCK="$TMP/sock"
PG_PID=""
LAUNCH_PID=""

# kill -0 also succeeds on a zombie, so read the process state instead.
alive() {
    local state=""
    [[ -r "/proc/$1/stat" ]] || return 1
    state=$(sed -e 's/^.*) //' "/proc/$1/stat" 2>/dev/null | cut -c1) || return 1
    [[ -n "$state" && "$state" != "Z" && "$state" != "X" ]]
}

cleanup() {
    local status=$?
    if [[ -f "$DATA/postmaster.pid" ]]; then
        PG_PID=$(head -n 1 "$DATA/postmaster.pid" 2>/dev/null || true)
    fi
    if [[ -n "$PG_PID" ]] && alive "$PG_PID"; then
        # SIGINT is PostgreSQL's "fast" shutdown: roll back open sessions and exit.
        kill -INT "$PG_PID" 2>/dev/null || true
        for _ in $(seq 1 60); do alive "$PG_PID" || break; sleep 0.5; done
        if alive "$PG_PID"; then
            log "postgres (pid $PG_PID) did not stop in 30s; killing it"
            kill -KILL "$PG_PID" 2>/dev/null || true
        fi
    fi
    if [[ -n "$LAUNCH_PID" ]]; then
        # With runuser the child is runuser itself; reap it either way.
        kill -TERM "$LAUNCH_PID" 2>/dev/null || true
        wait "$LAUNCH_PID" 2>/dev/null || true
    fi
    rm -rf "$TMP"
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

mkdir -p "$SOCK"
PASSWORD=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
printf '%s\n' "$PASSWORD" >"$TMP/pwfile"
chmod 700 "$TMP" "$SOCK"
chmod 600 "$TMP/pwfile"
if [[ ${#RUN_AS[@]} -gt 0 ]]; then
    chown -R "$PG_USER" "$TMP"
fi

# Local socket connections (only the server's user and root can reach the 0700 socket
# dir) are trusted; TCP needs the random password.
as_pg "$BINDIR/initdb" -D "$DATA" -U keel --pwfile="$TMP/pwfile" \
    --auth-local=trust --auth-host=scram-sha-256 -E UTF8 --locale=C --no-sync \
    >"$TMP/initdb.log" 2>&1 || { cat "$TMP/initdb.log" >&2; die "initdb failed"; }
rm -f "$TMP/pwfile"

free_port() {
    if command -v python3 >/dev/null; then
        python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
    else
        echo $((20000 + RANDOM % 40000))
    fi
}

# postgres runs as a child of this script (not daemonised by pg_ctl) so that we know its
# PID from the start and reap it ourselves when it stops.
start_postgres() {
    local port=$1
    # fsync off etc.: the cluster is deleted afterwards, so durability buys nothing.
    (cd "$TMP" && exec "${RUN_AS[@]}" "$BINDIR/postgres" -D "$DATA" \
        -c listen_addresses=127.0.0.1 -p "$port" -k "$SOCK" \
        -c fsync=off -c synchronous_commit=off -c full_page_writes=off \
        >>"$TMP/postgres.log" 2>&1 </dev/null) &
    LAUNCH_PID=$!
    for _ in $(seq 1 120); do
        if ! alive "$LAUNCH_PID"; then
            wait "$LAUNCH_PID" 2>/dev/null || true
            LAUNCH_PID=""
            return 1
        fi
        if "$BINDIR/pg_isready" -q -h "$SOCK" -p "$port"; then
            return 0
        fi
        sleep 0.5
    done
    return 1
}

# A free port can be taken between choosing and binding it: try a few.
started=""
for _ in 1 2 3 4 5; do
    PORT=$(free_port)
    if start_postgres "$PORT"; then
        started=1
        break
    fi
    log "start on port $PORT failed; retrying"
done
if [[ -z "$started" ]]; then
    tail -n 30 "$TMP/postgres.log" >&2 || true
    die "could not start postgres"
fi
PG_PID=$(head -n 1 "$DATA/postmaster.pid")

as_pg "$BINDIR/createdb" -h "$SOCK" -p "$PORT" -U keel keel_test

export KEEL_TEST_POSTGRES_URL="postgresql+psycopg://keel:$PASSWORD@127.0.0.1:$PORT/keel_test"
log "postgres pid $PG_PID on 127.0.0.1:$PORT (data in $TMP)"

# The command runs in the background so that a TERM or INT sent to this script is passed
# on to it at once (bash defers traps while a foreground child runs); stdin is passed on
# explicitly because background jobs otherwise get /dev/null.
CMD_PID=""
forward() { [[ -n "$CMD_PID" ]] && kill -"$1" "$CMD_PID" 2>/dev/null || true; }
trap 'forward TERM' TERM
trap 'forward INT' INT
"$@" <&0 &
CMD_PID=$!
while :; do
    set +e
    wait "$CMD_PID"
    status=$?
    set -e
    # A trapped signal interrupts wait (status > 128) before the command has exited.
    alive "$CMD_PID" || break
done
exit "$status"
