#!/usr/bin/env bash
# The core's benchmarks on a GPU machine: `bash scripts/device_bench.sh [BENCH FLAGS]` (e.g. --threads 4).
# Runs nvidia-smi -L (if present), `python -m interference.bench --device cuda`, the same with --patterns and
# `python -m agents.classinc.bench --device cuda`, with
# .venv/bin/python if there is one (else python3), from the repository root; the output also goes to
# ${OUT:-.}/device_bench.txt.
set -euo pipefail

mkdir -p "${OUT:-.}"
log="$(cd "${OUT:-.}" && pwd)/device_bench.txt"
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if [[ -x .venv/bin/python ]]; then py=.venv/bin/python; else py=python3; fi

{
    if command -v nvidia-smi >/dev/null 2>&1; then nvidia-smi -L; fi
    "$py" -m interference.bench --device cuda "$@"
    echo
    "$py" -m interference.bench --device cuda --patterns "$@"
    echo
    "$py" -m agents.classinc.bench --device cuda "$@"
} 2>&1 | tee "$log"
