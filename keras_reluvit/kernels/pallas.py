"""Fused pointwise attention for JAX: a Pallas kernel (TPU and GPU).

`o_i = r_i * sum_j m_ij h(q_i . k_j / sqrt(d)) v_j`, flash-style: each
program holds one block of queries in on-chip memory and loops over blocks of
keys, computing the score tile, the activation `h`, the mask and the partial
`w v` product in registers / VMEM and adding it to a float32 accumulator. The
`T x S` scores never reach HBM. Unlike softmax there is no running maximum
and no normaliser to carry and rescale: the key blocks' partial outputs are
simply summed, and the row factor `r_i = exp(s_h) * L_i^-alpha` multiplies
the accumulator once at the end.

The backward pass (a `jax.custom_vjp`) recomputes the scores tile by tile.
With `P = h(S)`: `dV = P^T (r dO)`, `dP = (r dO) V^T`, `dS = dP * h'(S)`,
`dQ = dS K / sqrt(d)`, `dK = dS^T Q / sqrt(d)`; the row factor's gradient
(for `relu_learned`'s log-scale and nothing else) is `sum_d dO * O / r`.
No softmax statistic is needed, so nothing but the inputs is kept. On CUDA
it is one kernel, as FlashAttention-2's: a program per key block loops over
the query blocks, keeps dK and dV on chip and adds each query block's dQ
share atomically into a zeroed float32 buffer -- 5 dots per tile.
`deterministic=True` (or XLA's `--xla_gpu_deterministic_ops=true`) and TPU
(Mosaic has no atomics) take two kernels instead: dK/dV over key blocks,
then dQ over query blocks (4 + 3 dots, bitwise reproducible).

**One source, three lowerings.** The kernel bodies use only ref slicing
(or, on CUDA, Pallas' masked loads and stores), `lax.dot_general`,
`fori_loop` and elementwise ops, so the same functions lower through Mosaic
on TPU and through Pallas' Triton backend on NVIDIA GPUs (Triton is chosen
explicitly with its `CompilerParams`: jax's default GPU backend, Mosaic GPU,
wants warpgroup-shaped kernels). `jax.lax.platform_dependent` picks the
lowering when the program is lowered, not when it is traced: a function
traced once lowers to the Mosaic call for TPU, the Triton call for CUDA and
to Pallas' interpreter elsewhere (CPU).

**Two layouts.** On CUDA (and in the interpreter) the kernels read the
layer's `(B, T, H, D)` projections *in place* and write `(B, T, H, Dv)`:
no transpose and no padding copy in HBM (at L = 197 and 785, copies of q,
k, v and the output would cost about as much HBM time as the kernel's
matmuls: an estimate from bandwidth and FLOPs, not yet measured); token
counts that are not a multiple of the block and head dims that are not a
power of two are handled by masked loads (zeros) and masked stores at the
true bounds. Mosaic has no masked loads, so on TPU the branch transposes to
`(B, H, T, D)` and pads the token axes to the blocks and the head dim to a
power of two (>= 16), with plain ref slices. Either way keys past `S` are
masked in the score tile (they add nothing and are not counted in `L`,
which the caller's row factor already holds) and rows past `T` are never
kept.

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
from jax.experimental.pallas import triton as plgpu

from keras_reluvit.kernels.switches import pallas_deterministic

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
# Positively homogeneous activations, h(c s) = c^p h(s) (c > 0): the score
# scale leaves the tile and multiplies the results once (outputs, dQ, dK,
# dV all by c^p); the others take one multiply per score.
HOMOGENEOUS = {"relu": 1, "identity": 1, "relu2": 2}
HEAD_DIMS = "any (padded to a power of two >= 16)"


def _scales(act, scale):
    """(per score, per result) factors: (1, scale^p) for a homogeneous
    activation, else (scale, 1)."""
    power = HOMOGENEOUS.get(act)
    return (1.0, scale ** power) if power else (scale, 1.0)


def _times(x, c):
    return x if c == 1.0 else x * c
MAX_BLOCK = 128
_NT = (((1,), (1,)), ((), ()))  # a @ b.T
_NN = (((1,), (0,)), ((), ()))  # a @ b
_TN = (((0,), (0,)), ((), ()))  # a.T @ b


# `jax_default_matmul_precision` values that ask for full float32 products.
FULL_FLOAT32 = ("highest", "float32", "F32_F32_F32")


def _dot(a, b, dims):
    """A float32-accumulating dot. float32 inputs take JAX's matmul setting
    as XLA's own dots do: TF32 tensor cores on CUDA by default (Pallas'
    Triton lowering of an unspecified precision), full float32 where
    `jax_default_matmul_precision` (or `jax.default_matmul_precision(...)`
    around the trace) asks for it."""
    precision = None
    if a.dtype == jnp.float32 and jax.config.jax_default_matmul_precision in FULL_FLOAT32:
        precision = lax.Precision.HIGHEST
    return lax.dot_general(a, b, dims, precision=precision, preferred_element_type=jnp.float32)


def _pow2(n):
    """The smallest power of two >= n, at least 16 (head dims are padded to
    it; `tl.dot`'s minimum tile)."""
    return max(16, 1 << max(0, (n - 1).bit_length()))


def _block(n):
    """Block size for n tokens: a power of two in [16, MAX_BLOCK]."""
    return min(MAX_BLOCK, _pow2(n))


# CUDA (Pallas' Triton backend): caps on (block_q, block_k) per kernel, by the
# bytes of one q / k / v row (element size x padded head dim; doubled for a
# general (T, S) mask, whose int32 tiles take shared memory too). The rules:
# each program's shared memory within ~130 KB on sm_90 (an H100 / H200 has
# 227 KB, an A100 164 KB); no register spills at the kernel's warps for any
# activation ("bwd": the 5-dot kernel and the deterministic dK/dV kernel,
# which hold K, V, dK and dV tiles for their whole loop, get the smallest
# caps); no tile whose tensor-core work, read from its SASS, exceeds its
# FLOPs where a smaller one avoids it. Head dims above 128 take the next
# class (`_row_class`). TPU blocks stay 128 x 128 (VMEM is MiBs). The
# measurements behind each cap: docs/kernels.md, "How the tiles were chosen".
GPU_BLOCKS = {  # row bytes -> {kernel: (block_q, block_k) cap}
    128: {"fwd": (128, 128), "bwd": (32, 64), "dq": (128, 128)},
    256: {"fwd": (128, 64), "bwd": (64, 32), "dq": (64, 64)},
    512: {"fwd": (64, 32), "bwd": (32, 16), "dq": (32, 32)},
    1024: {"fwd": (16, 32), "bwd": (16, 16), "dq": (32, 32)},
    2048: {"fwd": (32, 16), "bwd": (16, 16), "dq": (16, 16)},
}


# Warps per CUDA kernel where not 8, by row bytes (as GPU_BLOCKS), for head
# dims up to 128. The rule: a 64-row dot on 8 warps is laid out on both
# warpgroups, each computing all 64 rows; 4 warps compute it once, used
# wherever they do so without spills (measurements: docs/kernels.md).
GPU_WARPS = {128: {"bwd": 4}, 256: {"dq": 4}, 512: {"fwd": 4, "bwd": 4, "dq": 4},
             1024: {"fwd": 4, "bwd": 4, "dq": 4}}


def _row_class(row_bytes):
    """The key of `GPU_BLOCKS` / `GPU_WARPS` a row of that many bytes takes."""
    return min((n for n in GPU_BLOCKS if n >= row_bytes), default=max(GPU_BLOCKS))


def _warps(mode, kernel, row_bytes, head_dim):
    """num_warps of one CUDA kernel ("fwd", "bwd" -- also the dK/dV kernel --
    or "dq"); 8 unless `GPU_WARPS` says otherwise."""
    if mode != "triton" or head_dim > 128:
        return 8
    return GPU_WARPS.get(_row_class(row_bytes), {}).get(kernel, 8)


def _blocks(cfg, mode, kernel, row_bytes):
    """The `(block_q, block_k)` of one kernel on one platform: the traced
    blocks, capped on CUDA (`GPU_BLOCKS`) unless the caller chose them."""
    bq, bk, forced = cfg[2], cfg[3], cfg[5]
    if mode != "triton" or forced:
        return bq, bk
    cq, ck = GPU_BLOCKS[_row_class(row_bytes)][kernel]
    return min(bq, cq), min(bk, ck)


def _row_bytes(q, v, mask):
    """`GPU_BLOCKS`' key: the widest q / v row in bytes, doubled when a
    general `(B, T, S)` mask is read as tiles and when the head dim is
    above 128 (8 warps there: `_warps`)."""
    widest = max(jnp.dtype(x.dtype).itemsize * x.shape[-1] for x in (q, v))
    wide = max(q.shape[-1], v.shape[-1]) > 128
    return widest * (2 if mask is not None and mask.shape[1] > 1 else 1) * (2 if wide else 1)


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


# --- loads and stores ----------------------------------------------------------
# The two layouts (module docstring): `lim` is None for the padded one (plain
# ref slices), the true bounds (T, S, D, Dv) for the in-place one (masked).
def _bounds(shape, row0, n_rows, col0, n_cols):
    """The in-bounds part of a `shape` tile starting at (row0, col0)."""
    valid = None
    if n_rows is not None:
        valid = (row0 + lax.broadcasted_iota(jnp.int32, shape, 0)) < n_rows
    if n_cols is not None:
        cols = (col0 + lax.broadcasted_iota(jnp.int32, shape, 1)) < n_cols
        valid = cols if valid is None else jnp.logical_and(valid, cols)
    return valid


def _ld(ref, lim, rows=None, cols=None, row0=0, n_rows=None, col0=0, n_cols=None):
    """`ref[rows, cols]`; in place (`lim` given) a load masked to rows
    `< n_rows` and columns `< n_cols` (tile coordinates offset by row0 / col0),
    zeros elsewhere."""
    idx = (slice(None) if rows is None else rows, slice(None) if cols is None else cols)
    if lim is None:
        return ref[idx]
    view = ref.at[idx]
    valid = _bounds(view.shape, row0, n_rows, col0, n_cols)
    if valid is None:
        return view[...]
    return plgpu.load(view, mask=valid, other=0)


def _st(ref, x, lim, row0=0, n_rows=None, n_cols=None):
    """`ref[...] = x`; in place, only the in-bounds rows and columns."""
    x = x.astype(ref.dtype)
    if lim is None:
        ref[...] = x
        return
    plgpu.store(ref, x, mask=_bounds(ref.shape, row0, n_rows, 0, n_cols))


def _dims(lim):
    return (None,) * 4 if lim is None else lim


def _block_id(lim):
    """This program's token block: the grid's first axis in place (CUDA),
    its last padded (TPU); see `_Layout`."""
    return pl.program_id(2 if lim is None else 0)


# --- kernels -----------------------------------------------------------------
def _forward_kernel(q_ref, k_ref, v_ref, r_ref, *refs, act, scale, block_k, num_keys,
                    has_mask, lim):
    mask_ref, o_ref = refs if has_mask else (None, refs[0])
    t, s_, d, dv = _dims(lim)
    pre, post = _scales(act, scale)
    h = ACTIVATIONS[act][0]
    row0 = _block_id(lim) * q_ref.shape[0]
    q = _ld(q_ref, lim, row0=row0, n_rows=t, n_cols=d)
    padded_keys = k_ref.shape[0]

    def body(j, acc):
        start = pl.multiple_of(j * block_k, block_k)
        keys = pl.ds(start, block_k)
        s = _times(_dot(q, _ld(k_ref, lim, keys, row0=start, n_rows=s_, n_cols=d), _NT), pre)
        w = h(s)
        m = None if mask_ref is None else _ld(mask_ref, lim, cols=keys, row0=row0, n_rows=(
            t if mask_ref.shape[0] > 1 else None), col0=start, n_cols=s_)
        valid = _valid(start, block_k, num_keys, padded_keys, m)
        if valid is not None:
            w = jnp.where(valid, w, 0.0)
        v = _ld(v_ref, lim, keys, row0=start, n_rows=s_, n_cols=dv)
        return acc + _dot(w.astype(v.dtype), v, _NN)

    acc = jnp.zeros((q.shape[0], v_ref.shape[-1]), jnp.float32)
    acc = lax.fori_loop(0, padded_keys // block_k, body, acc)
    r = _ld(r_ref, lim, row0=row0, n_rows=t)
    _st(o_ref, acc * _times(r, post), lim, row0=row0, n_rows=t, n_cols=dv)


def _key_block_valid(valid, mask_ref, lim, rows, start, t, start_k, s_, keys_first):
    """A key block's backward tile: `valid` (its real keys) and the user's
    mask for the query rows `rows` -- a `(T, bk)` block, or `(1, bk)` for a
    key mask -- as a `(queries, keys)` tile, or `(keys, queries)` when
    `keys_first`."""
    if mask_ref is None:
        return valid
    if mask_ref.shape[0] == 1:
        m = _ld(mask_ref, lim, col0=start_k, n_cols=s_)
    else:
        m = _ld(mask_ref, lim, rows, row0=start, n_rows=t, col0=start_k, n_cols=s_)
    m = (m.T if keys_first else m) != 0
    return m if valid is None else jnp.logical_and(valid, m)


def _weights_and_grads(s, valid, act):
    """`h(s)` and `h'(s)`, zero where not `valid`."""
    h, dh = ACTIVATIONS[act]
    w, g = h(s), dh(s)
    if valid is not None:
        w, g = jnp.where(valid, w, 0.0), jnp.where(valid, g, 0.0)
    return w, g


def _scaled_do(do, r):
    """`r dO` in dO's dtype (a dot operand of both backward kernels): the row
    factor `r` (B, H, T, 1) applied once, outside the kernels, not per tile."""
    r = jnp.transpose(r, (0, 2, 1, 3))  # like dO: (B, T, H, 1)
    return (do.astype(jnp.float32) * r).astype(do.dtype)


def _dkdv_kernel(q_ref, k_ref, v_ref, dor_ref, *refs, act, scale, block_q, num_keys,
                 padded_keys, has_mask, lim, keys_first, fuse_dq):
    """dK and dV of one key block over every query block and, with
    `fuse_dq`, each query block's share of dQ added atomically (relaxed)
    into a zeroed float32 (D, T) buffer per head padded to the blocks: 5
    dots per tile, as FlashAttention-2 (CUDA). Without it (TPU: Mosaic has
    no atomics; `deterministic`) `_dq_kernel` follows: 4 + 3 dots.

    `keys_first` (CUDA) computes the tiles as (keys, queries): `s^T = k q^T`
    and `dP^T = v (r dO)^T` come out of the dots and `dQ^T = k^T dS^T` needs
    no transposed register tile. TPU keeps (queries, keys) tiles, transposed
    for the dK / dV products, the form its Mosaic lowering was checked in."""
    mask_ref, refs = (refs[0], refs[1:]) if has_mask else (None, refs)
    dk_ref, dv_ref, dqt_ref = refs[-3:] if fuse_dq else refs + (None,)
    t, s_, d, dv_dim = _dims(lim)
    pre, post = _scales(act, scale)
    block_k = k_ref.shape[0]
    start_k = _block_id(lim) * block_k
    k = _ld(k_ref, lim, row0=start_k, n_rows=s_, n_cols=d)
    v = _ld(v_ref, lim, row0=start_k, n_rows=s_, n_cols=dv_dim)
    # Which of this block's keys are real (the same for every query block):
    # a column of a (keys, queries) tile, or a row of a (queries, keys) one.
    key_valid = _valid(start_k, block_k, num_keys, padded_keys, None)
    if key_valid is not None and keys_first:
        key_valid = (start_k + lax.broadcasted_iota(jnp.int32, (block_k, 1), 0)) < num_keys

    def body(i, carry):
        dk, dv = carry
        start = pl.multiple_of(i * block_q, block_q)
        rows = pl.ds(start, block_q)
        q = _ld(q_ref, lim, rows, row0=start, n_rows=t, n_cols=d)
        s = _times(_dot(k, q, _NT) if keys_first else _dot(q, k, _NT), pre)      # 1
        valid = _key_block_valid(key_valid, mask_ref, lim, rows, start, t, start_k, s_,
                                 keys_first)
        w, g = _weights_and_grads(s, valid, act)
        dor = _ld(dor_ref, lim, rows, row0=start, n_rows=t, n_cols=dv_dim)
        w = w.astype(q.dtype)
        dv = dv + _dot(w if keys_first else w.T, dor, _NN)                       # 2
        dp = _dot(v, dor, _NT) if keys_first else _dot(dor, v, _NT)              # 3
        ds = _times(dp * g, pre).astype(q.dtype)
        dk = dk + _dot(ds if keys_first else ds.T, q, _NN)                       # 4
        if fuse_dq:  # the buffer is padded to the blocks: no bounds, no mask
            dqt = _dot(k, ds, _TN)                                               # 5: (D, queries)
            plgpu.atomic_add(dqt_ref, (slice(None), pl.ds(start, block_q)), dqt)
        return dk, dv

    zeros = jnp.zeros(k.shape, jnp.float32), jnp.zeros(v.shape, jnp.float32)
    dk, dv = lax.fori_loop(0, q_ref.shape[0] // block_q, body, zeros)
    _st(dk_ref, _times(dk, post), lim, row0=start_k, n_rows=s_, n_cols=d)
    _st(dv_ref, _times(dv, post), lim, row0=start_k, n_rows=s_, n_cols=dv_dim)


def _dq_kernel(q_ref, k_ref, v_ref, dor_ref, *refs, act, scale, block_k, num_keys,
               has_mask, lim):
    mask_ref, dq_ref = refs if has_mask else (None, refs[0])
    t, s_, d, dv = _dims(lim)
    pre, post = _scales(act, scale)
    dh = ACTIVATIONS[act][1]
    row0 = _block_id(lim) * q_ref.shape[0]
    q = _ld(q_ref, lim, row0=row0, n_rows=t, n_cols=d)
    dor = _ld(dor_ref, lim, row0=row0, n_rows=t, n_cols=dv)
    padded_keys = k_ref.shape[0]

    def body(j, dq):
        start = pl.multiple_of(j * block_k, block_k)
        keys = pl.ds(start, block_k)
        k = _ld(k_ref, lim, keys, row0=start, n_rows=s_, n_cols=d)
        s = _times(_dot(q, k, _NT), pre)
        g = dh(s)
        m = None if mask_ref is None else _ld(mask_ref, lim, cols=keys, row0=row0, n_rows=(
            t if mask_ref.shape[0] > 1 else None), col0=start, n_cols=s_)
        valid = _valid(start, block_k, num_keys, padded_keys, m)
        if valid is not None:
            g = jnp.where(valid, g, 0.0)
        v = _ld(v_ref, lim, keys, row0=start, n_rows=s_, n_cols=dv)
        ds = _times(_dot(dor, v, _NT) * g, pre)
        return dq + _dot(ds.astype(k.dtype), k, _NN)

    dq = lax.fori_loop(0, padded_keys // block_k, body, jnp.zeros(q.shape, jnp.float32))
    _st(dq_ref, _times(dq, post), lim, row0=row0, n_rows=t, n_cols=d)


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


def _compiler_params(mode, head_dim, vmem_bytes, warps=8):
    if mode == "tpu":
        from jax.experimental.pallas import tpu as pltpu

        # Raise the scoped VMEM limit (16-32 MiB by default) only where the
        # resident keys and values need it (long sequences, float32, d = 128).
        limit = None if vmem_bytes <= 12 * 2**20 else int(vmem_bytes * 1.25)
        return pltpu.CompilerParams(dimension_semantics=("parallel",) * 3,
                                    vmem_limit_bytes=limit)
    if mode == "triton":
        # 8 warps, as JAX's own Pallas attention uses for such tiles (with
        # 4, ptxas spilled 68 / 3172 / 920 bytes (fwd / dK-dV / dQ) at bf16,
        # d = 64 and 128 x 128 tiles), but `GPU_WARPS` where 8 warps would
        # compute a 64-row dot twice (tests/once/test_accelerator_build.py
        # reads ptxas' report and the SASS).
        return plgpu.CompilerParams(num_warps=warps, num_stages=2)
    return None


# Platform -> how the kernel is lowered there; chosen when the program is
# lowered (`lax.platform_dependent`), so one traced function serves all.
# Elsewhere (a CPU) Pallas' interpreter runs the in-place layout
# ("interpret"); "interpret_padded" interprets the TPU layout (for tests).
_PLATFORMS = {"tpu": "tpu", "cuda": "triton"}
_PADDED = ("tpu", "interpret_padded")
INTERPRET_MODE = "interpret"


def _pallas(kernel, grid, in_specs, out_specs, out_shape, mode, head_dim, name, aliases=None,
            warps=8):
    outs = out_shape if isinstance(out_shape, list) else [out_shape]
    out_list = out_specs if isinstance(out_specs, list) else [out_specs]

    def call(*args):
        params = _compiler_params(mode, head_dim, _vmem_bytes(in_specs, out_list, args, outs),
                                  warps)
        return pl.pallas_call(
            kernel, grid=grid, in_specs=in_specs, out_specs=out_specs, out_shape=out_shape,
            compiler_params=params, interpret=mode.startswith("interpret"), name=name,
            input_output_aliases=aliases or {})(*args)

    return call


class _Layout:
    """Block specs of one layout: "padded" (B, H, T, D) arrays padded to the
    blocks (TPU), or "in place" (B, T, H, D) arrays as the layer gives them,
    read with masked loads (CUDA).

    Grids: token block first in place, `(block, batch, head)`, as JAX's own
    GPU attention and FlashAttention-2: programs launched together share one
    head's keys and values in L2. Padded (TPU) `(batch, head, block)`:
    Mosaic runs a core's programs in order and fetches a block only when
    its index changes, so one head's resident keys and values are fetched
    once for all its token blocks."""

    def __init__(self, mode, q, k, v, bq, bk):  # q, k, v: the layer's (B, T, H, D)
        self.padded = mode in _PADDED
        self.t, self.s = q.shape[1], k.shape[1]
        self.d, self.dv = q.shape[3], v.shape[3]
        self.tp, self.sp = -(-self.t // bq) * bq, -(-self.s // bk) * bk
        self.dp, self.dvp = _pow2(self.d), _pow2(self.dv)
        self.lim = None if self.padded else (self.t, self.s, self.d, self.dv)

    def grid(self, b, nh, tokens, block):
        """Programs over a token axis: its padded length's blocks (padded),
        or the blocks that hold a real token (in place)."""
        n = {"t": (self.t, self.tp), "s": (self.s, self.sp)}[tokens]
        blocks = (n[1] if self.padded else n[0] + block - 1) // block
        return (b, nh, blocks) if self.padded else (blocks, b, nh)

    def spec(self, shape, index):
        """A BlockSpec whose index map takes (b, h, i) in either grid order."""
        if self.padded:
            return pl.BlockSpec(shape, index)
        return pl.BlockSpec(shape, lambda i, b, h: index(b, h, i))

    def block(self, n, dim):  # block i of the token axis of head (b, h)
        if self.padded:
            return self.spec((None, None, n, dim), lambda b, h, i: (b, h, i, 0))
        return self.spec((None, n, None, dim), lambda b, h, i: (b, i, h, 0))

    def whole(self, n, dim):  # every token of head (b, h)
        if self.padded:
            return self.spec((None, None, n, dim), lambda b, h, i: (b, h, 0, 0))
        return self.spec((None, n, None, dim), lambda b, h, i: (b, 0, h, 0))

    def query_block_inputs(self, bq, q, k, v, r, mask, do=None):
        """`(in_specs, args)` of a program that owns one query block and
        reads every key: the forward's q, k, v, r[, mask]; dQ's q, k, v,
        r dO[, mask] (`do`, scaled already; `r` None)."""
        in_specs = [self.block(bq, self.dp), self.whole(self.sp, self.dp),
                    self.whole(self.sp, self.dvp)]
        args = [q, k, v]
        if r is not None:
            in_specs.append(self.spec((None, None, bq, 1), lambda b, h, i: (b, h, i, 0)))
            args.append(r)
        if do is not None:
            in_specs.append(self.block(bq, self.dvp))
            args.append(do)
        if mask is not None:  # (bq, S) rows of a (B, T, S) mask, or a key mask's one row
            if mask.shape[1] == 1:
                in_specs.append(self.spec((None, 1, self.sp), lambda b, h, i: (b, 0, 0)))
            else:
                in_specs.append(self.spec((None, bq, self.sp), lambda b, h, i: (b, i, 0)))
            args.append(mask)
        return in_specs, args


def _to_padded(x, tokens, dim):
    """(B, T, H, D) -> (B, H, T, D) padded to `tokens` and `dim`."""
    return _pad_to(_pad_to(jnp.transpose(x, (0, 2, 1, 3)), 2, tokens), 3, dim)


def _from_padded(x, tokens, dim):
    return jnp.transpose(x[:, :, :tokens, :dim], (0, 2, 1, 3))


def _padded_inputs(lay, q, k, v, r, mask, do=None):
    """The TPU layout's operands: transposed and padded to the blocks."""
    q, k, v = (_to_padded(q, lay.tp, lay.dp), _to_padded(k, lay.sp, lay.dp),
               _to_padded(v, lay.sp, lay.dvp))
    r = None if r is None else _pad_to(r, 2, lay.tp)
    if mask is not None:
        mask = _pad_to(_pad_to(mask, 1, lay.tp if mask.shape[1] > 1 else 1), 2, lay.sp)
    do = None if do is None else _to_padded(do, lay.tp, lay.dvp)
    return q, k, v, r, mask, do


def _forward(cfg, mode, q, k, v, r, mask):
    act, num_keys, _, _, scale, _, _ = cfg
    row_bytes = _row_bytes(q, v, mask)
    bq, bk = _blocks(cfg, mode, "fwd", row_bytes)
    lay = _Layout(mode, q, k, v, bq, bk)
    b, nh = q.shape[0], q.shape[2]
    if lay.padded:
        q, k, v, r, mask, _ = _padded_inputs(lay, q, k, v, r, mask)
        out_shape = (b, nh, lay.tp, lay.dvp)
    else:
        out_shape = (b, lay.t, nh, lay.dv)
    in_specs, args = lay.query_block_inputs(bq, q, k, v, r, mask)
    kernel = functools.partial(_forward_kernel, act=act, scale=scale, block_k=bk,
                               num_keys=num_keys, has_mask=mask is not None, lim=lay.lim)
    out = _pallas(kernel, lay.grid(b, nh, "t", bq), in_specs, lay.block(bq, lay.dvp),
                  jax.ShapeDtypeStruct(out_shape, q.dtype), mode, lay.dp,
                  "pointwise_attention_fwd",
                  warps=_warps(mode, "fwd", row_bytes, max(lay.dp, lay.dvp)))(*args)
    return _from_padded(out, lay.t, lay.dv) if lay.padded else out


def _backward(cfg, mode, q, k, v, r, mask, do):
    act, num_keys, _, _, scale, _, deterministic = cfg
    row_bytes = _row_bytes(q, v, mask)
    # CUDA (and its interpreted layout): keys first, dQ added atomically in
    # the same pass unless `deterministic`; TPU: queries first, no atomics.
    cuda = mode in ("triton", "interpret")
    fused = cuda and not deterministic
    bq, bk = _blocks(cfg, mode, "bwd" if cuda else "dkdv", row_bytes)
    bq_dq, bk_dq = (bq, bk) if fused else _blocks(cfg, mode, "dq", row_bytes)
    # One padding for both kernels: to the larger blocks (all powers of two).
    lay = _Layout(mode, q, k, v, max(bq, bq_dq), max(bk, bk_dq))
    b, nh = q.shape[0], q.shape[2]
    dor = _scaled_do(do, r)  # both kernels read r dO
    if lay.padded:
        q, k, v, _, mask, dor = _padded_inputs(lay, q, k, v, None, mask, dor)
    has_mask = mask is not None
    warps = _warps(mode, "bwd", row_bytes, max(lay.dp, lay.dvp))  # fused / dK-dV
    # dK, dV: one program per key block, looping over query blocks.
    in_specs = [lay.whole(lay.tp, lay.dp), lay.block(bk, lay.dp), lay.block(bk, lay.dvp),
                lay.whole(lay.tp, lay.dvp)]
    args = [q, k, v, dor]
    if has_mask:
        rows = mask.shape[1] if mask.shape[1] == 1 else lay.tp
        in_specs.append(lay.spec((None, rows, bk), lambda b_, h_, j: (b_, 0, j)))
        args.append(mask)
    out_specs = [lay.block(bk, lay.dp), lay.block(bk, lay.dvp)]
    out_shape = [jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)]
    options = dict(act=act, scale=scale, block_q=bq, num_keys=num_keys, padded_keys=lay.sp,
                   has_mask=has_mask, lim=lay.lim, keys_first=cuda)
    if fused:  # dQ^T: float32 (B, H, D, T), zeroed, padded to the blocks
        dqt = lay.spec((None, None, lay.dp, lay.tp), lambda b_, h_, j: (b_, h_, 0, 0))
        in_specs.append(dqt)
        out_specs.append(dqt)
        args.append(jnp.zeros((b, nh, lay.dp, lay.tp), jnp.float32))
        out_shape.append(jax.ShapeDtypeStruct((b, nh, lay.dp, lay.tp), jnp.float32))
        dk, dv, dqt = _pallas(functools.partial(_dkdv_kernel, fuse_dq=True, **options),
                              lay.grid(b, nh, "s", bk), in_specs, out_specs, out_shape, mode,
                              lay.dp, "pointwise_attention_bwd",
                              aliases={len(args) - 1: 2}, warps=warps)(*args)
        dq = _times(jnp.transpose(dqt[:, :, :lay.d, :lay.t], (0, 3, 1, 2)),
                    _scales(act, scale)[1]).astype(q.dtype)
        return dq, dk, dv
    kernel = functools.partial(_dkdv_kernel, fuse_dq=False, **options)
    dk, dv = _pallas(kernel, lay.grid(b, nh, "s", bk), in_specs, out_specs, out_shape, mode,
                     lay.dp, "pointwise_attention_dkdv", warps=warps)(*args)
    # dQ: one program per query block, looping over key blocks.
    in_specs, args = lay.query_block_inputs(bq_dq, q, k, v, None, mask, dor)
    kernel = functools.partial(_dq_kernel, act=act, scale=scale, block_k=bk_dq,
                               num_keys=num_keys, has_mask=has_mask, lim=lay.lim)
    dq = _pallas(kernel, lay.grid(b, nh, "t", bq_dq), in_specs, lay.block(bq_dq, lay.dp),
                 jax.ShapeDtypeStruct(q.shape, q.dtype), mode, lay.dp,
                 "pointwise_attention_dq",
                 warps=_warps(mode, "dq", row_bytes, max(lay.dp, lay.dvp)))(*args)
    if lay.padded:
        dq, dk, dv = (_from_padded(dq, lay.t, lay.d), _from_padded(dk, lay.s, lay.d),
                      _from_padded(dv, lay.s, lay.dv))
    return dq, dk, dv


def _on_platform(fn, cfg, *args, interpret=False):
    interpreted = functools.partial(fn, cfg, INTERPRET_MODE)
    if interpret:
        return interpreted(*args)
    branches = {p: functools.partial(fn, cfg, mode) for p, mode in _PLATFORMS.items()}
    return lax.platform_dependent(*args, default=interpreted, **branches)


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
    # o = r * u, so dr = sum_d do * u = sum_d do * o / r (r > 0 on real rows).
    dot = jnp.sum(do.astype(jnp.float32) * out.astype(jnp.float32), axis=-1)  # (B, T, H)
    dot = jnp.transpose(dot, (0, 2, 1))[..., None]  # like r: (B, H, T, 1)
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
              interpret=None, block_q=None, block_k=None, deterministic=None):
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
        deterministic: on CUDA, the backward without atomics (a dK/dV and a
            dQ kernel: bitwise reproducible gradients, two more dots per
            tile). None follows XLA's `--xla_gpu_deterministic_ops=true`
            (in `XLA_FLAGS`). TPU always takes that path (no atomics).
    """
    if activation not in ACTIVATIONS:
        raise ValueError(f"The Pallas kernel computes {sorted(ACTIVATIONS)}, not {activation!r}.")
    b, t, nh, d = query.shape
    s = key.shape[1]
    bq, bk = block_q or _block(t), block_k or _block(s)
    r = row_factor_array(factor, b, t, nh)
    if mask is not None:
        mask = jnp.asarray(mask, bool)
        mask = mask.reshape((1,) * (3 - mask.ndim) + mask.shape)
        rows = 1 if mask.shape[1] == 1 else t  # a key mask stays one row
        mask = jnp.broadcast_to(mask, (b, rows, s)).astype(jnp.int32)
    forced = block_q is not None or block_k is not None
    if deterministic is None:
        deterministic = pallas_deterministic()
    cfg = (activation, s, bq, bk, 1.0 / math.sqrt(d), forced, bool(deterministic))
    return _fused(cfg, bool(interpret), query, key, value, r, mask)
