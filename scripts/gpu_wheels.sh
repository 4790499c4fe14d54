#!/usr/bin/env bash
# Wheels for the lent GPU machine, downloaded HERE (it has no network) into .whl/ (ignored by git), for
# the packages of `.[all,test]` that its image lacks. `scripts/gpu_check.sh` installs whatever lies in
# .whl/ with --no-index --no-deps; the device call must then name ".whl" in carry (64 MiB in all).
#
#   bash scripts/gpu_wheels.sh                  # the default list below
#   bash scripts/gpu_wheels.sh NAME==VERSION …  # others (name each dependency too: --no-deps)
#
# The image (KINDS.md of the device tool) is Python 3.12 with torch, pytest, pytest-timeout, numpy,
# pyyaml, rich, lightning, accelerate, transformers, fsspec, aiohttp, requests, pyarrow, matplotlib and
# tensorboard; it lacks libcst (`doctor --fix`), moto and s3fs (the s3:// tests, none of them marked gpu).
# None of these is needed by `pytest -m gpu` or the bench, so gpu-check runs without any wheel. torch
# itself cannot travel: a CUDA build of torch is far over the 64 MiB a call may carry, so the machine's
# own torch is used (scripts/gpu_deps.py says when it is not the Makefile's pin).
set -euo pipefail
cd "$(dirname "$0")/.."

# libcst 1.9.0: what the CPU venv has; its one dependency, pyyaml, is in the image.
DEFAULT=("libcst==1.9.0")
WANTED=("$@")
[ ${#WANTED[@]} -eq 0 ] && WANTED=("${DEFAULT[@]}")

mkdir -p .whl
PYTHON=${PYTHON:-python3}
PLATFORMS=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 \
         manylinux2014_x86_64 manylinux1_x86_64; do
  PLATFORMS+=(--platform "$p")
done
"$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${PLATFORMS[@]}" -d .whl "${WANTED[@]}"
# Two versions of one package stop the whole install on the machine: say so here.
dups=$(for w in .whl/*.whl; do basename "$w"; done | cut -d- -f1 | tr 'A-Z-' 'a-z_' | sort | uniq -d)
if [ -n "$dups" ]; then
  echo "gpu_wheels: more than one wheel of: $dups (remove the extra ones from .whl/)" >&2
  exit 1
fi
du -ch .whl/*.whl | tail -1
ls .whl
