#!/usr/bin/env bash
# `make gpu-check` (issue 16): every GPU check in ONE command, sized for one call of the device tool (at most
# 10 minutes a command, no network on its machine). docs/bench.md ("The GPU run") gives the exact call.
#
# Parts, in order, each under its own time limit; a part that fails or runs out of time does not stop the next:
#   setup      the machine's own python3 (torch with CUDA is preinstalled there) + turbotrain from this tree,
#              `pip install --no-index --no-deps --no-build-isolation -e .` (else PYTHONPATH=src), plus any
#              wheels carried in .whl/ (scripts/gpu_wheels.sh); lists what `.[all,test]` lacks (scripts/gpu_deps.py)
#   env        nvidia-smi, torch and the device's two ceilings (bf16 matmul TFLOP/s, copy GB/s), `turbotrain env --json`
#              (table and --json), the dependency list, pip freeze: all into $OUT/env.txt
#   pytest     `pytest -m gpu` over the test files that mark tests gpu -> $OUT/junit-gpu.xml
#   bench-gpt  `turbotrain bench --workload gpt`  (GPT-2 124M, 1024 tokens: naive, each speed-up, fast, tuned, MFU)
#   bench-cnn  `turbotrain bench --workload cnn`  (ResNet-50 at 224x224)
#   extras     benchmarks/gpu_extras.py: the Trainer's per-step cost against a plain loop, device prefetch's
#              wait on copies, host syncs per step (set_sync_debug_mode); its tables go at the end of bench.md
#              (default --parts overhead syncs; "--parts overhead prefetch syncs doctor" for all four)
#   doctor     `turbotrain doctor --fix --verify` on $GPU_CHECK_DOCTOR_SCRIPTS (default gpu_habits.py): the
#              patch and its verified speed-up on the GPU (needs libcst: carry .whl from scripts/gpu_wheels.sh)
#   probe      (not in the default list) benchmarks/gpu_gpt_probe.py --short: each SDPA backend at GPT-2's shape,
#              a plain compiled loop at batch 64 and its profile (what limits MFU, without turbotrain in the way)
#
# What comes back ($OUT, at most 8 files): gpu-check.log (everything, each line stamped [part +seconds]),
# summary.txt, env.txt, junit-gpu.xml, bench.md (the bench tables, to paste into docs/benchmarks.md),
# bench.json ({workload: the --json of its run}), results.tar.gz (per-workload JSON, markdown and PNG plot;
# doctor JSON; pip's install log). The exit status is non-zero when any part failed.
#
# Knobs (environment): OUT (default runs/gpu-check), GPU_CHECK_PARTS, GPU_CHECK_BUDGET_S (465: the whole run
# ends by then, inside the 8 minutes a session's one full call may take, kills and the copy back included), GPU_CHECK_BENCH_ARGS (an empty
# string: the bench's own defaults), GPU_CHECK_BENCH_S / GPU_CHECK_PYTEST_S (a part's cap), GPU_CHECK_PYTEST_ARGS
# (e.g. --collect-only -q), GPU_CHECK_PYTHON (python3), GPU_CHECK_INSTALL=0 (no pip install: PYTHONPATH=src),
# GPU_CHECK_DEVICE (cuda) and GPU_CHECK_ALLOW_CPU=1, for a dry run on a machine without a GPU; GPU_CHECK_WORK (a
# work dir that is kept; by default a temporary one, removed at the end).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
ROOT=$PWD
SELF="$ROOT/scripts/gpu_check.sh"

# ---------------------------------------------------------------- the parts (each runs in a child process)

section() { printf '\n===== %s\n' "$*"; }

