#!/usr/bin/env bash
# System packages the test suite needs, installed only when missing (safe to run again and again).
# `make test` runs it. One line per need: "<Debian package> <command that proves it is installed>  # who".
set -euo pipefail

PACKAGES=(
  "nginx-light       nginx"      # data: remote files behind a real HTTP server
  "iproute2          ip"         # launch: two network namespaces act as two nodes
  "chromium          chromium"   # doctor: the HTML report is opened in a real headless browser
  "tmux              tmux"       # doctor: the terminal report is read in a real 80- and 120-column terminal
)

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

missing=()
for entry in "${PACKAGES[@]}"; do
  read -r pkg cmd _ <<<"$entry"
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
