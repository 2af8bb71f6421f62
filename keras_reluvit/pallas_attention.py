"""Fused pointwise attention for JAX: a Pallas kernel (TPU and GPU).

`o_i = r_i * sum_j m_ij h(q_i . k_j / sqrt(d)) v_j`, flash-style: each
program holds one block of queries in on-chip memory and loops over blocks of
keys, computing the score tile, the activation `h`, the mask and the partial
`w v` product in registers / VMEM and adding it to a float32 accumulator. The
`T x S` scores never reach HBM. Unlike softmax there is no running maximum
and no normaliser to carry and rescale: the key blocks' partial outputs are
simply summed, and the row factor `r_i = exp(s_h) * L_i^-alpha` multiplies
the accumulator once at the end.

The backward pass (a `jax.custom_vjp`) recomputes the scores tile by tile in
two kernels, as FlashAttention-2 does: one over key blocks (dK, dV: a loop
over query blocks) and one over query blocks (dQ: a loop over key blocks).
With `P = h(S)`: `dV = P^T (r dO)`, `dP = (r dO) V^T`, `dS = dP * h'(S)`,
`dQ = dS K / sqrt(d)`, `dK = dS^T Q / sqrt(d)`; the row factor's gradient
(for `relu_learned`'s log-scale and nothing else) is `sum_d dO * O / r`.
No softmax statistic is needed, so nothing but the inputs is kept.

**One source, three lowerings.** The kernel body uses only ref slicing,
`lax.dot_general`, `fori_loop` and elementwise ops, so the same function
lowers through Mosaic on TPU and through Pallas' Triton backend on NVIDIA
GPUs (Triton is chosen explicitly with its `CompilerParams`: jax's default
GPU backend, Mosaic GPU, wants warpgroup-shaped kernels). `jax.lax.
platform_dependent` picks the lowering when the program is lowered, not when
it is traced: a function traced once lowers to the Mosaic call for TPU, the
Triton call for CUDA and to Pallas' interpreter elsewhere (CPU).

Shapes: the wrapper takes the layer's `(B, T, H, D)` projections, pads the
token axes to the block size and the head dim to a power of two (>= 16),
and works in `(B, H, T, D)`. Padded keys are masked inside the kernel (they
add nothing and are not counted in `L`, which the caller's row factor
already holds); padded query rows get a zero factor and are sliced off.

Blocks: 128 x 128 (fewer for short sequences) on TPU; on CUDA each kernel
caps them by the bytes of a q / k / v row (`GPU_BLOCKS`) so that shared
memory fits an A100 / H100 (128 x 128 at float32, D = 128 would need
320-384 KB).

Limits: on TPU each program keeps one head's keys and values for the whole
sequence resident in VMEM (`S x D` twice; bf16, D = 64, L = 12545: 3.2 MB),
fine up to a few ten thousand tokens (the scoped VMEM limit is raised only
where the blocks need it: ~32 MiB for float32, D = 128, L = 12545); on GPUs
the kernels read key / value blocks from HBM as they loop. Masks are read
as int32 blocks: a key mask `(B, 1, S)` as one row, a general `(B, T, S)`
mask as a T x S *read* (the caller's array), never a write.

Checked on a CPU: the interpreter's numbers, both lowerings (Pallas ->
Mosaic / Triton IR), and the Triton IR compiled for sm_90 by Triton's own
compiler (cubin and shared memory); not Mosaic's final compile to a TPU
binary, nor XLA's own Triton, which need the device.
"""

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

# Activations and their derivatives, as the kernel computes them (float32).
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def _gelu(x):
    inner = _SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)
    return 0.5 * x * (1.0 + jnp.tanh(inner))


def _gelu_grad(x):
    inner = _SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)
    t = jnp.tanh(inner)
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * _SQRT_2_OVER_PI * (1.0 + 3 * 0.044715 * x * x)


def _sigmoid(x):
    return 1.0 / (1.0 + jnp.exp(-x))


def _softplus(x):
    # log(1 + exp(x)) without overflow.
    return jnp.maximum(x, 0.0) + jnp.log(1.0 + jnp.exp(-jnp.abs(x)))


