"""Layouts of every ViT variable over a `keras.distribution.DeviceMesh`
(JAX): the data, FSDP and tensor-parallel strategies, sequence
parallelism, and the checks that a layout divides what it shards."""

import keras

from keras_reluvit.distribution.cluster import process_count
from keras_reluvit.distribution.cluster import tf_strategy
from keras_reluvit.distribution.cluster import torch_distributed

STRATEGIES = ("data", "fsdp", "tensor")
B, M = "batch", "model"  # placeholders for the mesh axis names

# pattern -> {strategy: layout}; a layout lists, per dimension, B, M or None.
RULES = {
    r"(.*/)?attention/(query|key|value|gate)/kernel": {
        "fsdp": (B, None, None), "tensor": (None, M, None)},        # (D, H, Dh)
    r"(.*/)?attention/(query|key|value|gate)/bias": {
        "fsdp": (None, None), "tensor": (M, None)},                  # (H, Dh)
    r"(.*/)?attention/attention_output/kernel": {
        "fsdp": (None, None, B), "tensor": (M, None, None)},         # (H, Dh, D)
    r"(.*/)?mlp/fc1/kernel": {"fsdp": (None, B), "tensor": (None, M)},  # (D, 4D)
    r"(.*/)?mlp/fc1/bias": {"fsdp": (None,), "tensor": (M,)},
    r"(.*/)?mlp/fc2/kernel": {"fsdp": (B, None), "tensor": (M, None)},  # (4D, D)
    r"embedding/kernel": {
        "fsdp": (None, None, None, B), "tensor": (None, None, None, M)},  # (p, p, 3, D)
    r"pos_embedding/embedding": {"fsdp": (None, None, B), "tensor": (None, None, M)},
    r"(pre_logits|head)/kernel": {"fsdp": (B, None), "tensor": (M, None)},  # (D, C)
}


def _check_backend():
    backend = keras.backend.backend()
    if backend == "jax":
        return
    if backend == "tensorflow":
        raise RuntimeError(
            "keras.distribution layouts run on the JAX backend only (Keras 3.15). On "
            "TensorFlow, data parallelism runs on tf.distribute: one host, build and "
            "compile inside `with tf.distribute.MirroredStrategy().scope():`; several "
            "hosts, set TF_CONFIG and call kr.distribution.initialize() (a "
            "MultiWorkerMirroredStrategy) and kr.distribution.multi_worker(model, train, "
            "val), or run `keras-reluvit train` on every worker (docs/distribution.md). "
            "FSDP / tensor / sequence layouts: KERAS_BACKEND=jax."
        )
    raise RuntimeError(
        f"keras.distribution layouts do not run on the {backend} backend (Keras 3.15). On "
        "PyTorch, data parallelism runs on DistributedDataParallel: under torchrun call "
        "kr.distribution.initialize() and model = kr.distribution.ddp(model), or run "
        "`torchrun --nproc_per_node N -m keras_reluvit_cli train ...` "
        "(docs/distribution.md). FSDP / tensor / sequence layouts: KERAS_BACKEND=jax."
    )


