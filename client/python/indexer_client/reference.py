"""A plain numpy reference of the dense token path (SPEC §5) and the SPEC §5
check of a top-k row, for tests and for front-ends that verify the daemon.

Everything is computed in float64 from the decoded FP8 values, so the only
difference from the daemon is its fp32 summation order, which the check's
tolerance covers.
"""

import numpy as np


def visible_entries(seq_len, q_len, compress_ratio=1):
    """Visible entries of each of a sequence's q_len rows after a step that
    leaves it at seq_len tokens: row j (position seq_len - q_len + j) sees
    (position + 1) // r entries (SPEC §2)."""
    pos = np.arange(seq_len - q_len, seq_len, dtype=np.int64)
    return (pos + 1) // compress_ratio


def new_entries(seq_len_before, q_len, compress_ratio=1):
    """Entries a sequence gains in a layer group with ratio r when q_len
    tokens are appended: (L + q) // r - L // r."""
    return (seq_len_before + q_len) // compress_ratio - seq_len_before // compress_ratio


def dense_fp8_logits(q_values, weights, k_values, k_scales):
    """SPEC §5 dense FP8 logits of one row.

    q_values: [H, D] decoded Q; weights: [H] (w'); k_values: [n, D] decoded
    entries; k_scales: [n]. Returns [n] float64:
    kscale[e] * sum_h w[h] * ReLU(q[h] . k[e]).
    """
    dots = np.asarray(k_values, np.float64) @ np.asarray(q_values, np.float64).T  # [n, H]
    return np.asarray(k_scales, np.float64) * (np.maximum(dots, 0.0) @ np.asarray(weights,
                                                                                 np.float64))


def check_topk_row(logits, got, k):
    """Problems with one top-k row (an empty list when it is right).

    logits: [n] reference scores of the row's visible entries (-inf = may not
    be chosen); got: [k] int32 as returned. Right means: min(k, chooseable)
    distinct chooseable indices in any order, then -1; each scores at least
    the reference's k-th best minus 1e-5 of the largest magnitude (fp32
    summation order; ties at the cut may go either way).
    """
    logits = np.asarray(logits, np.float64)
    got = np.asarray(got).reshape(-1)
    finite = logits[~np.isneginf(logits)]
    want = min(k, finite.size)
    kth = np.sort(finite)[::-1][want - 1] if want else -np.inf
    tol = 1e-5 * (np.abs(finite).max() if finite.size else 0.0) + 1e-30
    problems = []
    if got.size != k:
        return [f"expected {k} slots, got {got.size}"]
    head, tail = got[:want], got[want:]
    if (tail != -1).any():
        problems.append(f"slots past {want} chooseable entries must be -1, got {tail.tolist()}")
    if (head < 0).any() or (head >= logits.size).any():
        problems.append(f"indices out of [0, {logits.size}): {head[(head < 0) | (head >= logits.size)].tolist()}")
        return problems
    if np.unique(head).size != head.size:
        problems.append("an index appears twice")
    low = head[logits[head] < kth - tol]
    if low.size:
        problems.append(f"indices {low.tolist()} score below the reference top-{want} cut {kth}")
    return problems