ACTIVATIONS = {
    "relu": (lambda x: jnp.maximum(x, 0.0), lambda x: jnp.where(x > 0, 1.0, 0.0)),
    "relu2": (lambda x: jnp.square(jnp.maximum(x, 0.0)), lambda x: 2.0 * jnp.maximum(x, 0.0)),
    "relu6": (lambda x: jnp.minimum(jnp.maximum(x, 0.0), 6.0),
              lambda x: jnp.where((x > 0) & (x < 6.0), 1.0, 0.0)),
    "identity": (lambda x: x, lambda x: jnp.ones_like(x)),
    "sigmoid": (_sigmoid, lambda x: _sigmoid(x) * (1.0 - _sigmoid(x))),
    "gelu": (_gelu, _gelu_grad),
    "softplus": (_softplus, _sigmoid),
}
HEAD_DIMS = "any (padded to a power of two >= 16)"
MAX_BLOCK = 128
_NT = (((1,), (1,)), ((), ()))  # a @ b.T
_NN = (((1,), (0,)), ((), ()))  # a @ b


def _dot(a, b, dims):
    return lax.dot_general(a, b, dims, preferred_element_type=jnp.float32)


def _pow2(n):
    """The smallest power of two >= n, at least 16 (head dims are padded to
    it; `tl.dot`'s minimum tile)."""
    return max(16, 1 << max(0, (n - 1).bit_length()))


def _block(n):
    """Block size for n tokens: a power of two in [16, MAX_BLOCK]."""
    return min(MAX_BLOCK, _pow2(n))


# CUDA (Pallas' Triton backend): caps on (block_q, block_k) per kernel, by the
# bytes of one q / k / v row (element size x padded head dim; doubled for a
# general (T, S) mask, whose int32 tiles take shared memory too), so that
# each program's shared memory stays within ~130 KB on sm_90 with Triton 3.6
# and 3.9 (an H100 / H200 has 227 KB, an A100 164 KB). Measured by compiling
# the kernels' Triton IR for sm_90 with Triton's own compiler
# (tests/once/test_accelerator_build.py): 128 x 128 blocks need 80-128 KB at
# 128-byte rows (bfloat16, d = 64) but 320-384 KB at 512-byte rows (float32,
# d = 128). TPU blocks stay 128 x 128 (VMEM is MiBs).
GPU_BLOCKS = {  # row bytes -> {kernel: (block_q, block_k) cap}
    128: {"fwd": (128, 128), "dkdv": (128, 128), "dq": (128, 128)},
    256: {"fwd": (128, 64), "dkdv": (64, 64), "dq": (64, 64)},
    512: {"fwd": (64, 32), "dkdv": (32, 64), "dq": (32, 32)},
    1024: {"fwd": (32, 16), "dkdv": (16, 16), "dq": (16, 16)},
}


def _blocks(cfg, mode, kernel, row_bytes):
    """The `(block_q, block_k)` of one kernel on one platform: the traced
    blocks, capped on CUDA (`GPU_BLOCKS`) unless the caller chose them.
    Caps are powers of two, so they divide the token counts padded to the
    traced blocks."""
    bq, bk, forced = cfg[2], cfg[3], cfg[5]
    if mode != "triton" or forced:
        return bq, bk
    caps = GPU_BLOCKS[min((n for n in GPU_BLOCKS if n >= row_bytes), default=max(GPU_BLOCKS))]
    cq, ck = caps[kernel]
    return min(bq, cq), min(bk, ck)


def _row_bytes(q, v, mask):
    """`GPU_BLOCKS`' key: the widest q / v row in bytes, doubled when a
    general `(B, T, S)` mask is read as tiles."""
    widest = max(jnp.dtype(x.dtype).itemsize * x.shape[-1] for x in (q, v))
    return widest * (2 if mask is not None and mask.shape[1] > 1 else 1)