def layout_map(mesh, strategy="fsdp", batch_axis="batch", model_axis="model"):
    """A `keras.distribution.LayoutMap` for every ViT variable path.

    Args:
        mesh: a `keras.distribution.DeviceMesh`.
        strategy: `"data"`, `"fsdp"` or `"tensor"`.
        batch_axis, model_axis: the mesh axis names to use.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"Unknown strategy {strategy!r}; valid: {', '.join(STRATEGIES)}.")
    names = list(mesh.axis_names)
    needed = {"fsdp": [batch_axis], "tensor": [model_axis], "data": [batch_axis]}[strategy]
    for axis in needed:
        if axis not in names:
            raise ValueError(
                f"strategy={strategy!r} needs a mesh axis named {axis!r}; the mesh has "
                f"{names}. Name it so or pass batch_axis=/model_axis=."
            )
    rename = {B: batch_axis, M: model_axis}
    result = keras.distribution.LayoutMap(mesh)
    for pattern, layouts in RULES.items():
        layout = layouts["fsdp"] if strategy == "data" else layouts[strategy]
        if strategy == "data":
            layout = (None,) * len(layout)
        result[pattern] = tuple(rename.get(a, a) for a in layout)
    return result


class ViTModelParallel(keras.distribution.ModelParallel):
    """`ModelParallel` that checks each layout divides its variable."""

    def get_variable_layout(self, variable):
        layout = super().get_variable_layout(variable)
        mesh = self.device_mesh
        sizes = dict(zip(mesh.axis_names, mesh.shape))
        for dim, axis in enumerate(layout.axes):
            if axis is None:
                continue
            if dim >= len(variable.shape):
                raise ValueError(
                    f"Layout {layout.axes} of {variable.path} has more dimensions than "
                    f"its shape {tuple(variable.shape)}."
                )
            if variable.shape[dim] % sizes[axis]:
                raise ValueError(
                    f"Cannot shard {variable.path} of shape {tuple(variable.shape)}: "
                    f"dimension {dim} ({variable.shape[dim]}) is not divisible by mesh "
                    f"axis {axis!r} of size {sizes[axis]}. Choose a mesh whose {axis!r} "
                    "size divides it (e.g. heads and widths are powers of two times "
                    "3 for Ti/S), or another strategy."
                )
        return layout


def model_parallel(mesh, strategy="fsdp", batch_axis="batch", model_axis="model",
                   sequence_axis=None):
    """A `ModelParallel` distribution with `layout_map(mesh, strategy)`.

    The batch is split over `batch_axis`. JAX backend only.

    Args:
        mesh: a `keras.distribution.DeviceMesh`.
        strategy: `"data"`, `"fsdp"` or `"tensor"` (see the module docstring).
        batch_axis, model_axis: mesh axis names.
        sequence_axis: a mesh axis to split the *tokens* over (sequence
            parallelism): every block's output is sharded `(batch, tokens,
            -)` and pointwise attention runs the sequence-parallel path
            (partial sums over each device's keys, one reduce-scatter).
            Token counts the axis does not divide (a class token: 197; the
            MAP head's single probe query) are padded inside the attention
            (padded keys carry zero values, so `L` stays the real count).
            Softmax attention is left to XLA's sharding propagation.

    Example:

    ```python
    mesh = keras.distribution.DeviceMesh((2, 4), ["batch", "seq"], keras.distribution.list_devices())
    keras.distribution.set_distribution(
        kr.distribution.model_parallel(mesh, "data", sequence_axis="seq"))
    ```
    """
    _check_backend()
    layouts = layout_map(mesh, strategy, batch_axis, model_axis)
    if sequence_axis is not None:
        names = list(mesh.axis_names)
        if sequence_axis not in names or sequence_axis in (batch_axis, model_axis):
            raise ValueError(
                f"sequence_axis={sequence_axis!r} must be a mesh axis of its own; the mesh "
                f"has {names}, batch_axis={batch_axis!r}, model_axis={model_axis!r}."
            )
        batch = batch_axis if batch_axis in names else None
        for pattern in (r"block_\d+/output", r"pos_embedding/output"):
            layouts[pattern] = (batch, sequence_axis, None)
    dist = ViTModelParallel(layout_map=layouts, batch_dim_name=batch_axis)
    if process_count() > 1:  # each host feeds its own shard (kr.data.load)
        check_mesh(mesh, batch_axis)
        dist.auto_shard_dataset = False
    dist.strategy = strategy
    dist.sequence_axis = sequence_axis
    dist.head_axis = model_axis if strategy == "tensor" else None
    return dist


def describe(dist=None):
    """The active (or given) distribution as a JSON-able dict — the mesh's
    axes and sizes, the strategy and the sequence axis; DDP's or
    MultiWorkerMirroredStrategy's process count — or None when none is
    set. `train()` records it in `config.json`."""
    dist = dist or keras.distribution.distribution()
    if dist is None:
        torch_group = torch_distributed()
        if torch_group is not None:
            return {"type": "DistributedDataParallel", "processes": process_count(),
                    "process_group": torch_group.get_backend()}
        if tf_strategy() is not None:
            return {"type": "MultiWorkerMirroredStrategy", "processes": process_count()}
        return None
    mesh = dist.device_mesh
    return {"type": type(dist).__name__,
            "mesh": dict(zip(mesh.axis_names, (int(n) for n in mesh.shape))),
            "strategy": getattr(dist, "strategy", "data"),
            "sequence_axis": getattr(dist, "sequence_axis", None)}


def mesh_from_spec(spec, devices=None):
    """`"batch=2,model=4"` -> a `keras.distribution.DeviceMesh` of shape (2, 4)
    with those axis names over `devices` (default: all)."""
    try:
        axes = [(k.strip(), int(v)) for k, v in (p.split("=") for p in spec.split(","))]
    except ValueError:
        raise ValueError(f"--mesh must look like batch=2,model=4; got {spec!r}.")
    return keras.distribution.DeviceMesh(tuple(n for _, n in axes), [k for k, _ in axes],
                                         devices or keras.distribution.list_devices())


def data_parallel(devices=None):
    """`keras.distribution.DataParallel` over `devices` (default: all)."""
    _check_backend()
    return keras.distribution.DataParallel(devices=devices)



def check_mesh(mesh, batch_axis="batch"):
    """Checks that `mesh` spans every process' devices and that each process
    holds whole rows of the batch axis (its per-host batch)."""
    count = process_count()
    size = 1
    for n in mesh.shape:
        size *= n
    total = len(keras.distribution.list_devices())
    if size != total:
        raise ValueError(f"The mesh {dict(zip(mesh.axis_names, mesh.shape))} has {size} devices; "
                         f"the cluster has {total} ({count} processes). Use all of them.")
    names = list(mesh.axis_names)
    rows = mesh.shape[names.index(batch_axis)] if batch_axis in names else 1
    if count > 1 and rows % count:
        raise ValueError(
            f"The mesh's {batch_axis!r} axis ({rows}) is not divisible by the {count} processes: "
            f"each process feeds its own share of the batch, so it must hold whole "
            f"{batch_axis!r} rows. Use e.g. --mesh {batch_axis}={count * max(rows // count, 1)},..."
            " (the other axes within a host).")
