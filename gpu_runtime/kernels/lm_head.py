"""The lean forward's LM head through the fused linear log-probs kernel. Imports torch; no Django.

`lean_decoder.sequence_logprobs(..., head=fused_lm_logprobs)` takes this in place of
`lean_decoder.lm_logprobs`: final norm, then the chunked kernel, so a GRPO forward never holds
the [tokens x vocab] logits. A head with a bias (no Qwen3/Llama has one) keeps the torch path.
"""

from __future__ import annotations

from torch import Tensor

from gpu_runtime import lean_decoder
from gpu_runtime.kernels.linear_logprobs import linear_logprobs


def fused_lm_logprobs(plan, hidden: Tensor, targets: Tensor, temperature: Tensor | None = None) -> Tensor:
    """log p(targets) from pre-norm hidden states (..., H), as `lean_decoder.lm_logprobs` gives.

    With no bias, dividing the normed hidden state by the temperature divides the logits by it."""
    if plan.lm_head_bias is not None:
        return lean_decoder.lm_logprobs(plan, hidden, targets, temperature)
    normed = lean_decoder.rms_norm(hidden, plan.final_norm, plan.eps)
    if temperature is not None:
        normed = normed / temperature.to(normed.dtype)
    logprobs, _ = linear_logprobs(normed, plan.lm_head, targets)
    return logprobs
