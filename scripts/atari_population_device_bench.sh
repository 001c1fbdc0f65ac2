#!/usr/bin/env bash
# Atari populations on a GPU machine: `bash scripts/atari_population_device_bench.sh [FLAGS]`.
# Runs nvidia-smi -L (if present), then `python -m agents.population.bench --env ALE/Breakout-v5 --device cuda` at
# P = 1, 4, 8 and 16 (vmap: one call of the members' stacked networks per step and per update; loop: one call per
# member) against a single run of `agents.train dqn --set atari_env=ale-vector` in the same process (on the GPU),
# with memory per member and the paper's Atari DQN study's projected hours at the best rate; the same for Rainbow;
# extra FLAGS go to the bench (e.g. --act relu). Then the study's plan on this machine (agents/grids/atari_study.yml,
# --dry-run, --workers 4: populations, memory, hours from each population's step timed here). With .venv/bin/python
# if there is one (else python3), from the repository root; the output also goes to
# ${OUT:-.}/atari_population_device_bench.txt and the bench's rows to ${OUT:-.}/atari_population_device_bench.json
# (Rainbow: atari_population_device_bench_rainbow.json).
set -euo pipefail

mkdir -p "${OUT:-.}"
out="$(cd "${OUT:-.}" && pwd)"
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if [[ -x .venv/bin/python ]]; then py=.venv/bin/python; else py=python3; fi

{
    if command -v nvidia-smi >/dev/null 2>&1; then nvidia-smi -L; fi
    "$py" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
    "$py" -m agents.population.bench --env ALE/Breakout-v5 --device cuda --sizes 1,4,8,16 --steps 300 \
        --implementations vmap,loop --json "$@" > "$out/atari_population_device_bench.json"
    "$py" -m agents.population.bench --env ALE/Breakout-v5 --algo rainbow --device cuda --sizes 1,4,8,16 \
        --steps 300 --implementations vmap,loop --json "$@" > "$out/atari_population_device_bench_rainbow.json"
    "$py" -m agents.grid agents/grids/atari_study.yml --out "$(mktemp -d)" --axis device=cuda --workers 4 \
        --dry-run > /dev/null
} 2>&1 | tee "$out/atari_population_device_bench.txt"
