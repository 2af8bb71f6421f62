"""Computation paths of pointwise attention, chosen at one dispatch point.

All paths compute `o_i = r_i * sum_j m_ij h(q_i . k_j / sqrt(d)) v_j` with the
row factor `r_i = exp(s_h) * L_i^-alpha` applied to the *output* rows (T x Dv)
rather than to the T x S weights: the only T x S work left is the score
matmul, the activation (and mask) and the value matmul.

- `generic`: `keras.ops` einsums; every backend; the reference.
- `chunked`: keys in blocks of `chunk_size` whose partial outputs are summed
  (no running max, no rescaling: the property that makes ReLU/L simpler than
  softmax), queries in blocks too; each block is wrapped in `keras.remat` so
  training keeps O(T * chunk) activation memory instead of O(T * S).
- `torch_tiled`: PyTorch eager, no mask / dropout / weights returned: loops
  over (batch * heads, query) tiles so that each score tile stays in cache,
  applies the activation in place, and writes into a preallocated output
  when no gradient is recorded. XLA fuses the generic path on JAX and TF;
  eager PyTorch does not, hence this path.
- `torch_fused`: PyTorch CPU, relu / relu2 / relu6 / identity: the compiled
  kernel of `keras_reluvit.torch_fused` (BLAS calls per (batch, head, query
  tile) and key block in a `parallel_for`, key blocks summed, the activation
  in place in a cache-sized buffer, `L^-alpha` folded into the second
  matmul). Under autograd the same forward in a `torch.autograd.Function`
  whose C++ backward recomputes the scores per (query tile, key block):
  five BLAS calls per block, no T x S tensor kept between forward and
  backward.
- `pallas`: JAX, the fused kernel of `keras_reluvit.pallas_attention` (tiles
  in on-chip memory, no T x S tensor in HBM, a custom VJP recomputing the
  scores per tile): Mosaic on TPU, Triton on CUDA GPUs, Pallas' interpreter
  on a CPU (slow: for checking). Under a multi-device `keras.distribution`
  it runs per shard (`pallas_sharded`: a `shard_map` over the batch axis,
  and the head axis of tensor parallelism), since XLA cannot split a
  kernel's custom call and would otherwise compute the whole batch on
  every device.
- `triton`: PyTorch CUDA tensors, the Triton kernels of
  `keras_reluvit.triton_attention` (same algorithm, `torch.autograd.Function`).
- `sequence_parallel`: JAX under a `kr.distribution.model_parallel(...,
  sequence_axis=...)` distribution: tokens sharded over that mesh axis; each
  device gathers the queries, computes the partial sum over *its* keys
  `sum_{j in shard} h(q_i . k_j) v_j` for every query, and one reduce-scatter
  (`psum_scatter`: the psum, each device keeping its own query rows)
  combines them. Softmax ring attention must also exchange running maxima
  and log-sum-exps and rescale; a plain sum is all ReLU/L needs.
"""

import contextlib
import math
import os
import sys
import warnings

import keras
from keras import ops

# --- the kernel switch ----------------------------------------------------------
KERNELS = ("auto", "pallas", "triton", "generic")
KERNEL_ENV = "KERAS_RELUVIT_KERNEL"
_kernel = []  # set_kernel's value, over the environment variable


def _check_kernel(name, where):
    if name not in KERNELS:
        raise ValueError(f"{where} must be one of {', '.join(KERNELS)}; got {name!r}.")
    return name


def set_kernel(name):
    """Sets the kernel switch for this process (over `KERAS_RELUVIT_KERNEL`):
    `"auto"` (default: the fused accelerator kernel where there is one --
    Pallas when JAX's default device is a TPU or CUDA GPU, Triton for CUDA
    tensors on PyTorch -- and the CPU paths elsewhere), `"pallas"` (JAX; in
    Pallas' interpreter on a CPU), `"triton"` (PyTorch; CUDA tensors, or CPU
    tensors under `TRITON_INTERPRET=1`), `"generic"` (the `keras.ops` paths
    only). None goes back to the environment variable."""
    _kernel[:] = [] if name is None else [_check_kernel(name, "the kernel")]


def get_kernel():
    """The kernel switch in force (`set_kernel`, else `KERAS_RELUVIT_KERNEL`)."""
    if _kernel:
        return _kernel[0]
    return _check_kernel(os.environ.get(KERNEL_ENV, "auto").strip().lower() or "auto",
                         KERNEL_ENV)


@contextlib.contextmanager
def use_kernel(name):
    """`with use_kernel("pallas"): ...` sets the switch inside the block."""
    previous = list(_kernel)
    set_kernel(name)
    try:
        yield
    finally:
        _kernel[:] = previous


