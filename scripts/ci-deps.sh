#!/usr/bin/env bash
# System packages the test suite needs, installed only when missing (safe to run again and again).
#   chromium: the doctor's HTML report is opened in a real headless browser (tests/doctor/test_reports.py)
# Add a package by appending "<command> <debian-package>" to NEEDED.
set -euo pipefail

NEEDED=(
  "chromium chromium"
)

missing=()
for entry in "${NEEDED[@]}"; do
  read -r command package <<<"$entry"
  command -v "$command" >/dev/null 2>&1 || missing+=("$package")
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -eq 0 ]; then SUDO=""; else SUDO="sudo"; fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "ci-deps: missing ${missing[*]} and no apt-get here; install them by hand" >&2
  exit 1
fi
echo "ci-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq "${missing[@]}"
