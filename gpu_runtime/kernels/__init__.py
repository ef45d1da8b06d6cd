"""Triton kernels for the GRPO trainer and the sampler, each with the torch path as its fallback.

Imports no Django, and nothing heavy at import time: triton is optional (`pip install -e .[gpu]`)
and the Triton functions live in `*_triton` modules that a wrapper imports on first use, so a
CPU-only process never imports triton through these modules. `selection.choose(device)` decides whether a caller
takes the Triton path or the torch path, and says why when it falls back.

- `linear_logprobs`: last hidden states and the LM head straight to chosen-token log-probs and
  the log-sum-exp, chunked over tokens and vocabulary (no [tokens x vocab] logits).
- `token_loss`: the GRPO per-token loss core (ratio, clipping, CISPO weight, KL k1/k3, masks,
  aggregation) with the clip counts and KL statistics of the policy audit.
- `sampling`: temperature / top-k / top-p / min-p filtering plus the inverse-CDF draw.
"""
