#!/usr/bin/env bash
# The one test command (the README's, and CI's): set up ./.venv with the test extra, start a
# throwaway PostgreSQL server on loopback for the database-server tests, run pytest, stop it.
#
#   bash scripts/test.sh [pytest arguments...]     (AUTOTUNE_TEST_WORKERS=2: in two processes)
#
# The PostgreSQL tests take the server from AUTOTUNE_TEST_POSTGRES (a libpq URL such as
# postgresql://postgres@127.0.0.1:55432/postgres). Already set: that server is used and nothing
# is started. Else one is started here: its data directory lives in a temp dir, only 127.0.0.1
# can reach it (trust auth), and it is stopped and deleted on exit, whatever pytest's outcome.
# Where no server can be had (not root and no PostgreSQL installed), the PostgreSQL tests are
# skipped, except under CI=true, where that is an error: CI must run them, not skip them.
# The exit status is pytest's, or non-zero when setup fails.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh --test

PORT_FIRST=55432  # away from 5432, where a system-wide server may already listen
PORT_TRIES=100
tmp=""       # the throwaway dir: data directory, socket, server log
pg_bin=""    # the directory holding initdb and pg_ctl
as_owner=()  # prefix that runs a command as the server's OS user (initdb refuses root)
why=""       # why no server could be started, for the one line that says so

say() { echo "scripts/test.sh: $*" >&2; }

# Debian keeps the server programs off PATH, in /usr/lib/postgresql/<major>/bin; take the newest.
find_pg_bin() {
  local dir
  for dir in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r) \
             "$(dirname "$(command -v initdb 2>/dev/null || echo /nonexistent/initdb)")"; do
    if [ -x "$dir/initdb" ] && [ -x "$dir/pg_ctl" ]; then pg_bin=$dir; return 0; fi
  done
  return 1
}

# A fresh CI machine has only the client: install Debian's server package. Needs root and apt;
# apt's output is shown only when it fails.
install_pg() {
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    why="PostgreSQL's server programs (initdb, pg_ctl) are not installed, and installing them needs root and apt-get"
    return 1
  fi
  local log; log=$(mktemp)
  say "installing PostgreSQL (apt-get install postgresql) for the database-server tests"
  if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql; } >"$log" 2>&1; then
    cat "$log" >&2; rm -f "$log"; why="apt-get install postgresql failed"; return 1
  fi
  rm -f "$log"
  find_pg_bin || { why="apt-get installed postgresql, but no initdb and pg_ctl under /usr/lib/postgresql/*/bin"; return 1; }
}

# Port 55432 unless taken (say, by a second run of this script); else the next free one.
free_port() {
  local port
  for ((port = PORT_FIRST; port < PORT_FIRST + PORT_TRIES; port++)); do
    if .venv/bin/python - "$port" 2>/dev/null <<'EOF'
import socket, sys
with socket.socket() as s:
    s.bind(("127.0.0.1", int(sys.argv[1])))
EOF
    then echo "$port"; return 0; fi
  done
  return 1
}

stop_pg() {
  local rc=$?
  if [ -n "$tmp" ]; then
    # immediate: the data is thrown away next, so there is nothing worth a clean shutdown.
    [ -f "$tmp/data/postmaster.pid" ] && "${as_owner[@]}" "$pg_bin/pg_ctl" -D "$tmp/data" -m immediate -w stop >/dev/null 2>&1
    rm -rf "$tmp"
  fi
  exit "$rc"  # pytest's status (or the setup's), not the clean-up's
}

