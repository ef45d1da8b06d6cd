"""The Triton kernels of `gpu_runtime.kernels.token_loss` (imported only when a kernel is first used).

Imports triton at the top: `triton.jit` reads TRITON_INTERPRET when it decorates, and kernels
that call other jitted functions resolve them as module globals, so they live in their own module.
"""

import triton
import triton.language as tl


@triton.jit
def _token_values(lp, b, r, adv, s, low, high, max_w, kl_coeff, LEVEL: tl.constexpr,
                  RECORDED: tl.constexpr, KL_KIND: tl.constexpr):
    # (ratio, surrogate, d surrogate / d lp, unclipped, kl estimator, d kl / d lp) per token.
    if RECORDED:
        ratio = tl.exp(lp - b)
    else:
        ratio = tl.exp(lp - lp)
    if LEVEL == 1:  # GSPO: every token carries the row's sequence ratio s
        ratio = ratio * 0.0 + s
    if LEVEL == 2:
        weight = tl.minimum(ratio, max_w)
        surrogate = -(weight * adv * lp)
        d_surrogate = -(weight * adv)
        unclipped = ratio <= max_w
    else:
        unclipped = tl.where(adv >= 0, ratio <= high, ratio >= low)
        clamped = tl.minimum(tl.maximum(ratio, low), high)
        surrogate = -tl.where(unclipped, ratio * adv, clamped * adv)
        d_surrogate = tl.where(unclipped, -adv * ratio, 0.0)
    kd = lp - r
    if KL_KIND == 1:
        kl = kd
        d_kl = kd * 0.0 + 1.0
    elif KL_KIND == 2:
        kl = tl.exp(-kd) - 1.0 + kd
        d_kl = 1.0 - tl.exp(-kd)
    else:
        kl = kd * 0.0
        d_kl = kd * 0.0
    return ratio, surrogate, d_surrogate, unclipped, kl, d_kl

@triton.jit
def _sequence_ratio(policy, behavior, mask, row_base, n_cols, RECORDED: tl.constexpr,
                    BLOCK: tl.constexpr):
    total = 0.0
    count = 0.0
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        inside = cols < n_cols
        m = tl.load(mask + row_base + cols, mask=inside, other=0) != 0
        lp = tl.where(m, tl.load(policy + row_base + cols, mask=inside & m, other=0.0), 0.0)
        if RECORDED:
            b = tl.where(m, tl.load(behavior + row_base + cols, mask=inside & m, other=0.0), 0.0)
        else:
            b = lp
        total += tl.sum(tl.where(m, lp - b, 0.0), axis=0)
        count += tl.sum(m.to(tl.float32), axis=0)
    return tl.exp(total / tl.maximum(count, 1.0))

