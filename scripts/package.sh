#!/usr/bin/env bash
# Packages every published crate as crates.io would receive it, checks that
# the files a user needs are inside (licences, README, the Lua scripts), and
# builds each package from its own tarball.
#
# `cargo package --workspace` (cargo 1.90 or newer) packages the members
# together: each tarball is unpacked and built against the tarballs of its
# siblings, served from a temporary local registry (target/package/
# tmp-registry), since those versions are not on crates.io yet. That is the
# build a user gets after publishing, so the verification is kept on rather
# than skipped with --no-verify.
#
# Extra arguments go to cargo package, e.g. `scripts/package.sh --offline`
# when every dependency is already in the local cache.
set -euo pipefail
cd "$(dirname "$0")/.."

# leasehold-model is `publish = false`: it is never packaged.
published=(leasehold leasehold-core leasehold-redis leasehold-watchdog leasehold-cron leasehold-postgres leasehold-testkit leasehold-cli)

cargo_minor=$(cargo --version | sed -E 's/^cargo 1\.([0-9]+).*/\1/')
if [ "$cargo_minor" -lt 90 ]; then
  echo "cargo $(cargo --version) cannot package the workspace members together; use cargo 1.90 or newer" >&2
  exit 1
fi

# The files each package must hold, beyond its sources.
missing=0
for crate in "${published[@]}"; do
  listed=$(cargo package -p "$crate" --list --allow-dirty --quiet "$@")
  required=(LICENSE-MIT LICENSE-APACHE README.md)
  if [ "$crate" = leasehold-redis ]; then
    # Every script in the source tree, so a new one cannot be left out.
    for script in crates/leasehold-redis/src/scripts/*.lua; do
      required+=("src/scripts/$(basename "$script")")
    done
  fi
  for file in "${required[@]}"; do
    if ! grep -qxF "$file" <<<"$listed"; then
      echo "$crate: the package does not contain $file" >&2
      missing=1
    fi
  done
done
[ "$missing" -eq 0 ] || exit 1

# cargo unpacks the sibling tarballs it builds against into
# $CARGO_HOME/registry/src/<the temporary registry's hash>/ by name and
# version, and reuses that copy on the next run even when the tarball has
# changed since: a second run on one machine would verify against the
# first run's sources. Those copies are removed first (a local registry's
# folder name starts with '-'; crates.io's does not).
cargo_home=${CARGO_HOME:-$HOME/.cargo}
for crate in "${published[@]}"; do
  rm -rf "$cargo_home"/registry/src/-*/"$crate"-[0-9]*
done

# --allow-dirty: the check is about what goes into the packages, so it also
# runs on a working tree with uncommitted changes; `cargo publish` checks the
# tree itself.
cargo package --workspace --exclude leasehold-model --allow-dirty "$@"
