"""The Triton kernels of `gpu_runtime.kernels.linear_logprobs` (imported only when a kernel is first used).

Imports triton at the top: `triton.jit` reads TRITON_INTERPRET when it decorates, and kernels
that call other jitted functions resolve them as module globals, so they live in their own module.
"""

import triton
import triton.language as tl


@triton.jit
def lse_tile(logits, stride, targets, row_max, row_sum, target_logit, v_start, n_cols, inv_temp,
             BLOCK: tl.constexpr):
    # One program per row of the tile: fold its logits into the row's running max / sum-exp.
    row = tl.program_id(0)
    base = logits + row.to(tl.int64) * stride
    m = tl.load(row_max + row)
    s = tl.load(row_sum + row)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        z = tl.load(base + cols, mask=cols < n_cols, other=float("-inf")).to(tl.float32) * inv_temp
        new_m = tl.maximum(m, tl.max(z, axis=0))
        # A row that is -inf so far (or everywhere) must not turn exp(-inf - -inf) into NaN.
        safe_m = tl.where(new_m == float("-inf"), 0.0, new_m)
        s = s * tl.exp(m - safe_m) + tl.sum(tl.exp(z - safe_m), axis=0)
        m = new_m
    tl.store(row_max + row, m)
    tl.store(row_sum + row, s)
    t = tl.load(targets + row) - v_start
    if (t >= 0) & (t < n_cols):
        tl.store(target_logit + row, tl.load(base + t).to(tl.float32) * inv_temp)

@triton.jit
def grad_tile(logits, stride, targets, lse, g_lp, g_lse, v_start, n_cols, inv_temp, BLOCK: tl.constexpr):
    # d/dz of (g_lp * (z_y - lse) + g_lse * lse) is g_lp * onehot + (g_lse - g_lp) * softmax(z),
    # times inv_temp for z = logits * inv_temp; written over the tile in place.
    row = tl.program_id(0)
    base = logits + row.to(tl.int64) * stride
    row_lse = tl.load(lse + row)
    a = tl.load(g_lp + row)
    b = tl.load(g_lse + row)
    t = tl.load(targets + row) - v_start
    safe_lse = tl.where(row_lse == float("-inf"), 0.0, row_lse)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        inside = cols < n_cols
        z = tl.load(base + cols, mask=inside, other=float("-inf")).to(tl.float32) * inv_temp
        p = tl.exp(z - safe_lse)
        dz = (b - a) * p + tl.where(cols == t, a, 0.0)
        tl.store(base + cols, (dz * inv_temp).to(logits.dtype.element_ty), mask=inside)
