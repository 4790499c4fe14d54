#!/usr/bin/env bash
# System packages some tests need. Idempotent: installs only what is missing, and only where it can
# (root with apt-get); elsewhere it says what is missing and the tests that need it skip themselves.
# `make test` runs it. Add a line per need: "<command that must exist> <Debian package> <why>".
set -euo pipefail

NEEDS=(
  "ip iproute2 launch: two network namespaces act as two nodes (tests/launch/test_launch_multinode.py)"
)

missing=()
for need in "${NEEDS[@]}"; do
  read -r cmd pkg why <<<"$need"
  command -v "$cmd" >/dev/null 2>&1 || missing+=("$pkg")
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "ci-deps: not installing ${missing[*]} (needs root and apt-get); the tests that need them will skip" >&2
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}"
