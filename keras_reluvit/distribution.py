"""Scale out with `keras.distribution`: data, FSDP and tensor-parallel
layouts for every ViT.

```python
mesh = keras.distribution.DeviceMesh((2, 4), ["batch", "model"],
                                     keras.distribution.list_devices())
keras.distribution.set_distribution(kr.distribution.model_parallel(mesh, strategy="fsdp"))
model = kr.ViT_L16(attention="relu")        # variables are created sharded
model.fit(...)                              # batches are split over "batch"
```

Strategies (regex rules `fullmatch`ed against `variable.path`):

- `"data"`: every weight replicated, the batch split over the batch axis.
- `"fsdp"`: big_vision's fsdp tactic for ViTs: every kernel (and the learned
  position embedding) is sharded over the *batch* axis along its largest
  dimension for ViT shapes (the width D, or the MLP width for `fc1`/`fc2`);
  biases, norms and tokens are small and replicated.
- `"tensor"`: Megatron-style over the *model* axis: q/k/v (and gate)
  kernels split over heads, `fc1` over the hidden units (column parallel),
  the attention output and `fc2` on their input side (row parallel), with
  the matching biases; the patch-stem kernel and the position embedding over
  the width, the head on its input side; norms, biases and tokens
  replicated.

A layout that does not divide a dimension is an error naming the variable,
the dimension and the mesh axis (not a silent replica or a late XLA error).

`keras.distribution` runs on the JAX backend only in Keras 3.15. On
TensorFlow use `tf.distribute.MirroredStrategy` (data parallel) around model
building and `compile` (see the README); on PyTorch use torch's own
`DistributedDataParallel`/`torchrun`. The functions here say so when called
on those backends.
"""

import contextlib

import keras

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
            "keras.distribution runs on the JAX backend only (Keras 3.15). On "
            "TensorFlow, build and compile the model inside "
            "`with tf.distribute.MirroredStrategy().scope():` for data "
            "parallelism (see the README, 'Multi-device and TPU'), or set "
            "KERAS_BACKEND=jax."
        )
    raise RuntimeError(
        f"keras.distribution does not support the {backend} backend (Keras "
        "3.15). On PyTorch use torch.nn.parallel.DistributedDataParallel with "
        "torchrun, or set KERAS_BACKEND=jax for data/FSDP/tensor parallelism."
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
    axes and sizes, the strategy and the sequence axis — or None when none is
    set. `train()` records it in `config.json`."""
    dist = dist or keras.distribution.distribution()
    if dist is None:
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


# --- multi-process (multi-host) clusters -------------------------------------


def initialize(coordinator=None, num_processes=None, process_id=None, timeout=120):
    """Joins a multi-process JAX cluster (one process per host, or several
    per machine), before anything else touches JAX.

    With `coordinator="HOST:PORT"`, `num_processes` and `process_id`, joins
    the cluster whose process 0 listens at HOST:PORT (every process passes
    the same address; CPU clusters talk over gloo). With no arguments it calls
    `keras.distribution.initialize()`, which reads the cluster from the
    environment (TPU pods; `KERAS_DISTRIBUTION_JOB_ADDRESSES`,
    `KERAS_DISTRIBUTION_NUM_PROCESSES`, `KERAS_DISTRIBUTION_PROCESS_ID`).
    Not joined within `timeout` seconds (a coordinator that is not there, a
    process that never starts), it raises naming the address.

    Example (two processes on one machine, 4 virtual CPU devices each):

    ```python
    kr.distribution.initialize("127.0.0.1:12345", num_processes=2, process_id=0)  # and 1
    mesh = kr.distribution.mesh_from_spec("batch=8")  # all processes' devices
    ```
    """
    _check_backend()
    given = [coordinator is not None, num_processes is not None, process_id is not None]
    if not any(given):
        keras.distribution.initialize()
        return
    if not all(given):
        raise ValueError("A cluster needs all of coordinator (HOST:PORT), num_processes and "
                         "process_id, or none of them (TPU pods / environment variables).")
    host, _, port = str(coordinator).rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"coordinator must be HOST:PORT, e.g. 10.0.0.1:12345; got {coordinator!r}.")
    num_processes, process_id = int(num_processes), int(process_id)
    if num_processes < 1:
        raise ValueError(f"num_processes must be >= 1; got {num_processes}.")
    if not 0 <= process_id < num_processes:
        raise ValueError(f"process_id {process_id} is out of range for {num_processes} "
                         f"processes (0 ... {num_processes - 1}).")
    if process_id > 0:  # JAX aborts the process when it cannot connect: look first
        _wait_for(host, int(port), timeout, f"Process {process_id} of {num_processes}")
    import jax

    try:
        jax.distributed.initialize(coordinator_address=coordinator, num_processes=num_processes,
                                   process_id=process_id, initialization_timeout=int(timeout))
    except Exception as e:  # jax raises XlaRuntimeError/RuntimeError variants
        raise RuntimeError(
            f"Process {process_id} of {num_processes} could not join the cluster at "
            f"{coordinator} within {timeout} s: is process 0 running there, reachable and "
            f"started with the same --num-processes? ({type(e).__name__}: "
            f"{str(e).splitlines()[0] if str(e) else ''})") from e


def _wait_for(host, port, timeout, who):
    """Waits until HOST:PORT accepts TCP connections, at most `timeout` s."""
    import socket
    import time

    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host, port), timeout=2):
                return
        except OSError as e:
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{who} could not join the cluster at {host}:{port} within {timeout} s: "
                    f"nothing accepts connections there ({e}). Start process 0 with the same "
                    "--coordinator on that host, or check the address and firewall.") from None
            time.sleep(0.5)


def process_index():
    """This process' index in the cluster (0 without one)."""
    if keras.backend.backend() != "jax":
        return 0
    import jax

    return jax.process_index()


def process_count():
    """The number of processes in the cluster (1 without one)."""
    if keras.backend.backend() != "jax":
        return 1
    import jax

    return jax.process_count()


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


def barrier(name):
    """Waits until every process of the cluster reaches `name`."""
    if process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


@contextlib.contextmanager
def chief_writes(model):
    """`with chief_writes(model) as chief: if chief: model.save(...)`.

    Every process enters (in a cluster it is a collective): variables sharded
    over other hosts' devices (FSDP, tensor parallel) are gathered into
    host-local copies and the distribution is unset, so that `model.save`,
    `save_weights` and exports run on one process without cross-host
    transfers. `chief` is True on process 0. Outside a cluster it only
    yields True.
    """
    if process_count() == 1:
        yield True
        return
    import jax
    from jax.experimental import multihost_utils

    swapped = []
    variables = list(model.variables)
    if getattr(model, "optimizer", None) is not None:
        variables += list(model.optimizer.variables)
    for v in variables:
        value = v.value
        if isinstance(value, jax.Array) and not value.is_fully_addressable:
            full = multihost_utils.process_allgather(value, tiled=True)
            swapped.append((v, v._value))
            v._value = jax.numpy.asarray(full)
    before = keras.distribution.distribution()
    keras.distribution.set_distribution(None)
    try:
        yield process_index() == 0
    finally:
        keras.distribution.set_distribution(before)
        for v, value in swapped:
            v._value = value
        barrier("chief_writes")
