#!/usr/bin/env bash
# System packages the test suite needs, installed only when missing (safe to run again and again).
# One package per line in PACKAGES; `command -v` checks keep a machine that has them from touching apt.
#   nginx-light: the remote-data tests serve files over HTTP
#   chromium:    the doctor's HTML report is opened in a real headless browser (tests/doctor/test_reports.py)
set -euo pipefail

# package            command that proves it is installed
PACKAGES=(
  "nginx-light       nginx"
  "chromium          chromium"
)

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

missing=()
for entry in "${PACKAGES[@]}"; do
  read -r pkg cmd <<<"$entry"
  if ! command -v "$cmd" >/dev/null 2>&1 && [ ! -x "/usr/sbin/$cmd" ]; then
    missing+=("$pkg")
  fi
done

if [ "${#missing[@]}" -eq 0 ]; then
  exit 0
fi
echo "ci-deps: installing ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
