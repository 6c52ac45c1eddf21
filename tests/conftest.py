"""Test-wide settings: one intra-op thread. The suite runs mostly tiny tensors, for which
thread hand-offs cost more than they save, and CI machines are shared (2 cores)."""

import torch

torch.set_num_threads(1)
