"""The Triton kernel of `gpu_runtime.kernels.sampling` (imported only when it is first used).

Imports triton at the top: `triton.jit` reads TRITON_INTERPRET when it decorates, and a kernel
resolves the jitted helpers it calls as module globals.

One program per row. The torch path sorts the row; this kernel never does. Top-k and top-p
become thresholds on an order-preserving integer key of each float (found by bisection, 32
counting passes each), and ties at a threshold are broken by vocabulary index, which is the
order a stable descending sort gives them. The filtered, scaled logits are kept in `work`.
"""

import triton
import triton.language as tl

# Globals a compiled kernel reads must be constexpr.
KEY_LOW = tl.constexpr(-(2**31))
KEY_HIGH = tl.constexpr(2**31 - 1)


@triton.jit
def _key(z):
    # Order-preserving int32 key of a float32: negative floats have their magnitude bits flipped.
    # Adding 0.0 turns -0.0 into +0.0, which a sort treats as equal.
    bits = (z + 0.0).to(tl.int32, bitcast=True)
    return tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF).to(tl.int64)


@triton.jit
def _row_max_sum(work, n, BLOCK: tl.constexpr):
    m = float("-inf")
    for start in range(0, n, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        m = tl.maximum(m, tl.max(tl.load(work + cols, mask=cols < n, other=float("-inf")), axis=0))
    s = 0.0
    for start in range(0, n, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        s += tl.sum(tl.exp(tl.load(work + cols, mask=cols < n, other=float("-inf")) - m), axis=0)
    return m, s


@triton.jit
def _count_at_least(work, n, threshold, BLOCK: tl.constexpr):
    count = 0
    for start in range(0, n, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        key = _key(tl.load(work + cols, mask=cols < n, other=float("-inf")))
        count += tl.sum(((key >= threshold) & (cols < n)).to(tl.int32), axis=0)
    return count


@triton.jit
def _mass_above(work, n, threshold, m, s, BLOCK: tl.constexpr):
    mass = 0.0
    for start in range(0, n, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        z = tl.load(work + cols, mask=cols < n, other=float("-inf"))
        mass += tl.sum(tl.where(_key(z) > threshold, tl.exp(z - m) / s, 0.0), axis=0)
    return mass


@triton.jit
def _top_k(work, n, k, BLOCK: tl.constexpr):
    # The k-th largest key: the largest t with count(key >= t) >= k.
    lo = tl.full((), KEY_LOW, tl.int64)
    hi = tl.full((), KEY_HIGH, tl.int64)
    for _ in range(32):
        mid = lo + (hi - lo + 1) // 2
        if _count_at_least(work, n, mid, BLOCK) >= k:
            lo = mid
        else:
            hi = mid - 1
    need = k - _count_at_least(work, n, lo + 1, BLOCK)  # ties at the threshold still to keep
    seen = 0
    for start in range(0, n, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        inside = cols < n
        z = tl.load(work + cols, mask=inside, other=float("-inf"))
        key = _key(z)
        tie = (key == lo) & inside
        before = seen + tl.cumsum(tie.to(tl.int32), axis=0) - tie.to(tl.int32)
        keep = (key > lo) | (tie & (before < need))
        tl.store(work + cols, tl.where(keep, z, float("-inf")), mask=inside)
        seen += tl.sum(tie.to(tl.int32), axis=0)


@triton.jit
def _top_p(work, n, p, first_max, BLOCK: tl.constexpr):
    # Keep a token when the mass of the tokens sorted before it is below p: the keys above the
    # smallest key t whose strictly-greater mass is below p, then ties at t in index order.
    m, s = _row_max_sum(work, n, BLOCK)
    lo = tl.full((), KEY_LOW, tl.int64)
    hi = tl.full((), KEY_HIGH, tl.int64)
    for _ in range(32):
        mid = lo + (hi - lo) // 2
        if _mass_above(work, n, mid, m, s, BLOCK) < p:
            hi = mid
        else:
            lo = mid + 1
    above = _mass_above(work, n, lo, m, s, BLOCK)
    tie_mass = 0.0
    for start in range(0, n, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        inside = cols < n
        z = tl.load(work + cols, mask=inside, other=float("-inf"))
        key = _key(z)
        prob = tl.exp(z - m) / s
        tie = (key == lo) & inside
        tie_prob = tl.where(tie, prob, 0.0)
        before = above + tie_mass + tl.cumsum(tie_prob, axis=0) - tie_prob
        # The most likely token always stays (a p that rounds to 0 means greedy within the filter).
        keep = (key > lo) | (tie & (before < p)) | (cols == first_max)
        tl.store(work + cols, tl.where(keep, z, float("-inf")), mask=inside)
        tie_mass += tl.sum(tie_prob, axis=0)


@triton.jit
def _min_p(work, n, min_p, BLOCK: tl.constexpr):
    m, s = _row_max_sum(work, n, BLOCK)
    threshold = min_p * (1.0 / s)  # the largest probability is exp(0) / s
    for start in range(0, n, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        inside = cols < n
        z = tl.load(work + cols, mask=inside, other=float("-inf"))
        tl.store(work + cols, tl.where(tl.exp(z - m) / s < threshold, float("-inf"), z), mask=inside)


@triton.jit
def _philox_uniform(seeds, positions, row):
    # The row's own stream: Philox keyed by the request seed, counter = the token position.
    return tl.rand(tl.load(seeds + row), tl.load(positions + row)).to(tl.float64)


@triton.jit
def philox_uniforms(seeds, positions, out):
    row = tl.program_id(0)
    tl.store(out + row, _philox_uniform(seeds, positions, row))


@triton.jit
def sample_rows(logits, work, temperature, top_k, top_p, min_p, uniforms, seeds, positions, forced,
                tokens, chosen_logprob, n, PHILOX: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    src = logits + row.to(tl.int64) * n
    dst = work + row.to(tl.int64) * n
    temp = tl.load(temperature + row)
    greedy = temp == 0.0
    inv = tl.where(greedy, 1.0, temp)
    # Pass 1: scaled logits into `work`, the first arg-max of the raw and of the scaled row.
    best_x = float("-inf")
    best_z = float("-inf")
    arg_x = n * 0
    arg_z = n * 0
    for start in range(0, n, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        inside = cols < n
        x = tl.load(src + cols, mask=inside, other=float("-inf"))
        z = tl.math.div_rn(x, inv)  # IEEE division, as torch divides (a plain / is approximate on GPUs)
        tl.store(dst + cols, z, mask=inside)
        bx = tl.max(x, axis=0)
        ax = tl.min(tl.where((x == bx) & inside, cols, n), axis=0)
        if bx > best_x:
            best_x = bx
            arg_x = ax
        bz = tl.max(z, axis=0)
        az = tl.min(tl.where((z == bz) & inside, cols, n), axis=0)
        if bz > best_z:
            best_z = bz
            arg_z = az
    want = tl.load(forced + row)
    if greedy:
        token = tl.where(want >= 0, want, arg_x.to(tl.int64))
        lp = tl.where(token == arg_x, 0.0, float("-inf"))
    else:
        k = tl.load(top_k + row)
        if (k > 0) & (k < n):
            _top_k(dst, n, k, BLOCK)
        p = tl.load(top_p + row)
        if p < 1.0:
            _top_p(dst, n, p, arg_z, BLOCK)
        q = tl.load(min_p + row)
        if q > 0.0:
            _min_p(dst, n, q, BLOCK)
        m, s = _row_max_sum(dst, n, BLOCK)
        log_s = tl.log(s)
        if PHILOX:
            u = _philox_uniform(seeds, positions, row)
        else:
            u = tl.load(uniforms + row)
        # Inverse CDF in vocabulary order, in float64, over exp(the float32 log-probs).
        total = tl.zeros((), tl.float64)
        for start in range(0, n, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            z = tl.load(dst + cols, mask=cols < n, other=float("-inf"))
            total += tl.sum(tl.exp(((z - m) - log_s).to(tl.float64)), axis=0)
        target = u * total
        found = n * 0 - 1
        last = n * 0 - 1
        cdf = tl.zeros((), tl.float64)
        for start in range(0, n, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            inside = cols < n
            z = tl.load(dst + cols, mask=inside, other=float("-inf"))
            prob = tl.exp(((z - m) - log_s).to(tl.float64))
            running = cdf + tl.cumsum(prob, axis=0)
            hit = tl.min(tl.where((running > target) & inside & (prob > 0), cols, n), axis=0)
            if (found < 0) & (hit < n):
                found = hit
            last = tl.maximum(last, tl.max(tl.where((prob > 0) & inside, cols, -1), axis=0))
            cdf += tl.sum(prob, axis=0)
        drawn = tl.where(found >= 0, found, last)
        token = tl.where(want >= 0, want, drawn.to(tl.int64))
        lp = (tl.load(dst + token) - m) - log_s
    tl.store(tokens + row, token)
    tl.store(chosen_logprob + row, lp)
