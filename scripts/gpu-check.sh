#!/bin/sh
# scripts/gpu-check.sh OUTDIR — the CUDA backend's checks on a machine with a GPU, in one
# run, with every result written under OUTDIR: the device (nvidia-smi), the build, the CUDA
# tests (tests/engine/test_cuda_matmul, tests/engine/test_cuda, tests/integration/
# test_device) and the benchmark (build/cuda/bench/engine --device cuda: JSON lines in
# OUTDIR/bench.json).
#
# It builds with make CUDA=1 unless build/cuda already holds the programs: a GPU machine
# without the build packages runs programs built on a development machine with the same
# CUDA toolkit, copied into build/cuda, with their shared libraries in $LLMS_GPU_LIBS.
# The trained test models are read from $LLMS_TESTDATA (../shared/testdata by default).
# Random-weight benchmark models are generated here (build/bench-models), not copied.
#
#   GPU_CHECK_BENCH=0   skip the benchmark; GPU_CHECK_BENCH_ARGS adds to its arguments
#   LLAMA_BENCH=PATH    a llama-bench of llama.cpp's CUDA build (made elsewhere, never in
#                       this tree): each benchmark run is paired with one of its runs
set -u
out=${1:?usage: scripts/gpu-check.sh OUTDIR}
mkdir -p "$out" build
started=$(date +%s)
say() { echo "[gpu-check +$(($(date +%s) - started))s] $*"; }

nvidia-smi >"$out/nvidia-smi.txt" 2>&1 || say "nvidia-smi failed"
say "$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null)"

if [ -n "${LLMS_GPU_LIBS:-}" ]; then
    LD_LIBRARY_PATH="$LLMS_GPU_LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export LD_LIBRARY_PATH
fi
# cuBLAS where the toolkit is not at the rpath's /usr/local/cuda
if ! ldconfig -p 2>/dev/null | grep -q libcublas.so.13 && [ ! -e /usr/local/cuda/lib64/libcublas.so.13 ]; then
    lib=$(find / -name 'libcublas.so.13' -not -path '/proc/*' 2>/dev/null | head -1)
    [ -n "$lib" ] && LD_LIBRARY_PATH="$(dirname "$lib")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export LD_LIBRARY_PATH
fi
if [ ! -x build/cuda/tests/engine/test_cuda ]; then
    say "building (make CUDA=1)"
    if ! make CUDA=1 -j"$(nproc)" all tests >"$out/build.log" 2>&1; then
        tail -40 "$out/build.log"
        exit 1
    fi
fi
# bench/engine generates its models with build/mkmodel
[ -x build/mkmodel ] || ln -sf cuda/mkmodel build/mkmodel

status=0
for t in engine/test_cuda_matmul engine/test_cuda integration/test_device; do
    say "$t"
    timeout 300 "build/cuda/tests/$t" >"$out/${t#*/}.log" 2>&1
    rc=$?
    grep -E '^(#|  |bandwidth)' "$out/${t#*/}.log" | tail -80
    [ $rc -eq 0 ] || { say "$t failed (exit $rc)"; status=1; }
done

if [ "${GPU_CHECK_BENCH:-1}" != 0 ]; then
    say "bench/engine --device cuda"
    # shellcheck disable=SC2086
    timeout 420 build/cuda/bench/engine --device cuda -r 3 --prompt 512 --gen 128 \
        ${LLAMA_BENCH:+--llama-bench "$LLAMA_BENCH"} ${GPU_CHECK_BENCH_ARGS:-} \
        >"$out/bench.json" 2>"$out/bench.log"
    rc=$?
    tail -5 "$out/bench.log"
    cat "$out/bench.json"
    [ $rc -eq 0 ] || { say "bench failed (exit $rc)"; status=1; }
fi
say "done, status $status"
exit $status
