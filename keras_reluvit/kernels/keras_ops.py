"""The `keras.ops` paths of pointwise attention: every backend.

- `generic`: einsums; the reference every other path is tested against.
- `chunked`: keys in blocks of `chunk_size` whose partial outputs are summed
  (no running max, no rescaling: the property that makes ReLU/L simpler than
  softmax), queries in blocks too; each block is wrapped in `keras.remat` so
  training keeps O(T * chunk) activation memory instead of O(T * S).

All paths compute `o_i = r_i * sum_j m_ij h(q_i . k_j / sqrt(d)) v_j` with the
row factor `r_i = exp(s_h) * L_i^-alpha` applied to the *output* rows (T x Dv)
rather than to the T x S weights (`row_factor`, `apply_factor`).
"""

import math

import keras
from keras import ops


def is_symbolic(x):
    """True in Keras' symbolic pass on torch (building a functional model
    runs torch ops on "meta" tensors)."""
    return getattr(getattr(x, "device", None), "type", None) == "meta"


def row_factor(mask, num_keys, alpha, log_scale, dtype):
    """`exp(s_h) * L_i^-alpha` as a tensor broadcastable to (B, T, H, 1), or a
    Python float, or None when it is 1."""
    factor = None
    if alpha != 0.0:
        if mask is None:
            factor = float(num_keys) ** -alpha
        else:
            counts = ops.sum(ops.cast(mask, "float32"), axis=-1)  # (B, T) or (B, H, T)
            factor = ops.power(ops.maximum(counts, 1.0), -alpha)
            if len(mask.shape) == 4:  # a per-head mask: (B, H, T) -> (B, T, H, 1)
                factor = ops.cast(ops.transpose(factor, (0, 2, 1))[..., None], dtype)
            else:
                factor = ops.cast(factor[:, :, None, None], dtype)
    if log_scale is not None:
        scale = ops.reshape(ops.cast(ops.exp(log_scale), dtype), (1, 1, -1, 1))
        factor = scale if factor is None else ops.multiply(scale, factor)
    return factor


def apply_factor(out, factor):
    """`out * factor` (`row_factor`'s value: None, a float or a tensor)."""
    if factor is None:
        return out
    if isinstance(factor, float):
        return ops.multiply(out, ops.cast(factor, out.dtype))
    return ops.multiply(out, factor)


def scores_and_weights(query, key, h, mask):
    """Unscaled weights `m_ij h(s_ij)` as (B, H, T, S); `mask` (B, T, S) or
    per-head (B, H, T, S)."""
    scale = ops.cast(1.0 / math.sqrt(ops.shape(query)[-1]), query.dtype)
    scores = ops.einsum("bthd,bshd->bhts", ops.multiply(query, scale), key)
    weights = h(scores)
    if mask is not None:
        weights = ops.where(mask if len(mask.shape) == 4 else ops.expand_dims(mask, 1),
                            weights, 0.0)
    return weights


def generic(query, key, value, h, mask, factor, dropout_fn=None):
    weights = scores_and_weights(query, key, h, mask)
    used = dropout_fn(weights) if dropout_fn is not None else weights
    out = ops.einsum("bhts,bshd->bthd", used, value)
    return apply_factor(out, factor), weights


def chunked(query, key, value, h, mask, factor, chunk_size):
    """Blocked over keys (summed) and queries (concatenated), rematerialised."""
    t, s = ops.shape(query)[1], ops.shape(key)[1]

    def masked_block(q, k, v, m):
        w = scores_and_weights(q, k, h, m)
        return ops.einsum("bhts,bshd->bthd", w, v)

    def plain_block(q, k, v):
        return ops.einsum("bhts,bshd->bthd", scores_and_weights(q, k, h, None), v)

    # Rematerialised: the backward pass recomputes each block's scores.
    masked_block, plain_block = keras.remat(masked_block), keras.remat(plain_block)

    def block(q, k, v, m):
        return plain_block(q, k, v) if m is None else masked_block(q, k, v, m)

    rows = []
    for i in range(0, t, chunk_size):
        q = query[:, i : i + chunk_size]
        acc = None
        for j in range(0, s, chunk_size):
            m = None if mask is None else mask[:, i : i + chunk_size, j : j + chunk_size]
            part = block(q, key[:, j : j + chunk_size], value[:, j : j + chunk_size], m)
            acc = part if acc is None else acc + part
        rows.append(acc)
    out = rows[0] if len(rows) == 1 else ops.concatenate(rows, axis=1)
    return apply_factor(out, factor)