# Starts the server and exports AUTOTUNE_TEST_POSTGRES; when it cannot, sets $why and returns 1.
start_pg() {
  find_pg_bin || install_pg || return 1
  if [ "$(id -u)" = 0 ]; then
    # initdb and postgres refuse to run as root: run them as the OS user Debian's package makes.
    id postgres >/dev/null 2>&1 || { why="running as root, and there is no 'postgres' OS user to run the server as"; return 1; }
    as_owner=(runuser -u postgres --)
  fi
  tmp=$(mktemp -d -t autotune-pg.XXXXXX) || { why="cannot make a temp dir"; return 1; }
  trap stop_pg EXIT
  trap 'exit 130' INT   # through the EXIT trap, so that Ctrl-C also stops the server
  trap 'exit 143' TERM
  [ "$(id -u)" = 0 ] && chown postgres: "$tmp"

  # -N, -F: no fsync; the data dies with the run, so crash safety only costs time.
  # The Unix socket goes in the throwaway dir too, so it cannot clash with a system server's.
  if ! "${as_owner[@]}" "$pg_bin/initdb" -D "$tmp/data" -U postgres -A trust -E UTF8 --locale=C -N >"$tmp/initdb.log" 2>&1; then
    cat "$tmp/initdb.log" >&2; why="initdb failed (its output is above)"; return 1
  fi
  # A free port can be taken between the check and the start (two runs at once): try another.
  local port attempt log
  for attempt in 1 2 3; do
    port=$(free_port) || { why="no free port in $PORT_FIRST-$((PORT_FIRST + PORT_TRIES - 1))"; return 1; }
    log="$tmp/server-$attempt.log"  # written by the server's OS user, so a new one each try
    "${as_owner[@]}" "$pg_bin/pg_ctl" -D "$tmp/data" -l "$log" -w -t 60 \
      -o "-F -h 127.0.0.1 -p $port -k '$tmp'" start >"$tmp/pg_ctl.log" 2>&1 && break
    if [ "$attempt" = 3 ] || ! grep -qs "could not bind" "$log"; then
      cat "$tmp/pg_ctl.log" "$log" >&2 2>/dev/null; why="the server did not start (its log is above)"; return 1
    fi
  done
  export AUTOTUNE_TEST_POSTGRES="postgresql://postgres@127.0.0.1:$port/postgres"
  say "PostgreSQL $("$pg_bin/pg_ctl" --version | awk '{print $3}') at $AUTOTUNE_TEST_POSTGRES (throwaway, stopped on exit)"
}

if [ -n "${AUTOTUNE_TEST_POSTGRES:-}" ]; then
  say "PostgreSQL tests use AUTOTUNE_TEST_POSTGRES=$AUTOTUNE_TEST_POSTGRES"
elif ! start_pg; then
  if [ "${CI:-}" = true ]; then
    say "error: no PostgreSQL server for the tests ($why); CI=true, where they must run, not be skipped"
    exit 1
  fi
  say "no PostgreSQL server ($why): the PostgreSQL tests will be skipped"
fi

# The HTML report's browser test opens the page in Debian's chromium (playwright drives it and
# never downloads a browser of its own). Installed here when missing and root can; without it
# that test is skipped, except under CI=true, where it fails.
if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    say "installing chromium (apt-get install chromium) for the HTML report's browser test"
    log=$(mktemp)
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } >"$log" 2>&1 \
      || { cat "$log" >&2; say "apt-get install chromium failed: the browser test will say so"; }
    rm -f "$log"
  else
    say "no chromium, and installing it needs root and apt-get: the browser test will be skipped"
  fi
fi

# The code's form first: ruff's formatter and linter (pyproject.toml holds their settings).
.venv/bin/ruff format --check --quiet . && .venv/bin/ruff check --quiet . || exit 1

# AUTOTUNE_TEST_WORKERS=N: N pytest processes (pytest-xdist), each test fetched as one frees up.
# One by default, in a fixed order: on 2 cores the suite is bound by the CPU (two processes took
# 10% off its time), and a fixed order keeps any failure reproducible.
# Not exec: the EXIT trap must still stop the server. `|| rc=$?` keeps set -e from exiting early.
rc=0
.venv/bin/python -m pytest -n "${AUTOTUNE_TEST_WORKERS:-0}" --dist worksteal "$@" || rc=$?
exit "$rc"
