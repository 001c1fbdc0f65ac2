#!/usr/bin/env bash
# The population engine and the device step on a GPU machine: `bash scripts/population_device_bench.sh [FLAGS]`.
# Runs nvidia-smi -L (if present), then `python -m agents.population.bench --device cuda`, MountainCar, Elephant,
# against SB3's DQN on one CPU thread in the same run: the device step compiled and eager at P = 4,096, 16,384 and
# 1,024, and the batched engine at P = 1,024 (its reference); extra FLAGS go to the bench (e.g. --act relu). Then
# the plan of the paper's classic-control grid on this GPU (agents/grids/classic_paper.yml, --dry-run: populations,
# memory and the estimated time from each population's step timed here: 20 populations of 480 timed eagerly plus
# one compile of the device step: more than 60 s on an H200). Each step has a time limit (seconds: BENCH_S, default 240;
# PLAN_S, 180) and a step that fails or runs out is reported and the next one runs; PLAN_S=0 skips the plan. Each
# compiled size took 42-47 s to compile on an H200. With .venv/bin/python if there is
# one (else python3), from the repository root; DEVICE=cpu rehearses it on the CPU (SIZES, default
# 4096,16384,1024; STEPS, default 300). The output also goes to ${OUT:-.}/population_device_bench.txt and the
# bench's rows to ${OUT:-.}/population_device_bench*.json.
set -uo pipefail

mkdir -p "${OUT:-.}"
out="$(cd "${OUT:-.}" && pwd)"
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if [[ -x .venv/bin/python ]]; then py=.venv/bin/python; else py=python3; fi
device=${DEVICE:-cuda} sizes=${SIZES:-4096,16384,1024} steps=${STEPS:-300}
step() {  # step SECONDS JSON_FILE COMMAND...: run it with a time limit, its stdout to JSON_FILE
    local limit=$1 json=$2; shift 2
    local t0=$SECONDS
    timeout "$limit" "$@" > "$json"; local rc=$?
    echo "[$(( SECONDS - t0 )) s, exit $rc$( ((rc == 124)) && echo ", stopped at its ${limit} s limit")]"
}

{
    if command -v nvidia-smi >/dev/null 2>&1; then nvidia-smi -L; fi
    "$py" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
    step "${BENCH_S:-240}" "$out/population_device_bench.json" "$py" -m agents.population.bench --device "$device" \
        --sizes "$sizes" --steps "$steps" --implementations device-compiled,device --json "$@"
    step "${BENCH_S:-240}" "$out/population_device_bench_batched.json" "$py" -m agents.population.bench \
        --device "$device" --sizes "${sizes##*,}" --steps "$steps" --implementations batched --json "$@"
    if (( ${PLAN_S:-180} > 0 )); then
        step "${PLAN_S:-180}" /dev/null "$py" -m agents.grid agents/grids/classic_paper.yml --out "$(mktemp -d)" \
            --axis device="$device" --workers 4 --dry-run
    fi
} 2>&1 | tee "$out/population_device_bench.txt"