part_setup() {
  local rc=0
  echo "python: $(command -v "$PY" || echo "$PY: not found")"
  "$PY" - <<'EOF' || { echo "setup: no CUDA device seen by torch"; [ "$ALLOW_CPU" = 1 ] || rc=1; }
import sys
import torch
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}")
ok = torch.cuda.is_available()
print(f"CUDA available: {ok}" + (f", {torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}" if ok else ""))
sys.exit(0 if ok else 3)
EOF
  if [ "$INSTALL" != 1 ] && compgen -G ".whl/*.whl" >/dev/null; then
    # A dry run: the wheels are built for the device's Python (scripts/gpu_wheels.sh), not this one's.
    echo "setup: dry run (GPU_CHECK_INSTALL=0): the carried wheels in .whl/ are not installed"
  elif compgen -G ".whl/*.whl" >/dev/null; then
    echo "installing the carried wheels: $(cd .whl && echo *.whl)"
    # GPU_CHECK_INSTALL=0 (a dry run in a venv of this machine) leaves $PY's environment alone.
    if [ "$INSTALL" != 1 ] || ! "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir .whl/*.whl; then
      echo "setup: installing the wheels to $WORK/site (PYTHONPATH), not into $PY's environment"
      "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$WORK/site" \
        .whl/*.whl || rc=1
      echo "export PYTHONPATH=\"$WORK/site\${PYTHONPATH:+:\$PYTHONPATH}\"" >>"$WORK/env.sh"
    fi
  fi
  # --no-build-isolation builds with the image's own setuptools: pyproject.toml's license string needs >= 77.
  "$PY" -c "import setuptools; print('setuptools', setuptools.__version__)" 2>&1
  if [ "$INSTALL" = 1 ] && "$PY" -m pip install -q --no-index --no-deps --no-build-isolation -e . \
       >"$WORK/pip-install.log" 2>&1; then
    echo "turbotrain: installed editable from $ROOT (no dependencies, no network)"
  else
    if [ "$INSTALL" = 1 ]; then
      grep -E "error|Error" "$WORK/pip-install.log" | tail -5
      echo "setup: pip install -e . failed (the lines above; all of it in results.tar.gz); importing turbotrain from src/"
    fi
    echo "export PYTHONPATH=\"$ROOT/src\${PYTHONPATH:+:\$PYTHONPATH}\"" >>"$WORK/env.sh"
  fi
  # shellcheck disable=SC1091
  source "$WORK/env.sh"
  "$PY" -c "import os, turbotrain; p = turbotrain.__file__; print('turbotrain imported from', p); \
assert p.startswith(os.path.join(os.getcwd(), 'src')), 'not this tree'" || rc=1
  "$PY" -m turbotrain --help >/dev/null || { echo "setup: python -m turbotrain --help failed"; rc=1; }
  "$PY" scripts/gpu_deps.py
  return $rc
}

part_env() {
  local rc=0
  {
    section "machine"
    date -u; uname -a; echo "cores: $(nproc)"; free -g; df -h /tmp . 2>/dev/null
    section "nvidia-smi"
    if command -v nvidia-smi >/dev/null; then
      nvidia-smi
      nvidia-smi --query-gpu=name,memory.total,driver_version,pstate,clocks.sm,clocks.max.sm,clocks.mem,power.draw,power.limit,temperature.gpu,utilization.gpu --format=csv
    else
      echo "nvidia-smi: not found"; [ "$ALLOW_CPU" = 1 ] || rc=1
    fi
    section "tools"
    for t in nvcc ncu make gcc g++ nginx; do printf '%-6s %s\n' "$t" "$(command -v "$t" || echo missing)"; done
    command -v nvcc >/dev/null && nvcc --version | tail -2
    section "torch and the device's two ceilings (METHOD.md: measure them once)"
    "$PY" - <<'EOF' || rc=1
import statistics
import torch
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}, "
      f"threads {torch.get_num_threads()}")
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print(f"{p.name}: capability {p.major}.{p.minor}, {p.multi_processor_count} SMs, "
          f"{p.total_memory / 2**30:.1f} GiB, L2 {getattr(p, 'L2_cache_size', 0) / 2**20:.0f} MiB, "
          f"bf16 {torch.cuda.is_bf16_supported()}")

    def median_ms(fn, warmup=3, reps=10):
        for _ in range(warmup):
            fn()
        times = []
        for _ in range(reps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record(); fn(); end.record(); end.synchronize()
            times.append(start.elapsed_time(end))
        return statistics.median(times)

    n = 8192  # random data, never zeros (METHOD.md)
    a, b = (torch.randn(n, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    ms = median_ms(lambda: a @ b)
    print(f"bf16 matmul {n}^3: {ms:.3f} ms median of 10 = {2 * n**3 / ms / 1e9:.0f} TFLOP/s")
    x = torch.randn(2**28, device="cuda")  # 1 GiB of fp32
    y = torch.empty_like(x)
    ms = median_ms(lambda: y.copy_(x))
    print(f"device copy of 1 GiB: {ms:.3f} ms median of 10 = {2 * x.numel() * 4 / ms / 1e6:.0f} GB/s "
          "(bytes read + written)")
    del a, b, x, y
else:
    print("no CUDA device: no ceilings measured")
EOF
    # --json alone: the table holds the same facts, and each run of the command took 13-15 s on an H200.
    section "turbotrain env --json"
    "$PY" -m turbotrain env --json || rc=1
    section "dependencies of .[all,test] (scripts/gpu_deps.py)"
    "$PY" scripts/gpu_deps.py
    section "pip freeze"
    "$PY" -m pip freeze 2>&1
    exit $rc
  } 2>&1 | tee "$OUT/env.txt"
  return "${PIPESTATUS[0]}"
}

part_pytest() {
  local files args
  mapfile -t files < <(grep -rlE --include='*.py' 'mark\.gpu' tests | sort)
  echo "test files that mark tests gpu: ${files[*]}"
  args=(-m gpu -p no:cacheprovider --durations 15 --junitxml "$OUT/junit-gpu.xml")
  # Several test files at once on the one GPU: most of the part's time is compiling and process start-up on
  # a 16-core host, not the GPU. No GPU test times a switch, so sharing the device changes no verdict.
  local workers=${GPU_CHECK_PYTEST_WORKERS:-4}
  if [ "$DEVICE" != cpu ] && [ "$workers" -gt 1 ] && "$PY" -c "import xdist" 2>/dev/null; then
    args+=(-n "$workers" --dist loadfile)
  fi
  if "$PY" -c "import pytest_timeout" 2>/dev/null; then
    args+=(--timeout "${GPU_CHECK_TEST_TIMEOUT:-120}")
  fi
  # shellcheck disable=SC2086 # GPU_CHECK_PYTEST_ARGS is a list of options
  "$PY" -m pytest "${args[@]}" ${GPU_CHECK_PYTEST_ARGS:-} "${files[@]}"
}

part_bench() {
  local w=$1
  # shellcheck disable=SC2086 # BENCH_ARGS is a list of options
  "$PY" -m turbotrain bench --workload "$w" --device "$DEVICE" --json "$WORK/bench-$w.json" \
    --markdown "$WORK/bench-$w.md" --plot "$WORK/bench-$w.png" $BENCH_ARGS
}

part_extras() {
  # shellcheck disable=SC2086 # EXTRAS_ARGS is a list of options
  "$PY" benchmarks/gpu_extras.py --device "$DEVICE" --json "$WORK/extras.json" --markdown "$WORK/extras.md" \
    --doctor-timeout 60 $EXTRAS_ARGS
}

part_doctor() {
  local rc=0 s
  for s in ${GPU_CHECK_DOCTOR_SCRIPTS:-tests/doctor/scripts/gpu_habits.py}; do
    section "turbotrain doctor $s"
    # shellcheck disable=SC2086
    local name
    name=$(basename "$s" .py)
    # shellcheck disable=SC2086
    "$PY" -m turbotrain doctor --json "$WORK/doctor-$name.json" --fix "$WORK/doctor-$name.patch" \
      ${GPU_CHECK_DOCTOR_ARGS---verify --verify-budget 25} "$s" || rc=1
    [ -s "$WORK/doctor-$name.patch" ] && cat "$WORK/doctor-$name.patch"
  done
  return $rc
}

part_probe() {
  if [ "$DEVICE" = cpu ]; then
    echo "probe: a CUDA-only probe, not run on the CPU (dry run)"
    return 0
  fi
  "$PY" benchmarks/gpu_gpt_probe.py --short
}

if [ "${1:-}" = "--part" ]; then
  # shellcheck disable=SC1091
  source "$WORK/env.sh"
  case $2 in
    bench-*) part_bench "${2#bench-}" ;;
    *) "part_$2" ;;
  esac
  exit
fi

# ---------------------------------------------------------------- the driver

export OUT=${OUT:-runs/gpu-check}
export PY=${GPU_CHECK_PYTHON:-python3}
export DEVICE=${GPU_CHECK_DEVICE:-cuda}
export ALLOW_CPU=${GPU_CHECK_ALLOW_CPU:-0}
export INSTALL=${GPU_CHECK_INSTALL:-1}
# Sized to end with the rest inside one 8-minute call (each GPT-2 / ResNet-50 compile is cold once per plan):
# naive, fast and tuned on both paths (--no-ablation; the rows of each switch alone were recorded on an H100);
# set it to "" for the bench's own defaults (every row, 20 steps, 3 repeats, a 60-s tuner) in a call of its own.
# Part times on an H200 (2026-11-28, one call of every part, 471 s): setup 20 s, env 15 s, pytest 54 s (4 workers),
# bench-gpt 107 s and bench-cnn 131 s (each with the 50-s tuner), doctor on gpu_habits.py 69 s, extras 41 s+ (cut at
# 40 s: its limit is now 70). The compile doctor on a GPU is in pytest -m gpu; its CLI run took over 70 s.
export BENCH_ARGS=${GPU_CHECK_BENCH_ARGS---no-ablation --repeats 2 --steps 8 --warmup 2 --min-time 0.3 --tune-budget 50}
export EXTRAS_ARGS=${GPU_CHECK_EXTRAS_ARGS:---parts overhead syncs}
BUDGET=${GPU_CHECK_BUDGET_S:-470}
read -r -a PARTS <<<"${GPU_CHECK_PARTS:-setup env pytest bench-gpt bench-cnn doctor extras}"
# Every other part runs what setup installs, and a lent machine starts bare: setup always comes first.
if [ "${PARTS[0]:-}" != setup ]; then
  rest=()
  for p in "${PARTS[@]}"; do [ "$p" = setup ] || rest+=("$p"); done
  PARTS=(setup "${rest[@]}")
fi

cap_of() {
  case $1 in
    setup) echo "${GPU_CHECK_SETUP_S:-40}" ;;
    env) echo "${GPU_CHECK_ENV_S:-35}" ;;
    pytest) echo "${GPU_CHECK_PYTEST_S:-110}" ;;
    bench-*) echo "${GPU_CHECK_BENCH_S:-150}" ;;
    doctor) echo "${GPU_CHECK_DOCTOR_S:-80}" ;;
    extras) echo "${GPU_CHECK_EXTRAS_S:-70}" ;;
    probe) echo "${GPU_CHECK_PROBE_S:-60}" ;;
  esac
}
# Seconds held back for each later part, so that one slow part cannot starve all the others.
reserve_of() {
  case $1 in
    setup) echo 20 ;; env) echo 15 ;; pytest) echo 60 ;; bench-*) echo 110 ;; doctor) echo 70 ;; extras) echo 45 ;;
    probe) echo 40 ;;
  esac
}

for p in "${PARTS[@]}"; do  # a typo must cost no device minute
  case $p in
    setup | env | pytest | doctor | extras | probe | bench-gpt | bench-cnn | bench-mlp | bench-data) ;;
    *) echo "gpu-check: unknown part '$p' (setup env pytest bench-gpt bench-cnn bench-mlp bench-data extras doctor probe)" >&2; exit 2 ;;
  esac
done

mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd) || exit 2
if [ -n "${GPU_CHECK_WORK:-}" ]; then
  export WORK=$GPU_CHECK_WORK
else  # a work dir of its own, gone at the end: what is worth keeping is packed into $OUT first
  export WORK; WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu-check.XXXXXX") || exit 2
  trap 'rm -rf "$WORK"' EXIT
fi
mkdir -p "$WORK" && : >"$WORK/env.sh"
export PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1 MPLBACKEND=Agg HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export TURBOTRAIN_CACHE="$WORK/turbotrain-cache"  # the tuner starts from nothing, as on a fresh machine

LOG="$OUT/gpu-check.log"
exec > >(tee "$LOG") 2>&1
TEE_PID=$!
START=$SECONDS
echo "gpu-check: parts ${PARTS[*]}; budget ${BUDGET}s; OUT=$OUT; work dir $WORK; $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
if commit=$(git rev-parse --short HEAD 2>/dev/null); then
  commit="commit $commit$(git diff --quiet HEAD 2>/dev/null || echo ' + uncommitted changes')"
else
  commit="no git metadata in this copy of the tree"
fi
echo "gpu-check: $commit; bench args: ${BENCH_ARGS:-(none: the bench defaults)}"

stamp() {
  local line
  while IFS= read -r line || [ -n "$line" ]; do
    printf '[%s +%ds] %s\n' "$1" $((SECONDS - START)) "$line"
  done
}

SUMMARY=()
FAILED=()
for i in "${!PARTS[@]}"; do
  p=${PARTS[$i]}
  held=0
  for q in "${PARTS[@]:$((i + 1))}"; do held=$((held + $(reserve_of "$q"))); done
  left=$((BUDGET - (SECONDS - START) - held))
  cap=$(cap_of "$p")
  limit=$((left < cap ? left : cap))
  began=$SECONDS
  if [ "$limit" -lt 10 ]; then
    status="SKIPPED (a ${limit}s limit: the ${BUDGET}s budget is spent)"
  else
    echo "gpu-check: ---- $p (limit ${limit}s)"
    timeout -k 10 "$limit" bash "$SELF" --part "$p" 2>&1 | stamp "$p"
    rc=${PIPESTATUS[0]}
    case $rc in
      0) status="ok" ;;
      124 | 137) status="TIMEOUT at ${limit}s" ;;
      *) status="FAILED (exit $rc)" ;;
    esac
  fi
  [ "$status" = ok ] || FAILED+=("$p")
  SUMMARY+=("$(printf '%-10s %5ds  %s' "$p" $((SECONDS - began)) "$status")")
done

# ---------------------------------------------------------------- what comes back (at most 8 files in $OUT)
shopt -s nullglob
mds=("$WORK"/bench-*.md "$WORK"/extras.m[d])
if [ ${#mds[@]} -gt 0 ]; then
  for f in "${mds[@]}"; do printf '<!-- %s -->\n' "$(basename "$f")"; cat "$f"; echo; done >"$OUT/bench.md"
fi
jsons=("$WORK"/bench-*.json)
if [ ${#jsons[@]} -gt 0 ]; then
  "$PY" - "$OUT/bench.json" "${jsons[@]}" <<'EOF' || echo "gpu-check: could not combine the bench JSON"
import json
import sys
from pathlib import Path

runs = {Path(p).stem.removeprefix("bench-"): json.loads(Path(p).read_text()) for p in sys.argv[2:]}
Path(sys.argv[1]).write_text(json.dumps(runs, indent=1))
EOF
fi
kept=()
for f in "$WORK"/bench-* "$WORK"/extras.* "$WORK"/doctor[-_]* "$WORK"/pip-install.log; do [ -e "$f" ] && kept+=("$(basename "$f")"); done
if [ ${#kept[@]} -gt 0 ]; then
  tar czf "$OUT/results.tar.gz" -C "$WORK" "${kept[@]}" || echo "gpu-check: could not pack ${kept[*]}"
fi

{
  echo "gpu-check summary ($((SECONDS - START))s of a ${BUDGET}s budget; $(date -u '+%Y-%m-%d %H:%M:%S UTC')):"
  printf '  %s\n' "${SUMMARY[@]}"
  echo "files in $OUT: $(cd "$OUT" && echo *)"
  if [ ${#FAILED[@]} -eq 0 ]; then
    echo "gpu-check: every part ok"
  else
    echo "gpu-check: FAILED parts: ${FAILED[*]}"
  fi
} | tee "$OUT/summary.txt"

exec >&- 2>&-
wait "$TEE_PID" 2>/dev/null
[ ${#FAILED[@]} -eq 0 ]
