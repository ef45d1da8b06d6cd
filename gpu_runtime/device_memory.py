"""What the GPU worker tells the web about its accelerator's memory, for the training memory
preflight (training.memory_preflight). Imports no Django.

The figure that matters is what a training step could use once this worker's other work ends:
the device's free memory plus what this process holds beyond the resident model (its allocator's
cache, a running step's activations, the sampler's KV caches), all of which a queued step gets back
before it starts (GPU jobs run one at a time). Memory other processes hold is not counted.
"""

from __future__ import annotations

import torch

MIB = 2**20


class AcceleratorMemory:
    """Reads the device's memory; built right after the model loads, so that what this process has
    allocated at that moment counts as the resident model."""

    def __init__(self, device: torch.device):
        self.device = device
        self.resident_bytes = torch.cuda.memory_allocated(device)

    def read(self) -> dict:
        free, total = torch.cuda.mem_get_info(self.device)
        held = torch.cuda.memory_reserved(self.device)
        available = free + max(0, held - self.resident_bytes)
        return {
            "device": str(self.device),
            "total_mib": round(total / MIB, 1),
            "free_mib": round(free / MIB, 1),
            "resident_model_mib": round(self.resident_bytes / MIB, 1),
            # What a queued training step could use (see the module docstring).
            "available_for_training_mib": round(available / MIB, 1),
        }
