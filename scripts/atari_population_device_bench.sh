#!/usr/bin/env bash
# Atari populations on a GPU machine: `bash scripts/atari_population_device_bench.sh [FLAGS]`.
# Runs nvidia-smi -L (if present), then `python -m agents.population.bench --env ALE/Breakout-v5 --device cuda`
# at P = 1, 5, 15 and 32 (vmap: one call of the members' stacked networks per step and per update; loop:
# one call per member) against a single run of `agents.train dqn --set atari_env=ale-vector` in the same process (on the
# GPU), with memory per member and the paper's Atari DQN study's projected hours at the best rate; the same for
# Rainbow at P = 1, 4 and 16; then DQN with three activations as sub-populations of one population (P = 6 and 15,
# vmap; against P = 5 and 15 of one activation above); then DQN with its frames on the GPU (--set frames_on=device,
# P = 8 and 15, vmap, the paper's 1e6 buffer: 7.1 GB of GPU memory per member, so FRAMES_SIZES=4,8 on an 80 GB
# card); extra FLAGS go to the first two benches (e.g. --act relu), MIXED_SIZES and FRAMES_SIZES set the others'
# sizes. Then the study's plan on this machine
# (agents/grids/atari_study.yml, --dry-run, --workers 4: populations, memory, hours from each population's step
# timed here). Each step has a time limit (seconds: BENCH_S, default 150; PLAN_S, 90) and a step that fails or
# runs out is reported and the next one runs; PLAN_S=0 skips the plan. With .venv/bin/python if there is one (else
# python3), from the repository root; DEVICE=cpu rehearses it on the CPU (SIZES, RAINBOW_SIZES, STEPS: default
# 300). The output also goes to ${OUT:-.}/atari_population_device_bench.txt and the bench's rows to
# ${OUT:-.}/atari_population_device_bench.json (Rainbow: atari_population_device_bench_rainbow.json; the mixed
# activations: atari_population_device_bench_mixed.json; frames on the GPU: atari_population_device_bench_frames.json).
set -uo pipefail

mkdir -p "${OUT:-.}"
out="$(cd "${OUT:-.}" && pwd)"
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if [[ -x .venv/bin/python ]]; then py=.venv/bin/python; else py=python3; fi
device=${DEVICE:-cuda} steps=${STEPS:-300}
step() {  # step SECONDS JSON_FILE COMMAND...: run it with a time limit, its stdout to JSON_FILE
    local limit=$1 json=$2; shift 2
    local t0=$SECONDS
    timeout "$limit" "$@" > "$json"; local rc=$?
    echo "[$(( SECONDS - t0 )) s, exit $rc$( ((rc == 124)) && echo ", stopped at its ${limit} s limit")]"
}

{
    if command -v nvidia-smi >/dev/null 2>&1; then nvidia-smi -L; fi
    "$py" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
    step "${BENCH_S:-150}" "$out/atari_population_device_bench.json" "$py" -m agents.population.bench \
        --env ALE/Breakout-v5 --device "$device" --sizes "${SIZES:-1,5,15,32}" --steps "$steps" \
        --implementations vmap,loop --json "$@"
    step "${BENCH_S:-150}" "$out/atari_population_device_bench_rainbow.json" "$py" -m agents.population.bench \
        --env ALE/Breakout-v5 --algo rainbow --device "$device" --sizes "${RAINBOW_SIZES:-1,4,16}" --steps "$steps" \
        --implementations vmap,loop --json "$@"
    step "${BENCH_S:-150}" "$out/atari_population_device_bench_mixed.json" "$py" -m agents.population.bench \
        --env ALE/Breakout-v5 --act elephant,relu,fta --device "$device" --sizes "${MIXED_SIZES:-6,15}" \
        --steps "$steps" --implementations vmap --json
    step "${BENCH_S:-150}" "$out/atari_population_device_bench_frames.json" "$py" -m agents.population.bench \
        --env ALE/Breakout-v5 --device "$device" --sizes "${FRAMES_SIZES:-8,15}" --steps "$steps" \
        --implementations vmap --set frames_on=device --json
    if (( ${PLAN_S:-90} > 0 )); then
        step "${PLAN_S:-90}" /dev/null "$py" -m agents.grid agents/grids/atari_study.yml --out "$(mktemp -d)" \
            --axis device="$device" --workers 4 --dry-run
    fi
} 2>&1 | tee "$out/atari_population_device_bench.txt"
