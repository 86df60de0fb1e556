#!/usr/bin/env bash
# The GPU check of issues 25 and 36, on a fresh GPU machine with no network, in under 8 minutes:
#   benchmarks/gpu_check.sh OUT_DIR [WHEEL_DIR]
# installs the project's dependencies from the wheels in WHEEL_DIR (default: .whl beside the project) into
# /tmp/site, runs the device tests (the `cuda`-marked ones among them: training on the device, and the DPF servers'
# torch expansion against numpy's), benchmarks/round_speed.py --device cuda and benchmarks/dpf_cost.py --device
# cuda, and writes into OUT_DIR (flat, 8 files, the most a device run sends back): env.txt (with the install's
# log), pytest.log, round_speed.log, round_speed.json, round_speed.md, dpf_cost.log, dpf_cost.md, summary.txt.
# Every step has its own time limit, and each benchmark writes what it measured before it is stopped.
# Without a GPU it still runs end to end (device tests on the CPU, the benchmark's --quick CPU table) and
# summary.txt says which figures are unmeasured.
set -u -o pipefail
out=${1:?usage: benchmarks/gpu_check.sh OUT_DIR [WHEEL_DIR]}
root=$(cd "$(dirname "$0")/.." && pwd)
wheels=${2:-$root/.whl}
py=${PYTHON:-python3}
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$root"
start=$(date +%s)

{
    date -u
    uname -a
    nproc
    free -g 2>/dev/null
    nvidia-smi 2>&1 || echo "nvidia-smi: not found"
    $py -V
    $py -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda,
        "available", torch.cuda.is_available(), torch.cuda.get_device_name() if torch.cuda.is_available() else "")'
    git -C "$root" log -1 --format='commit %H %s' 2>/dev/null
} > "$out/env.txt" 2>&1

site=/tmp/site
if compgen -G "$wheels/*.whl" > /dev/null; then
    $py -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
        "$wheels"/*.whl >> "$out/env.txt" 2>&1 || echo "wheel install failed (see above)" >> "$out/env.txt"
else
    echo "no wheels in $wheels: using what $py already has" >> "$out/env.txt"
fi
# The source tree itself is importable (policies/ is found beside it); no pip resolution of dependencies.
export PYTHONPATH="$root:$site${PYTHONPATH:+:$PYTHONPATH}"
export FEDRECGEL_CACHE=/tmp/fedrecgel-cache
export CUBLAS_WORKSPACE_CONFIG=:4096:8  # deterministic cuBLAS (the device module sets it too, if unset)
$py -c 'import fedrecgel_secure.federation.trainer, fedrecgel_secure.privacy.dp.pld, pydantic, opacus, scipy; print("imports ok")' >> "$out/env.txt" 2>&1

gpu=$($py -c 'import torch; print(int(torch.cuda.is_available()))' 2>/dev/null || echo 0)

timeout 120 $py -m pytest -q -p no:cacheprovider -rs tests/federation/test_device.py tests/secagg/test_dpf_torch.py 2>&1 | tee "$out/pytest.log" | tail -3
tests_rc=$?

# BENCH_ARGS replaces the benchmark's arguments (e.g. BENCH_ARGS="--device cuda --shapes ml20m-shape --budget-s 30"
# to measure one shape longer in a second run).
if [ -n "${BENCH_ARGS:-}" ]; then
    read -r -a bench <<< "$BENCH_ARGS"
elif [ "$gpu" = 1 ]; then
    bench=(--device cuda --rounds 100 --budget-s 8 --cpu-rounds 5 --profile)
else
    bench=(--device cpu --quick --rounds 2 --budget-s 5 --cpu-rounds 1)
fi
left=$((285 - ($(date +%s) - start)))
timeout $((left > 30 ? left : 30)) $py benchmarks/round_speed.py "${bench[@]}" --out "$out" 2>&1 \
    | tee "$out/round_speed.log" | tail -15
bench_rc=$?

# The DPF servers' expansion (issue 36): FilmTrust's whole round and a client at the ML-20M and 1M shapes on the
# GPU (the table written after each shape); without one, the ML-20M shape on the CPU through torch.
if [ "$gpu" = 1 ]; then
    dpf=(--device cuda --shapes filmtrust,ml20m,1m)
else
    dpf=(--device cpu --shapes ml20m)
fi
timeout 150 $py benchmarks/dpf_cost.py "${dpf[@]}" --out "$out/dpf_cost.md" 2>&1 | tee "$out/dpf_cost.log" | tail -5
dpf_rc=$?

{
    echo "gpu_check: $(( $(date +%s) - start )) s; device tests exit $tests_rc; benchmark exit $bench_rc, dpf_cost exit $dpf_rc (124: timed out)"
    if [ "$gpu" = 1 ]; then
        echo "GPU: $($py -c 'import torch; print(torch.cuda.get_device_name())')"
        echo "Measured: see round_speed.md and dpf_cost.md; rows missing there were not reached in the time limit."
    else
        echo "No CUDA GPU was usable: the cuda tests were skipped and every GPU figure (per-round and per-100-round"
        echo "times on the device, peak GPU memory, the GPU-vs-CPU ratio) is UNMEASURED; round_speed.md holds a"
        echo "CPU smoke run of the big shapes at 1% of their users instead, and dpf_cost.md the torch path on the CPU."
    fi
} | tee "$out/summary.txt"
