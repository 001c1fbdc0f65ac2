"""Shared test set-up: one torch thread (small ops are much slower with 2 threads on busy 2-core machines)."""

import torch

torch.set_num_threads(1)
