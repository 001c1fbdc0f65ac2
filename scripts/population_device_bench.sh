#!/usr/bin/env bash
# The population engine and the device step on a GPU machine: `bash scripts/population_device_bench.sh [FLAGS]`.
# Runs nvidia-smi -L (if present), then `python -m agents.population.bench --device cuda` at P = 1,024, 4,096 and
# 16,384 for the engine (batched) and the device step (eager and compiled), MountainCar, Elephant, against SB3's DQN
# on one CPU thread in the same run; extra FLAGS go to the bench (e.g. --act relu). Then the plan of the paper's
# classic-control grid on this GPU (agents/grids/classic_paper.yml, --dry-run: populations, memory and the estimated
# time from each population's step timed here). With .venv/bin/python if there is one (else python3), from the
# repository root; the output also goes to ${OUT:-.}/population_device_bench.txt and the bench's rows to
# ${OUT:-.}/population_device_bench.json.
set -euo pipefail

mkdir -p "${OUT:-.}"
out="$(cd "${OUT:-.}" && pwd)"
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if [[ -x .venv/bin/python ]]; then py=.venv/bin/python; else py=python3; fi

{
    if command -v nvidia-smi >/dev/null 2>&1; then nvidia-smi -L; fi
    "$py" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
    "$py" -m agents.population.bench --device cuda --sizes 1024,4096,16384 --steps 300 \
        --implementations batched,device,device-compiled --json "$@" > "$out/population_device_bench.json"
    "$py" -m agents.grid agents/grids/classic_paper.yml --out "$(mktemp -d)" --axis device=cuda --workers 4 \
        --dry-run > /dev/null
} 2>&1 | tee "$out/population_device_bench.txt"