def _valid(start, size, num_keys, padded_keys, mask):
    """Which keys of the block `[start, start + size)` count: real (not
    padding) and unmasked. `mask` is an int32 block or None; returns a bool
    array broadcastable to the score tile, or None when all count."""
    valid = None
    if num_keys < padded_keys:
        valid = (start + lax.broadcasted_iota(jnp.int32, (1, size), 1)) < num_keys
    if mask is not None:
        m = mask != 0
        valid = m if valid is None else jnp.logical_and(valid, m)
    return valid


# --- kernels -----------------------------------------------------------------
def _forward_kernel(q_ref, k_ref, v_ref, r_ref, *refs, act, scale, block_k, num_keys,
                    has_mask):
    mask_ref, o_ref = refs if has_mask else (None, refs[0])
    h = ACTIVATIONS[act][0]
    q = q_ref[...]
    padded_keys = k_ref.shape[0]

    def body(j, acc):
        start = pl.multiple_of(j * block_k, block_k)
        keys = pl.ds(start, block_k)
        s = _dot(q, k_ref[keys, :], _NT) * scale
        w = h(s)
        valid = _valid(start, block_k, num_keys, padded_keys,
                       None if mask_ref is None else mask_ref[:, keys])
        if valid is not None:
            w = jnp.where(valid, w, 0.0)
        v = v_ref[keys, :]
        return acc + _dot(w.astype(v.dtype), v, _NN)

    acc = jnp.zeros((q.shape[0], v_ref.shape[-1]), jnp.float32)
    acc = lax.fori_loop(0, padded_keys // block_k, body, acc)
    o_ref[...] = (acc * r_ref[...]).astype(o_ref.dtype)


def _dkdv_kernel(q_ref, k_ref, v_ref, r_ref, do_ref, *refs, act, scale, block_q, num_keys,
                 padded_keys, has_mask):
    mask_ref, dk_ref, dv_ref = refs if has_mask else (None,) + refs
    h, dh = ACTIVATIONS[act]
    k, v = k_ref[...], v_ref[...]
    block_k = k.shape[0]
    start_k = pl.program_id(2) * block_k
    # Which of this block's keys are real; the same for every query block.
    key_valid = _valid(start_k, block_k, num_keys, padded_keys, None)

    def body(i, carry):
        dk, dv = carry
        start = pl.multiple_of(i * block_q, block_q)
        rows = pl.ds(start, block_q)
        q = q_ref[rows, :]
        s = _dot(q, k, _NT) * scale
        valid = key_valid
        if mask_ref is not None:  # a (T, bk) block, or (1, bk) for a key mask
            m = (mask_ref[...] if mask_ref.shape[0] == 1 else mask_ref[rows, :]) != 0
            valid = m if valid is None else jnp.logical_and(valid, m)
        w, g = h(s), dh(s)
        if valid is not None:
            w, g = jnp.where(valid, w, 0.0), jnp.where(valid, g, 0.0)
        dor = (do_ref[rows, :].astype(jnp.float32) * r_ref[rows, :]).astype(q.dtype)
        dv = dv + _dot(w.astype(q.dtype).T, dor, _NN)
        ds = _dot(dor, v, _NT) * g * scale
        dk = dk + _dot(ds.astype(q.dtype).T, q, _NN)
        return dk, dv

    zeros = jnp.zeros(k.shape, jnp.float32), jnp.zeros(v.shape, jnp.float32)
    dk, dv = lax.fori_loop(0, q_ref.shape[0] // block_q, body, zeros)
    dk_ref[...] = dk.astype(dk_ref.dtype)
    dv_ref[...] = dv.astype(dv_ref.dtype)


def _dq_kernel(q_ref, k_ref, v_ref, r_ref, do_ref, *refs, act, scale, block_k, num_keys,
               has_mask):
    mask_ref, dq_ref = refs if has_mask else (None, refs[0])
    dh = ACTIVATIONS[act][1]
    q = q_ref[...]
    dor = (do_ref[...].astype(jnp.float32) * r_ref[...]).astype(q.dtype)
    padded_keys = k_ref.shape[0]

    def body(j, dq):
        start = pl.multiple_of(j * block_k, block_k)
        keys = pl.ds(start, block_k)
        k = k_ref[keys, :]
        s = _dot(q, k, _NT) * scale
        g = dh(s)
        valid = _valid(start, block_k, num_keys, padded_keys,
                       None if mask_ref is None else mask_ref[:, keys])
        if valid is not None:
            g = jnp.where(valid, g, 0.0)
        ds = _dot(dor, v_ref[keys, :], _NT) * g * scale
        return dq + _dot(ds.astype(k.dtype), k, _NN)

    dq = lax.fori_loop(0, padded_keys // block_k, body, jnp.zeros(q.shape, jnp.float32))
    dq_ref[...] = dq.astype(dq_ref.dtype)


# --- pallas_call per platform --------------------------------------------------
def _vmem_bytes(in_specs, out_specs, args, out_shape):
    """A TPU program's VMEM need: every block double-buffered, plus the
    float32 score tiles and accumulators (a generous allowance)."""
    total = 0
    for spec, x in zip(list(in_specs) + list(out_specs), list(args) + list(out_shape)):
        n = 1
        for dim in spec.block_shape:
            n *= 1 if dim is None else dim
        total += 2 * n * jnp.dtype(x.dtype).itemsize
    return total + 8 * MAX_BLOCK * MAX_BLOCK * 4


def _compiler_params(mode, head_dim, vmem_bytes):
    if mode == "tpu":
        from jax.experimental.pallas import tpu as pltpu

        # Raise the scoped VMEM limit (16-32 MiB by default) only where the
        # resident keys and values need it (long sequences, float32, d = 128).
        limit = None if vmem_bytes <= 12 * 2**20 else int(vmem_bytes * 1.25)
        return pltpu.CompilerParams(dimension_semantics=("parallel",) * 3,
                                    vmem_limit_bytes=limit)
    if mode == "triton":
        from jax.experimental.pallas import triton as pltriton

        return pltriton.CompilerParams(num_warps=4 if head_dim <= 64 else 8, num_stages=2)
    return None


def _pallas(kernel, grid, in_specs, out_specs, out_shape, mode, head_dim, name):
    outs = out_shape if isinstance(out_shape, list) else [out_shape]
    out_list = out_specs if isinstance(out_specs, list) else [out_specs]

    def call(*args):
        params = _compiler_params(mode, head_dim, _vmem_bytes(in_specs, out_list, args, outs))
        return pl.pallas_call(
            kernel, grid=grid, in_specs=in_specs, out_specs=out_specs, out_shape=out_shape,
            compiler_params=params, interpret=mode == "interpret", name=name)(*args)

    return call


def _spec(shape, index_map):
    return pl.BlockSpec(shape, index_map)


def _query_mask_spec(mask, bq, sp):
    """A query block's mask rows: `(bq, S)` of a `(B, T, S)` mask, or the one
    row of a `(B, 1, S)` key mask (never broadcast to T x S in HBM)."""
    if mask.shape[1] == 1:
        return _spec((None, 1, sp), lambda b_, h_, i: (b_, 0, 0))
    return _spec((None, bq, sp), lambda b_, h_, i: (b_, i, 0))


def _block_i(b, h, i):  # index map: block i of the token axis of head (b, h)
    return b, h, i, 0


def _whole(b, h, i):  # index map: all tokens of head (b, h)
    return b, h, 0, 0


def _query_block_inputs(bq, q, k, v, r, mask, do=None):
    """`(in_specs, args)` of a program that owns one query block and reads
    every key (the forward; dQ, which also reads that block of dO)."""
    dp, sp, dvp = q.shape[3], k.shape[2], v.shape[3]
    in_specs = [_spec((None, None, bq, dp), _block_i), _spec((None, None, sp, dp), _whole),
                _spec((None, None, sp, dvp), _whole), _spec((None, None, bq, 1), _block_i)]
    args = [q, k, v, r]
    if do is not None:
        in_specs.append(_spec((None, None, bq, dvp), _block_i))
        args.append(do)
    if mask is not None:
        in_specs.append(_query_mask_spec(mask, bq, sp))
        args.append(mask)
    return in_specs, args


def _forward(cfg, mode, q, k, v, r, mask):
    act, num_keys, _, _, scale, _ = cfg
    bq, bk = _blocks(cfg, mode, "fwd", _row_bytes(q, v, mask))
    b, nh, tp, dp = q.shape
    dvp = v.shape[3]
    in_specs, args = _query_block_inputs(bq, q, k, v, r, mask)
    kernel = functools.partial(_forward_kernel, act=act, scale=scale, block_k=bk,
                               num_keys=num_keys, has_mask=mask is not None)
    return _pallas(kernel, (b, nh, tp // bq), in_specs, _spec((None, None, bq, dvp), _block_i),
                   jax.ShapeDtypeStruct((b, nh, tp, dvp), q.dtype), mode, dp,
                   "pointwise_attention_fwd")(*args)


def _backward(cfg, mode, q, k, v, r, mask, do):
    act, num_keys, _, _, scale, _ = cfg
    row_bytes = _row_bytes(q, v, mask)
    bq, bk = _blocks(cfg, mode, "dkdv", row_bytes)
    b, nh, tp, dp = q.shape
    sp, dvp = k.shape[2], v.shape[3]
    has_mask = mask is not None
    # dK, dV: one program per key block, looping over query blocks.
    in_specs = [_spec((None, None, tp, dp), _whole), _spec((None, None, bk, dp), _block_i),
                _spec((None, None, bk, dvp), _block_i), _spec((None, None, tp, 1), _whole),
                _spec((None, None, tp, dvp), _whole)]
    args = [q, k, v, r, do]
    if has_mask:
        in_specs.append(_spec((None, mask.shape[1], bk), lambda b_, h_, j: (b_, 0, j)))
        args.append(mask)
    kernel = functools.partial(_dkdv_kernel, act=act, scale=scale, block_q=bq,
                               num_keys=num_keys, padded_keys=sp, has_mask=has_mask)
    dk, dv = _pallas(kernel, (b, nh, sp // bk), in_specs,
                     [_spec((None, None, bk, dp), _block_i), _spec((None, None, bk, dvp), _block_i)],
                     [jax.ShapeDtypeStruct(k.shape, k.dtype),
                      jax.ShapeDtypeStruct(v.shape, v.dtype)],
                     mode, dp, "pointwise_attention_dkdv")(*args)
    # dQ: one program per query block, looping over key blocks.
    bq, bk = _blocks(cfg, mode, "dq", row_bytes)
    in_specs, args = _query_block_inputs(bq, q, k, v, r, mask, do)
    kernel = functools.partial(_dq_kernel, act=act, scale=scale, block_k=bk,
                               num_keys=num_keys, has_mask=has_mask)
    dq = _pallas(kernel, (b, nh, tp // bq), in_specs, _spec((None, None, bq, dp), _block_i),
                 jax.ShapeDtypeStruct(q.shape, q.dtype), mode, dp,
                 "pointwise_attention_dq")(*args)
    return dq, dk, dv


# Platform -> how the kernel is lowered there. Chosen when the program is
# lowered (`lax.platform_dependent`), so one traced function serves all.
_PLATFORMS = {"tpu": "tpu", "cuda": "triton"}


def _on_platform(fn, cfg, *args, interpret=False):
    if interpret:
        return fn(cfg, "interpret", *args)
    branches = {p: functools.partial(fn, cfg, mode) for p, mode in _PLATFORMS.items()}
    return lax.platform_dependent(
        *args, default=functools.partial(fn, cfg, "interpret"), **branches)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _fused(cfg, interpret, q, k, v, r, mask):
    return _run_forward(cfg, interpret, q, k, v, r, mask)


def _run_forward(cfg, interpret, q, k, v, r, mask):
    return _on_platform(_forward, cfg, q, k, v, r, mask, interpret=interpret)


def _fused_fwd(cfg, interpret, q, k, v, r, mask):
    out = _run_forward(cfg, interpret, q, k, v, r, mask)
    return out, (q, k, v, r, mask, out)


def _fused_bwd(cfg, interpret, residuals, do):
    q, k, v, r, mask, out = residuals
    dq, dk, dv = _on_platform(_backward, cfg, q, k, v, r, mask, do, interpret=interpret)
    # o = r * u, so dr = sum_d do * u = sum_d do * o / r (r > 0 on real rows;
    # padded rows have r = 0 and no gradient).
    dot = jnp.sum(do.astype(jnp.float32) * out.astype(jnp.float32), axis=-1, keepdims=True)
    dr = jnp.where(r > 0, dot / jnp.where(r > 0, r, 1.0), 0.0)
    return dq, dk, dv, dr, None


_fused.defvjp(_fused_fwd, _fused_bwd)


def _pad_to(x, axis, size):
    extra = size - x.shape[axis]
    if not extra:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, extra)
    return jnp.pad(x, widths)


def row_factor_array(factor, b, t, nh):
    """The dispatch's row factor (None, a float, or an array broadcastable to
    `(B, T, H, 1)`) as the kernel's float32 `(B, H, T, 1)` input."""
    if factor is None:
        factor = 1.0
    r = jnp.broadcast_to(jnp.asarray(factor, jnp.float32), (b, t, nh, 1))
    return jnp.transpose(r, (0, 2, 1, 3))


def attention(query, key, value, activation="relu", factor=None, mask=None,
              interpret=None, block_q=None, block_k=None):
    """Fused pointwise attention, `(B, T, H, D)` in and out.

    Args:
        query, key, value: `(B, T, H, D)`, `(B, S, H, D)`, `(B, S, H, Dv)`
            projections (float32 or bfloat16; queries unscaled).
        activation: a name of `ACTIVATIONS`.
        factor: the row factor `exp(s_h) * L_i^-alpha`: None (1), a float, or
            an array broadcastable to `(B, T, H, 1)` (differentiable).
        mask: optional boolean, broadcastable to `(B, T, S)`; True = attend.
            A `(B, 1, S)` (or `(B, S)`-like) key mask is read as one row per
            batch element, never expanded to `T x S`.
        interpret: True runs Pallas' interpreter (any platform); False/None
            let the platform decide at lowering: Mosaic on TPU, Triton on
            CUDA GPUs, the interpreter elsewhere.
        block_q, block_k: tile sizes (powers of two), on every platform;
            default `min(128, next power of two of the token count)` (>= 16),
            capped on CUDA GPUs so shared memory fits (`GPU_BLOCKS`).
    """
    if activation not in ACTIVATIONS:
        raise ValueError(f"The Pallas kernel computes {sorted(ACTIVATIONS)}, not {activation!r}.")
    b, t, nh, d = query.shape
    s, dv = key.shape[1], value.shape[-1]
    bq, bk = block_q or _block(t), block_k or _block(s)
    tp, sp = -(-t // bq) * bq, -(-s // bk) * bk
    dp, dvp = _pow2(d), _pow2(dv)
    r = row_factor_array(factor, b, t, nh)

    def layout(x, tokens, dim):  # (B, T, H, D) -> padded (B, H, T, D)
        x = jnp.transpose(x, (0, 2, 1, 3))
        return _pad_to(_pad_to(x, 2, tokens), 3, dim)

    q, k, v = layout(query, tp, dp), layout(key, sp, dp), layout(value, sp, dvp)
    r = _pad_to(r, 2, tp)
    if mask is not None:
        mask = jnp.asarray(mask, bool)
        mask = mask.reshape((1,) * (3 - mask.ndim) + mask.shape)
        rows = 1 if mask.shape[1] == 1 else t  # a key mask stays one row
        mask = jnp.broadcast_to(mask, (b, rows, s)).astype(jnp.int32)
        mask = _pad_to(_pad_to(mask, 1, tp if rows > 1 else 1), 2, sp)
    forced = block_q is not None or block_k is not None
    cfg = (activation, s, bq, bk, 1.0 / math.sqrt(d), forced)
    out = _fused(cfg, bool(interpret), q, k, v, r, mask)
    return jnp.transpose(out[:, :, :t, :dv], (0, 2, 1, 3))
