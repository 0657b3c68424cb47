#!/usr/bin/env bash
# Runs the whole test suite against real redis-server processes, installing
# redis-server and redis-cli first when they are missing (Debian/Ubuntu:
# apt-get; macOS: brew).
set -euo pipefail
cd "$(dirname "$0")/.."

# redis-cli builds the test clusters; Debian ships it in redis-tools.
if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
  echo "redis-server or redis-cli is not on PATH; installing them..."
  if command -v apt-get >/dev/null 2>&1; then
    sudo=""
    [ "$(id -u)" -ne 0 ] && sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq redis-server redis-tools >/dev/null
  elif command -v brew >/dev/null 2>&1; then
    brew install redis
  else
    echo "cannot install redis-server here: install it by hand and run again" >&2
    exit 1
  fi
fi
redis-server --version

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

# --all-targets includes the benches (benches/*.rs, harness = false): run by
# cargo test rather than cargo bench they get no --bench argument and run
# their tiny configuration (LEASEHOLD_BENCH_QUICK), in the test profile, so
# CI checks that they build and run without a separate release build.
cargo test --workspace --all-targets "$@"
cargo test --workspace --doc

# The handle-versus-watchdog races under loom (every interleaving within
# loom's default preemption bound), in a target directory of its own so
# that the --cfg flag does not rebuild the rest.
RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom \
  cargo test -p leasehold-watchdog --lib loom
