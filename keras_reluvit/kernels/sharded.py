"""Pointwise attention under a multi-device `keras.distribution` (JAX).

- `sequence_parallel`: tokens sharded over a mesh axis
  (`kr.distribution.model_parallel(..., sequence_axis=...)`); each device
  gathers the queries, computes the partial sum over *its* keys
  `sum_{j in shard} h(q_i . k_j) v_j` for every query, and one
  reduce-scatter (`psum_scatter`) combines them. Softmax ring attention must
  also exchange running maxima and log-sum-exps and rescale; a plain sum is
  all ReLU/L needs.
- `pallas_sharded`: the Pallas kernel per shard (a `shard_map` over the
  batch axis, and the head axis of tensor parallelism), since XLA cannot
  split a kernel's custom call and would otherwise compute the whole batch
  on every device.
"""

import math

import keras
from keras import ops

from keras_reluvit.kernels.keras_ops import apply_factor
from keras_reluvit.kernels.keras_ops import scores_and_weights


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


def pallas_sharded(query, key, value, activation, factor, mask, deterministic=None):
    """The Pallas kernel under the current `keras.distribution` (JAX): XLA
    cannot split a kernel's custom call, so on a multi-device mesh it would
    gather the batch onto every device and compute all of it there. Here
    each device runs the kernel on its own shard instead (a `shard_map` over
    the distribution's batch axis, and its head axis where tensor
    parallelism splits the heads), which is exact: attention never mixes
    batch elements or heads. Without such a mesh, or when neither axis
    divides, the kernel runs on the whole arrays. `deterministic`: the
    kernel's (None: its default)."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec

    from keras_reluvit.kernels import pallas

    found = _distribution_mesh()
    if found is None:
        return pallas.attention(query, key, value, activation, factor, mask,
                                deterministic=deterministic)
    dist, mesh, sizes = found
    b, t, nh, _ = query.shape

    batch = _axis_if_divides(sizes, getattr(dist, "batch_dim_name", None), b)
    heads = _axis_if_divides(sizes, getattr(dist, "head_axis", None), nh, (batch,))
    if batch is None and heads is None:
        return pallas.attention(query, key, value, activation, factor, mask,
                                deterministic=deterministic)
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
        return pallas.attention(q, k, v, activation, f, rest[0] if rest else None,
                                deterministic=deterministic)

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
            from keras_reluvit.kernels import pallas

            partial = pallas.attention(q_all, k, v, kernel_activation)
        else:
            partial = ops.einsum("bhts,bshd->bthd", scores_and_weights(q_all, k, h, None), v)
        return jax.lax.psum_scatter(partial, seq_axis, scatter_dimension=1, tiled=True)

    out = jax.shard_map(local, mesh=mesh.backend_mesh, in_specs=(spec, spec, spec),
                        out_specs=spec, check_vma=False)(query, key, value)
    if pad_t:
        out = out[:, :t]
    return apply_factor(out, factor)