def jax_accelerator():
    """"tpu" or "cuda" when JAX's default device is one, else None."""
    import jax

    backend = jax.default_backend()
    if backend == "tpu":
        return "tpu"
    if backend == "gpu":
        try:  # "cuda 12080" / "rocm ..."; a private-ish attribute: tolerate its absence
            version = str(jax.devices()[0].client.platform_version)
        except Exception:  # noqa: BLE001
            version = ""
        return None if "rocm" in version.lower() else "cuda"
    return None


def triton_module():
    """`keras_reluvit.triton_attention`; raises ImportError / RuntimeError
    naming why it cannot be used in this process.

    Triton and TensorFlow both carry LLVM: in one process, loading Triton's
    after TensorFlow's aborts it ("CommandLine Error: Option ... registered
    more than once"); the other order works. Keras' torch backend imports
    `torch._dynamo`, which imports Triton when it is installed, so `import
    keras` (or keras_reluvit) before TensorFlow / tensorflow_datasets is
    what a PyTorch user with Triton needs; where TensorFlow came first this
    says so instead of aborting."""
    if "triton" not in sys.modules and "tensorflow" in sys.modules:
        raise RuntimeError(
            "TensorFlow was imported before Triton in this process, and loading Triton "
            "after it aborts the process (both carry LLVM). Import keras (torch backend) "
            "or triton before tensorflow.")
    try:
        from keras_reluvit import triton_attention
    except ImportError as error:
        raise ImportError("The Triton kernel needs triton: pip install "
                          "'keras-reluvit[cuda]'.") from error
    return triton_attention


_WARNED = set()


def _warn_once(message):
    if message not in _WARNED:
        _WARNED.add(message)
        warnings.warn(message, stacklevel=3)


def _pallas_if(activation_name):
    from keras_reluvit import pallas_attention

    return "pallas" if activation_name in pallas_attention.ACTIVATIONS else None


def fused_kernel(switch, backend, query, activation_name, value=None):
    """The fused accelerator kernel this call takes under the switch:
    `"pallas"`, `"triton"` or None. A forced kernel the backend or device
    cannot run raises a ValueError naming why; a custom (callable)
    activation takes no fused kernel."""
    if switch == "generic":
        return None
    if switch == "pallas":
        if backend != "jax":
            raise ValueError(f"{KERNEL_ENV}=pallas needs the JAX backend; this is {backend}.")
        return _pallas_if(activation_name)
    if switch == "triton":
        if backend != "torch":
            raise ValueError(f"{KERNEL_ENV}=triton needs the PyTorch backend; this is {backend}.")
        try:
            module = triton_module()
        except (ImportError, RuntimeError) as error:
            raise ValueError(f"{KERNEL_ENV}=triton: {error}") from error
        if activation_name not in module.ACTIVATIONS:
            return None
        module.check(query, activation_name, value)
        return "triton"
    # auto
    if backend == "jax" and jax_accelerator() is not None:
        return _pallas_if(activation_name)
    if backend == "torch" and getattr(query.device, "type", None) == "cuda":
        try:
            module = triton_module()
        except (ImportError, RuntimeError) as error:
            _warn_once(f"Pointwise attention on CUDA tensors without its Triton kernel "
                       f"(the generic path instead): {error}")
            return None
        try:  # an activation or head dim it does not take: the generic path
            module.check(query, activation_name, value)
        except ValueError:
            return None
        return "triton"
    return None


# Above this many scores per (batch, head) the "auto" choice chunks.
AUTO_CHUNK_SCORES = 4096 * 4096
AUTO_CHUNK_SIZE = 1024
_INPLACE = {"relu": "relu_", "sigmoid": "sigmoid_"}


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


def _apply(out, factor):
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
    return _apply(out, factor), weights


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
    return _apply(out, factor)


# Score elements per tile of the torch path (~512 KiB of float32: L2-sized).
TILE_ELEMENTS = 2**17