@triton.jit
def forward(policy, behavior, reference, mask, kl_mask, advantages, stats, n_cols, low, high, max_w,
            kl_coeff, LEVEL: tl.constexpr, RECORDED: tl.constexpr, HAS_REF: tl.constexpr,
            KL_KIND: tl.constexpr, KL_PENALTY: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    base = row.to(tl.int64) * n_cols
    adv = tl.load(advantages + row)
    s = 1.0
    if LEVEL == 1:
        s = _sequence_ratio(policy, behavior, mask, base, n_cols, RECORDED, BLOCK)
    n = 0.0
    surrogate_sum = 0.0
    kl_pen = 0.0
    ratio_sum = tl.zeros((), tl.float64)
    ratio_min = float("inf")
    ratio_max = float("-inf")
    below = 0.0
    above = 0.0
    clipped = 0.0
    lr_sum = tl.zeros((), tl.float64)
    est_sum = tl.zeros((), tl.float64)
    masked_est_sum = tl.zeros((), tl.float64)
    masked_n = 0.0
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        inside = cols < n_cols
        m = tl.load(mask + base + cols, mask=inside, other=0) != 0
        # Only action positions are read: padding (e.g. -inf) never reaches the maths.
        lp = tl.where(m, tl.load(policy + base + cols, mask=inside & m, other=0.0), 0.0)
        b = lp
        if RECORDED:
            b = tl.where(m, tl.load(behavior + base + cols, mask=inside & m, other=0.0), 0.0)
        r = lp
        km = m
        if HAS_REF:
            r = tl.where(m, tl.load(reference + base + cols, mask=inside & m, other=0.0), 0.0)
            km = m & (tl.load(kl_mask + base + cols, mask=inside, other=0) != 0)
        ratio, surrogate, _, unclipped, kl, _ = _token_values(
            lp, b, r, adv, s, low, high, max_w, kl_coeff, LEVEL, RECORDED, KL_KIND)
        n += tl.sum(m.to(tl.float32), axis=0)
        surrogate_sum += tl.sum(tl.where(m, surrogate, 0.0), axis=0)
        if LEVEL != 1:
            ratio_sum += tl.sum(tl.where(m, ratio, 0.0).to(tl.float64), axis=0)
            ratio_min = tl.minimum(ratio_min, tl.min(tl.where(m, ratio, float("inf")), axis=0))
            ratio_max = tl.maximum(ratio_max, tl.max(tl.where(m, ratio, float("-inf")), axis=0))
            if LEVEL == 0:
                below += tl.sum((m & (ratio < low)).to(tl.float32), axis=0)
                above += tl.sum((m & (ratio > high)).to(tl.float32), axis=0)
                clipped += tl.sum((m & ~unclipped).to(tl.float32), axis=0)
            else:
                above += tl.sum((m & (ratio > max_w)).to(tl.float32), axis=0)
                clipped += tl.sum((m & (ratio > max_w)).to(tl.float32), axis=0)
        if HAS_REF:
            lr_sum += tl.sum(tl.where(m, lp - r, 0.0).to(tl.float64), axis=0)
            est_sum += tl.sum(tl.where(m, kl, 0.0).to(tl.float64), axis=0)
            masked_est_sum += tl.sum(tl.where(km, kl, 0.0).to(tl.float64), axis=0)
            masked_n += tl.sum(km.to(tl.float32), axis=0)
            if KL_PENALTY:
                kl_pen += tl.sum(tl.where(km, kl_coeff * kl, 0.0), axis=0)
    if LEVEL == 1:
        if n > 0:
            ratio_sum += s.to(tl.float64)
            ratio_min = s
            ratio_max = s
            below += (s < low).to(tl.float32)
            above += (s > high).to(tl.float32)
            keeps = tl.where(adv >= 0, s <= high, s >= low)
            clipped += (~keeps).to(tl.float32)
    out = stats + row * 13
    tl.store(out + 0, n.to(tl.float64))
    tl.store(out + 1, surrogate_sum.to(tl.float64))
    tl.store(out + 2, kl_pen.to(tl.float64))
    tl.store(out + 3, ratio_sum)
    tl.store(out + 4, ratio_min.to(tl.float64))
    tl.store(out + 5, ratio_max.to(tl.float64))
    tl.store(out + 6, below.to(tl.float64))
    tl.store(out + 7, above.to(tl.float64))
    tl.store(out + 8, clipped.to(tl.float64))
    tl.store(out + 9, lr_sum)
    tl.store(out + 10, est_sum)
    tl.store(out + 11, masked_est_sum)
    tl.store(out + 12, masked_n.to(tl.float64))

@triton.jit
def backward(policy, behavior, reference, mask, kl_mask, advantages, coeff_policy, coeff_kl, grad,
             n_cols, low, high, max_w, kl_coeff, LEVEL: tl.constexpr, RECORDED: tl.constexpr,
             HAS_REF: tl.constexpr, KL_KIND: tl.constexpr, KL_PENALTY: tl.constexpr,
             BLOCK: tl.constexpr):
    # coeff_* = incoming gradient of the row's part / the row's aggregation denominator.
    row = tl.program_id(0)
    base = row.to(tl.int64) * n_cols
    adv = tl.load(advantages + row)
    cp = tl.load(coeff_policy + row)
    ck = tl.load(coeff_kl + row)
    s = 1.0
    if LEVEL == 1:
        s = _sequence_ratio(policy, behavior, mask, base, n_cols, RECORDED, BLOCK)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        inside = cols < n_cols
        m = tl.load(mask + base + cols, mask=inside, other=0) != 0
        lp = tl.where(m, tl.load(policy + base + cols, mask=inside & m, other=0.0), 0.0)
        b = lp
        if RECORDED:
            b = tl.where(m, tl.load(behavior + base + cols, mask=inside & m, other=0.0), 0.0)
        r = lp
        km = m
        if HAS_REF:
            r = tl.where(m, tl.load(reference + base + cols, mask=inside & m, other=0.0), 0.0)
            km = m & (tl.load(kl_mask + base + cols, mask=inside, other=0) != 0)
        _, _, d_surrogate, _, _, d_kl = _token_values(
            lp, b, r, adv, s, low, high, max_w, kl_coeff, LEVEL, RECORDED, KL_KIND)
        g = tl.where(m, cp * d_surrogate, 0.0)
        if HAS_REF and KL_PENALTY:
            g += tl.where(km, ck * kl_coeff * d_kl, 0.0)
        tl.store(grad + base + cols, g, mask=inside)