def torch_tiled(query, key, value, activation_name, h, factor, tile_bh=None, tile_q=None):
    """PyTorch eager tiles; `(B, T, H, D)` in and out."""
    import torch

    b, t, nh, d = query.shape
    s, dv = key.shape[1], value.shape[-1]
    if tile_bh is None:
        tile_bh = max(1, TILE_ELEMENTS // (t * s))
    if tile_q is None:
        tile_q = t if tile_bh > 1 else min(t, max(64, TILE_ELEMENTS // s))
    q = (query * (1.0 / math.sqrt(d))).permute(0, 2, 1, 3).reshape(b * nh, t, d)
    kt = key.permute(0, 2, 3, 1).reshape(b * nh, d, s)
    v = value.permute(0, 2, 1, 3).reshape(b * nh, s, dv)
    tile_q = tile_q or t
    inplace = _INPLACE.get(activation_name)
    record = torch.is_grad_enabled() and any(x.requires_grad for x in (q, kt, v))
    out = None if record else torch.empty((b * nh, t, dv), dtype=q.dtype, device=q.device)
    pieces = []
    for j in range(0, b * nh, tile_bh):
        kj, vj = kt[j : j + tile_bh], v[j : j + tile_bh]
        row = []
        for i in range(0, t, tile_q):
            w = torch.bmm(q[j : j + tile_bh, i : i + tile_q], kj)
            w = getattr(w, inplace)() if inplace else h(w)
            if record:
                row.append(torch.bmm(w, vj))
            else:
                torch.bmm(w, vj, out=out[j : j + tile_bh, i : i + tile_q])
        if record:
            pieces.append(torch.cat(row, dim=1) if len(row) > 1 else row[0])
    if record:
        out = torch.cat(pieces, dim=0) if len(pieces) > 1 else pieces[0]
    out = out.reshape(b, nh, t, dv).permute(0, 2, 1, 3)
    return _apply(out, factor)


def _distribution_mesh():
    """`(distribution, mesh, axis sizes)` of the current `keras.distribution`
    on JAX when its mesh has more than one device, else None."""
    if keras.backend.backend() != "jax":
        return None
    dist = keras.distribution.distribution()
    mesh = getattr(dist, "device_mesh", None)
    if mesh is None or math.prod(mesh.shape) <= 1:
        return None
    return dist, mesh, dict(zip(mesh.axis_names, mesh.shape))


def sequence_parallel_context():
    """`(mesh, seq_axis, batch_axis, head_axis)` when the current
    `keras.distribution` asks for sequence-parallel attention (JAX, a
    `sequence_axis` of size > 1), else None."""
    found = _distribution_mesh()
    if found is None:
        return None
    dist, mesh, sizes = found
    axis = getattr(dist, "sequence_axis", None)
    if axis is None or sizes.get(axis, 1) <= 1:
        return None
    return mesh, axis, getattr(dist, "batch_dim_name", None), getattr(dist, "head_axis", None)


def _axis_if_divides(sizes, axis, size, taken=()):
    """`axis` when it is a mesh axis (of `sizes`), not one of `taken`, and
    divides `size`; else None (that dimension stays whole)."""
    return axis if axis in sizes and axis not in taken and size % sizes[axis] == 0 else None


def pallas_sharded(query, key, value, activation, factor, mask):
    """The Pallas kernel under the current `keras.distribution` (JAX): XLA
    cannot split a kernel's custom call, so on a multi-device mesh it would
    gather the batch onto every device and compute all of it there. Here
    each device runs the kernel on its own shard instead (a `shard_map` over
    the distribution's batch axis, and its head axis where tensor
    parallelism splits the heads), which is exact: attention never mixes
    batch elements or heads. Without such a mesh, or when neither axis
    divides, the kernel runs on the whole arrays."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec

    from keras_reluvit import pallas_attention

    found = _distribution_mesh()
    if found is None:
        return pallas_attention.attention(query, key, value, activation, factor, mask)
    dist, mesh, sizes = found
    b, t, nh, _ = query.shape

    batch = _axis_if_divides(sizes, getattr(dist, "batch_dim_name", None), b)
    heads = _axis_if_divides(sizes, getattr(dist, "head_axis", None), nh, (batch,))
    if batch is None and heads is None:
        return pallas_attention.attention(query, key, value, activation, factor, mask)
    spec = PartitionSpec(batch, None, heads, None)
    args, specs = [query, key, value], [spec, spec, spec]
    per_row = factor is not None and not isinstance(factor, float)
    if per_row:  # a factor per row / head is sharded too; a constant stays one
        args.append(jnp.broadcast_to(jnp.asarray(factor, jnp.float32), (b, t, nh, 1)))
        specs.append(spec)
    if mask is not None:
        mask = jnp.asarray(mask)
        args.append(jnp.broadcast_to(mask, (b,) + mask.shape[1:]))
        specs.append(PartitionSpec(batch, None, None))

    def local(q, k, v, *rest):
        rest = list(rest)
        f = rest.pop(0) if per_row else factor
        return pallas_attention.attention(q, k, v, activation, f, rest[0] if rest else None)

    return jax.shard_map(local, mesh=mesh.backend_mesh, in_specs=tuple(specs), out_specs=spec,
                         check_vma=False)(*args)


def sequence_parallel(query, key, value, h, factor, mesh, seq_axis, batch_axis=None,
                      head_axis=None, kernel_activation=None):
    """JAX: tokens of q, k, v sharded over `seq_axis` of `mesh` (a
    `keras.distribution.DeviceMesh`); `(B, T, H, D)` in and out, the output
    sharded like the query. Batch and heads are split over `batch_axis` /
    `head_axis` too when those axes exist and divide them. With
    `kernel_activation` (a name) each device's partial sums come from the
    Pallas kernel instead of einsums."""
    import jax
    from jax.sharding import PartitionSpec

    sizes = dict(zip(mesh.axis_names, mesh.shape))
    if seq_axis not in sizes:
        raise ValueError(f"sequence axis {seq_axis!r} is not an axis of the mesh {list(sizes)}.")
    n = sizes[seq_axis]
    b, t, nh, _ = query.shape
    s = key.shape[1]
    # Token counts the axis does not divide (a class token: 197; the MAP
    # head's one probe query) are padded to a multiple of it: padded queries
    # are sliced off, padded keys get zero values, so they add nothing to any
    # sum whatever h(0) is, and `factor` already holds the real L^-alpha.
    pad_t, pad_s = (-t) % n, (-s) % n
    if pad_t:
        query = ops.pad(query, [[0, 0], [0, pad_t], [0, 0], [0, 0]])
    if pad_s:
        key = ops.pad(key, [[0, 0], [0, pad_s], [0, 0], [0, 0]])
        value = ops.pad(value, [[0, 0], [0, pad_s], [0, 0], [0, 0]])

    spec = PartitionSpec(_axis_if_divides(sizes, batch_axis, b, (seq_axis,)), seq_axis,
                         _axis_if_divides(sizes, head_axis, nh, (seq_axis,)), None)

    def local(q, k, v):
        q_all = jax.lax.all_gather(q, seq_axis, axis=1, tiled=True)
        if kernel_activation is not None:
            from keras_reluvit import pallas_attention

            partial = pallas_attention.attention(q_all, k, v, kernel_activation)
        else:
            partial = ops.einsum("bhts,bshd->bthd", scores_and_weights(q_all, k, h, None), v)
        return jax.lax.psum_scatter(partial, seq_axis, scatter_dimension=1, tiled=True)

    out = jax.shard_map(local, mesh=mesh.backend_mesh, in_specs=(spec, spec, spec),
                        out_specs=spec, check_vma=False)(query, key, value)
    if pad_t:
        out = out[:, :t]
    return _apply(out, factor)


def torch_recording(*tensors):
    """Whether torch autograd records an op on these tensors."""
    import torch

    return torch.is_grad_enabled() and any(getattr(x, "requires_grad", False) for x in tensors)


def choose(backend, activation_name, mask, want_weights, dropout, t, s, chunk_size,
           recording=False, sequence_parallel=False, fused=False, kernel=None,
           cpu_kernels=True):
    """The dispatch rule: which path computes this call.

    Weights or dropout wanted -> generic. A sequence-parallel distribution
    (JAX) and no mask -> sequence_parallel (each shard's partial sums through
    `kernel` when it is "pallas"). A fused accelerator `kernel` ("pallas",
    "triton"; see `fused_kernel`) -> that kernel (it is memory-light, so it
    serves `chunk_size` too). A chunk size (or "auto" above
    4096 x 4096 scores) -> chunked. PyTorch without a mask -> `torch_fused`
    (the C++ kernel of `keras_reluvit.torch_fused`; under autograd with its
    C++ backward) when `fused` says it takes this activation, dtype and
    device; else, for inference, torch_tiled (under autograd many small
    tiles cost more than they save: generic). Otherwise generic (XLA fuses
    it on JAX and TF). `cpu_kernels=False` (the "generic" switch) leaves out
    the torch CPU paths.
    """
    if want_weights or dropout:
        return "generic"
    if sequence_parallel and mask is None:
        return "sequence_parallel"
    if kernel is not None:
        return kernel
    if chunk_size == "auto":
        chunk_size = AUTO_CHUNK_SIZE if t * s > AUTO_CHUNK_SCORES else None
    if chunk_size:
        return "chunked"
    if backend == "torch" and mask is None and activation_name is not None and cpu_kernels:
        if fused:  # inference, or training with its C++ backward
            return "torch_fused"
        if not recording:
            return "torch_tiled"
    return "generic"
