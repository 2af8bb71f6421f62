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

`keras.distribution` runs on the JAX backend only in Keras 3.15. The other
backends scale out data parallel on their own engines, also here:

- PyTorch: `initialize()` joins torchrun's cluster and `ddp(model)` trains
  through `DistributedDataParallel` in `model.fit`;
- TensorFlow: `initialize()` makes the `MultiWorkerMirroredStrategy` of
  `TF_CONFIG` and `multi_worker(model, train, val)` hands each worker's
  shard to it (one host: `tf.distribute.MirroredStrategy`).

`keras-reluvit train` does either when launched as such a cluster. The
layout functions (`model_parallel`, `data_parallel`) say so when called on
those backends.
"""

import contextlib
import json
import os
import sys

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
        "`torchrun --nproc_per_node N -m keras_reluvit.cli train ...` "
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
        torch_group = _torch_distributed()
        if torch_group is not None:
            return {"type": "DistributedDataParallel", "processes": process_count(),
                    "process_group": torch_group.get_backend()}
        if _TF_STRATEGY is not None:
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


# --- multi-process (multi-host) clusters -------------------------------------

_TF_STRATEGY = None  # the MultiWorkerMirroredStrategy `initialize` made (TensorFlow)


def initialize(coordinator=None, num_processes=None, process_id=None, timeout=120):
    """Joins a multi-process cluster (one process per host or per GPU), on
    the backend's own engine, before the backend runs anything else.

    - **JAX**: with `coordinator="HOST:PORT"`, `num_processes` and
      `process_id`, joins the cluster whose process 0 listens at HOST:PORT
      (every process passes the same address; CPU clusters talk over
      gloo). With no arguments it calls `keras.distribution.initialize()`,
      which reads the cluster from the environment (TPU pods;
      `KERAS_DISTRIBUTION_JOB_ADDRESSES`, `..._NUM_PROCESSES`,
      `..._PROCESS_ID`).
    - **PyTorch**: `torch.distributed.init_process_group` (NCCL on GPUs,
      each process on its `LOCAL_RANK`'s GPU; gloo on CPUs). With no
      arguments the cluster is `torchrun`'s (`RANK`, `WORLD_SIZE`,
      `MASTER_ADDR`, `MASTER_PORT`); the three arguments start one without
      torchrun (process 0 hosts the rendezvous at HOST:PORT). Then
      `ddp(model)` trains data parallel with `DistributedDataParallel`.
    - **TensorFlow**: a `tf.distribute.MultiWorkerMirroredStrategy` for the
      cluster in `TF_CONFIG` (no arguments; each worker's own task index);
      `strategy()` returns it, build and compile the model in its scope.
      TensorFlow blocks until every worker is up, uninterruptibly: a worker
      that is not reachable within `timeout` seconds ends the process with
      status 2 (from a watchdog process; SIGKILL where libc's `_exit` cannot
      be installed as a signal handler) and a message naming it.

    Not joined within `timeout` seconds (a coordinator that is not there, a
    process that never starts), it raises naming the address.

    Example (two processes on one machine, JAX with 4 virtual CPU devices each):

    ```python
    kr.distribution.initialize("127.0.0.1:12345", num_processes=2, process_id=0)  # and 1
    mesh = kr.distribution.mesh_from_spec("batch=8")  # all processes' devices
    ```
    """
    backend = keras.backend.backend()
    given = [coordinator is not None, num_processes is not None, process_id is not None]
    if backend == "tensorflow":
        if any(given):
            raise ValueError("On TensorFlow the cluster is TF_CONFIG's (MultiWorkerMirrored"
                             "Strategy): set TF_CONFIG on every worker and pass no "
                             "coordinator / num_processes / process_id.")
        return _initialize_tensorflow(timeout)
    if backend not in ("jax", "torch"):
        _check_backend()
    if any(given) and not all(given):
        raise ValueError("A cluster needs all of coordinator (HOST:PORT), num_processes and "
                         "process_id, or none of them (TPU pods / torchrun / environment "
                         "variables).")
    if all(given):
        host, port, num_processes, process_id = _cluster_arguments(
            coordinator, num_processes, process_id)
    if backend == "torch":
        if not any(given):
            host, port, num_processes, process_id = _torchrun_environment()
        return _initialize_torch(host, port, num_processes, process_id, timeout, any(given))
    if not any(given):
        keras.distribution.initialize()
        return
    if process_id > 0:  # JAX aborts the process when it cannot connect: look first
        _wait_for(host, port, timeout, f"Process {process_id} of {num_processes}")
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


def _cluster_arguments(coordinator, num_processes, process_id):
    host, _, port = str(coordinator).rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"coordinator must be HOST:PORT, e.g. 10.0.0.1:12345; got {coordinator!r}.")
    num_processes, process_id = int(num_processes), int(process_id)
    if num_processes < 1:
        raise ValueError(f"num_processes must be >= 1; got {num_processes}.")
    if not 0 <= process_id < num_processes:
        raise ValueError(f"process_id {process_id} is out of range for {num_processes} "
                         f"processes (0 ... {num_processes - 1}).")
    return host, int(port), num_processes, process_id


def _torchrun_environment():
    env = os.environ
    missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k not in env]
    if missing:
        raise ValueError(
            f"No torchrun cluster: {', '.join(missing)} not set. Launch with `torchrun "
            "--nproc_per_node N -m keras_reluvit.cli train ...`, or pass --coordinator, "
            "--num-processes and --process-id.")
    return env["MASTER_ADDR"], int(env["MASTER_PORT"]), int(env["WORLD_SIZE"]), int(env["RANK"])


def _initialize_torch(host, port, world, rank, timeout, explicit):
    import datetime

    import torch
    import torch.distributed as dist

    if dist.is_initialized():
        return
    who = f"Process {rank} of {world}"
    if rank > 0 and explicit:  # under torchrun its agent hosts the rendezvous
        _wait_for(host, port, timeout, who)
    if torch.cuda.is_available():
        local = int(os.environ.get("LOCAL_RANK", rank % torch.cuda.device_count()))
        torch.cuda.set_device(local)
    try:
        dist.init_process_group(
            "nccl" if torch.cuda.is_available() else "gloo",
            init_method="env://" if not explicit else f"tcp://{host}:{port}",
            world_size=world, rank=rank, timeout=datetime.timedelta(seconds=timeout))
    except Exception as e:  # DistStoreError, RuntimeError
        raise RuntimeError(
            f"{who} could not form the torch.distributed cluster at {host}:{port} within "
            f"{timeout} s: are all {world} processes started with the same address and size? "
            f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from e


def _initialize_tensorflow(timeout):
    global _TF_STRATEGY
    if _TF_STRATEGY is not None:
        return _TF_STRATEGY
    raw = os.environ.get("TF_CONFIG")
    if not raw:
        raise ValueError("No TensorFlow cluster: TF_CONFIG is not set. Set it on every worker, "
                         'e.g. {"cluster": {"worker": ["host0:port", "host1:port"]}, '
                         '"task": {"type": "worker", "index": 0}}.')
    try:
        config = json.loads(raw)
        workers = list(config["cluster"]["worker"])
        task = config["task"]
        index = int(task["index"])
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"TF_CONFIG must be JSON with cluster.worker (a list of HOST:PORT) and "
                         f"task.index; got {raw!r} ({e}).") from None
    if task.get("type", "worker") != "worker" or not 0 <= index < len(workers):
        raise ValueError(f"TF_CONFIG's task {task} is not one of the {len(workers)} workers "
                         "(MultiWorkerMirroredStrategy: task type 'worker', index 0 ... N-1).")
    import subprocess

    import tensorflow as tf

    # The strategy's constructor waits for every worker while holding the GIL:
    # a watchdog process ends this one if a worker stays unreachable -- with
    # exit status 2 (the CLI's error status) where a C-level handler can be
    # set, not SIGKILL's 137, which schedulers read as out of memory.
    peers = [f"{i}={w}" for i, w in enumerate(workers) if i != index]
    restore = _exit_on_sigint()
    watchdog = subprocess.Popen([sys.executable, "-c", _WATCHDOG, str(os.getpid()),
                                 str(timeout), f"Worker {index} of {len(workers)}",
                                 "INT" if restore else "KILL"] + peers)
    try:
        _TF_STRATEGY = tf.distribute.MultiWorkerMirroredStrategy()
    finally:
        watchdog.kill()
        watchdog.wait()
        if restore:
            restore()
    return _TF_STRATEGY


def _exit_on_sigint():
    """Makes SIGINT end the process at once with status 2 (C's `_exit`
    installed as the handler: it receives the signal number, 2), which works
    while a C++ call holds the GIL and no Python handler can run. Returns
    the function that puts the previous handler back, or None where libc
    cannot be reached (the watchdog then uses SIGKILL)."""
    import ctypes
    import signal

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.signal.restype = ctypes.c_void_p
        libc.signal.argtypes = [ctypes.c_int, ctypes.c_void_p]
        exit_now = ctypes.cast(libc._exit, ctypes.c_void_p)
    except (OSError, AttributeError):
        return None
    assert int(signal.SIGINT) == 2  # the status _exit receives
    previous = libc.signal(int(signal.SIGINT), exit_now)
    return lambda: libc.signal(int(signal.SIGINT), previous)


_WATCHDOG = r"""
import os, signal, socket, sys, time
pid, timeout, who, how = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3], sys.argv[4]
peers = sys.argv[5:]
deadline = time.monotonic() + timeout
while peers:
    for peer in list(peers):
        index, address = peer.split("=", 1)
        host, _, port = address.rpartition(":")
        try:
            socket.create_connection((host, int(port)), timeout=2).close()
            peers.remove(peer)
        except OSError as e:
            if time.monotonic() > deadline:
                sys.stderr.write(
                    f"keras-reluvit: error: {who} could not join the cluster at {address} "
                    f"within {timeout:g} s: nothing accepts connections there ({e}). Start "
                    f"worker {index} (TF_CONFIG task.index) there, or check the address and "
                    "firewall. TensorFlow cannot stop waiting: ending this worker.\n")
                sys.stderr.flush()
                os.kill(pid, signal.SIGINT if how == "INT" else signal.SIGKILL)
                sys.exit(1)
    time.sleep(0.5)
"""


def strategy():
    """The `tf.distribute` strategy `initialize()` made on TensorFlow (None
    outside a cluster)."""
    return _TF_STRATEGY


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
                    f"nothing accepts connections there ({e}). Start process 0 with the "
                    "same --coordinator on that host, or check the address and firewall."
                    ) from None
            time.sleep(0.5)


def _torch_distributed():
    if keras.backend.backend() != "torch":
        return None
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() else None


def _cluster_shape():
    """(this process' index, the number of processes) on the backend's
    engine: JAX's processes, torch.distributed's ranks or the TensorFlow
    cluster's workers; (0, 1) without a cluster."""
    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        return jax.process_index(), jax.process_count()
    if backend == "torch":
        dist = _torch_distributed()
        return (dist.get_rank(), dist.get_world_size()) if dist else (0, 1)
    if _TF_STRATEGY is not None:
        resolver = _TF_STRATEGY.cluster_resolver
        return int(resolver.task_id), int(resolver.cluster_spec().num_tasks("worker"))
    return 0, 1


def process_index():
    """This process' index in the cluster (0 without one): JAX's process
    index, torch.distributed's rank, or the TensorFlow worker's task index."""
    return _cluster_shape()[0]


def process_count():
    """The number of processes in the cluster (1 without one)."""
    return _cluster_shape()[1]


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
    if process_count() == 1:
        return
    backend = keras.backend.backend()
    if backend == "jax":
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)
    elif backend == "torch":
        _torch_distributed().barrier()
    else:  # one all-reduce over the workers
        s = _TF_STRATEGY
        s.reduce("SUM", s.run(lambda: keras.ops.ones(())), axis=None)


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
    if keras.backend.backend() != "jax":  # DDP / MultiWorkerMirrored: local full copies
        try:
            yield process_index() == 0
        finally:
            barrier("chief_writes")
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


# --- PyTorch: DistributedDataParallel -----------------------------------------


def ddp(model, dataset=None, **ddp_options):
    """Trains `model` data parallel with PyTorch's `DistributedDataParallel`
    through `model.fit` (the Keras guide "Multi-GPU distributed training with
    PyTorch", without a loop of your own). Run under `torchrun` after
    `kr.distribution.initialize()`.

    The model's training step calls the DDP module, so each backward pass
    all-reduces the gradients (averaged over the processes, bucketed and
    overlapped with the backward pass, by DDP's reducer) before the Keras
    optimizer applies them; the weights start equal (DDP broadcasts process
    0's). Metric states (the loss tracker's and `compile`'s metrics) are
    summed over the processes whenever they are read, as tf.distribute
    does, so the logged loss and accuracy are the global batch's.

    With `dataset`, also returns this process' shard of it: a
    `tf.data.Dataset` (`shard`, every process the same number of
    elements), a tuple / list of arrays (rows `rank::world`, cut to equal
    lengths) or a `torch.utils.data.Dataset` (a `Subset`). Shard the
    *training* data (for a batched data set: global batch = processes x its
    batch size); give every process the whole validation set, or shards with
    equal numbers of batches (each evaluation step reads the metrics, a
    collective).

    Args:
        model: a built Keras model on the torch backend (variables created:
            call it on a batch first), compiled before or after.
        dataset: optional training data to shard.
        **ddp_options: passed to `DistributedDataParallel`
            (e.g. `find_unused_parameters=True`).

    Returns:
        `model` (the same object, now training through DDP), or
        `(model, shard)` with `dataset`.

    Example (`torchrun --nproc_per_node 2 train.py`):

    ```python
    kr.distribution.initialize()                 # torchrun's cluster
    rank, world = kr.distribution.process_index(), kr.distribution.process_count()
    train, val, info = kr.data.load("sklearn_digits", 128, image_size=32,
                                    process_index=rank, process_count=world)
    model = kr.ViT(variant="Ti/16", image_size=32, num_classes=info.num_classes)
    model(np.zeros((1, 32, 32, 3), "float32"))   # build
    model = kr.distribution.ddp(model)
    model.compile("adamw", keras.losses.CategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    model.fit(train, validation_data=val, epochs=5, verbose=rank == 0)
    ```
    """
    if keras.backend.backend() != "torch":
        raise RuntimeError(f"ddp() wraps a model in torch's DistributedDataParallel: it needs "
                           f"KERAS_BACKEND=torch (this is {keras.backend.backend()}).")
    dist = _torch_distributed()
    if dist is None:
        raise RuntimeError("torch.distributed is not initialized: call "
                           "kr.distribution.initialize() first (under torchrun).")
    if not model.built or not model.variables:
        raise ValueError("Build the model before ddp() (call it on a batch, or model.build): "
                         "DDP registers the variables it finds at wrapping time.")
    import torch

    device_ids = [torch.cuda.current_device()] if torch.cuda.is_available() else None
    module = torch.nn.parallel.DistributedDataParallel(model, device_ids=device_ids,
                                                       **ddp_options)
    _route_through(model, module)
    if dataset is None:
        return model
    return model, shard(dataset)


def _route_through(model, module):
    """The model's train step with the forward pass through the DDP
    `module` (its reducer then all-reduces the gradients in the backward
    pass), and metrics summed over the processes when read. The step is
    Keras 3's torch `train_step` with `self(x)` replaced by `module(x)`."""
    import types

    import torch
    import torch.distributed as dist
    from keras.src import tree
    from keras.src.trainers.data_adapters import data_adapter_utils

    def train_step(self, data):
        x, y, sample_weight = data_adapter_utils.unpack_x_y_sample_weight(data)
        y_pred = module(x, training=True) if self._call_has_training_arg else module(x)
        self.zero_grad()
        loss = self._compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight,
                                  training=True)
        batch = next(i for i in tree.flatten(x) if i is not None).shape[0]
        self._loss_tracker.update_state(loss, sample_weight=batch)
        if self.optimizer is not None:
            loss = self.optimizer.scale_loss(loss)
        if self.trainable_weights:
            loss.backward()  # DDP's hooks average the gradients over the processes
            weights = self.trainable_weights[:]
            with torch.no_grad():
                self.optimizer.apply([v.value.grad for v in weights], weights)
        return self.compute_metrics(x, y, y_pred, sample_weight=sample_weight)

    def get_metrics_result(self):
        variables = list(self.metrics_variables)
        local = [v.value.detach().clone() for v in variables]
        if local:
            flat = torch.cat([t.reshape(-1).to(torch.float64) for t in local])
            dist.all_reduce(flat)  # SUM: totals and counts of every process
            for v, t, part in zip(variables, local, flat.split([t.numel() for t in local])):
                v.assign(part.reshape(t.shape).to(t.dtype))
        try:
            return type(self).get_metrics_result(self)
        finally:
            for v, t in zip(variables, local):
                v.assign(t)

    model.train_step = types.MethodType(train_step, model)
    model.get_metrics_result = types.MethodType(get_metrics_result, model)
    model.train_function = None  # a compiled model rebuilds its step


def shard(dataset, index=None, count=None):
    """This process' shard of `dataset` (see `ddp`): every process gets the
    same number of elements (the remainder is dropped), so that they run the
    same number of steps."""
    index = process_index() if index is None else int(index)
    count = process_count() if count is None else int(count)
    if count == 1:
        return dataset
    import numpy as np

    try:
        import tensorflow as tf
    except ImportError:  # pragma: no cover - tensorflow is a dependency of training
        tf = None
    if tf is not None and isinstance(dataset, tf.data.Dataset):
        n = int(dataset.cardinality())
        ds = dataset.shard(count, index)
        return ds.take(n // count) if n >= 0 else ds
    if isinstance(dataset, (tuple, list)):
        n = min(len(a) for a in dataset) // count * count
        return type(dataset)(np.asarray(a)[index:n:count] for a in dataset)
    if keras.backend.backend() == "torch":
        import torch

        if isinstance(dataset, torch.utils.data.Dataset):
            n = len(dataset) // count * count
            return torch.utils.data.Subset(dataset, range(index, n, count))
    raise TypeError(f"Cannot shard a {type(dataset).__name__}: pass a tf.data.Dataset, a tuple "
                    "of arrays or a torch Dataset, or shard it yourself (kr.data.load's "
                    "process_index / process_count).")


# --- TensorFlow: MultiWorkerMirroredStrategy ----------------------------------


def multi_worker(model, train, val=None):
    """Distributes this worker's data for `model.fit` under the
    `MultiWorkerMirroredStrategy` of `initialize()` (TF_CONFIG).

    Each worker reads its own shard of the training data (`kr.data.load(...,
    process_index=i, process_count=n)`: batches of `batch_size / n`), handed
    to the strategy as is with `distribute_datasets_from_function` (no
    re-batching, no auto-sharding); the gradients are all-reduced across
    the workers by the strategy, and the metrics are the global batch's.
    `val` is read by every worker as given (the whole validation set: the
    metrics are then those of one process). On CPUs the steps run without
    XLA (`jit_compile=False`: XLA has no CPU collectives).

    Build and compile the model inside `kr.distribution.strategy().scope()`
    first. This also works around three failures of Keras 3.15's `fit` under
    this strategy: it reduces a nested `(x, y)` batch with `strategy.reduce`
    to build the model (the state is built here from the data's element
    spec instead); it averages the scalar logs over the workers along an
    axis they do not have ("Invalid reduction dimension 0",
    tensorflow/tensorflow#72388; averaged here with `axis=None`); and its
    optimizer clips each worker's *local* gradients (`global_clipnorm`,
    `clipnorm`, `clipvalue`) before summing them, which is not the clipping
    of the global gradient (here the optimizer clips after the all-reduce).

    Returns:
        `(train, val)`: the distributed data sets for `model.fit`.

    Example (every worker with its TF_CONFIG):

    ```python
    strategy = kr.distribution.initialize()       # MultiWorkerMirroredStrategy
    i, n = kr.distribution.process_index(), kr.distribution.process_count()
    train, val, info = kr.data.load("sklearn_digits", 128, image_size=32,
                                    process_index=i, process_count=n)
    with strategy.scope():
        model = kr.ViT(variant="Ti/16", image_size=32, num_classes=info.num_classes)
        model.compile("adamw", keras.losses.CategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    dtrain, dval = kr.distribution.multi_worker(model, train.repeat(), val)
    model.fit(dtrain, steps_per_epoch=len(train), validation_data=dval, epochs=5)
    ```
    """
    s = _TF_STRATEGY
    if s is None:
        raise RuntimeError("No TensorFlow cluster: call kr.distribution.initialize() with "
                           "TF_CONFIG set (KERAS_BACKEND=tensorflow) first.")
    if getattr(model, "_distribute_strategy", None) is not s:
        raise ValueError("Create (and compile) the model inside "
                         "`kr.distribution.strategy().scope()`: its variables must be the "
                         "strategy's.")
    import tensorflow as tf

    if model.jit_compile and not tf.config.list_logical_devices("GPU"):
        model.jit_compile = False  # XLA has no CPU collectives (TensorFlow 2.21)
    with s.scope():
        model._symbolic_build(data_batch=train.element_spec)
    model._maybe_symbolic_build = lambda *args, **kwargs: None
    _patch_keras_multi_worker_logs()
    clip_after_all_reduce(model)  # a kr.ViT does it before training; other models need it

    def distribute(ds):
        return s.distribute_datasets_from_function(lambda _: ds)

    return distribute(train), (None if val is None else distribute(val))


def _patch_keras_multi_worker_logs():
    """Keras 3.15's TensorFlow trainer averages each step's logs over a
    multi-worker strategy's replicas with `strategy.reduce("MEAN", v,
    axis=0)`, which fails for the scalar loss and metrics
    (tensorflow/tensorflow#72388): average them with `axis=None` (over the
    replicas, as Keras means to), leaving every other case to Keras."""
    from keras.src.backend.tensorflow import trainer as tf_trainer

    original = tf_trainer.reduce_per_replica
    if getattr(original, "_keras_reluvit", False):
        return
    from keras.src import tree

    def reduce_per_replica(values, strategy, reduction):
        if (reduction in ("auto", "mean")
                and tf_trainer._collective_all_reduce_multi_worker(strategy)):
            return tree.map_structure(
                lambda v: strategy.reduce("MEAN", v, axis=None), values)
        return original(values, strategy, reduction)

    reduce_per_replica._keras_reluvit = True
    tf_trainer.reduce_per_replica = reduce_per_replica


CLIPPING = ("clipnorm", "global_clipnorm", "clipvalue")


def clip_after_all_reduce(model):
    """Makes `model`'s optimizer clip the all-reduced gradient when the
    model was built and compiled under a TensorFlow `tf.distribute`
    strategy of several replicas (one host's `MirroredStrategy` or a
    cluster's `MultiWorkerMirroredStrategy`): Keras 3.15 clips each
    replica's own gradient (`global_clipnorm`, `clipnorm`, `clipvalue`)
    before summing them, not the gradient one device would clip. A `kr.ViT`
    calls it before training (`make_train_function`); call it after
    compiling another model. Does nothing on other backends, without a
    strategy or clipping, or twice."""
    if keras.backend.backend() != "tensorflow" or getattr(model, "optimizer", None) is None:
        return
    strategy = getattr(model, "_distribute_strategy", None)
    if strategy is None or strategy.num_replicas_in_sync <= 1:
        return
    optimizer = model.optimizer
    # a LossScaleOptimizer applies its inner optimizer, which clips and reduces
    _clip_after_all_reduce(getattr(optimizer, "inner_optimizer", optimizer))


def _clip_after_all_reduce(optimizer):
    """Keras 3.15's TensorFlow optimizer clips the gradients in each replica,
    then all-reduces them: under a multi-worker strategy the global-norm
    clip then sees each worker's half-batch gradient, not the global one
    (a different update whenever the clip is active). Move the clipping
    after the all-reduce, where it sees what one process would."""
    clipping = {name: getattr(optimizer, name, None) for name in CLIPPING}
    if not any(clipping.values()):  # no clipping, or moved already (all unset then)
        return
    for name in CLIPPING:
        setattr(optimizer, name, None)
    reduce = optimizer._all_reduce_sum_gradients

    def reduce_then_clip(grads_and_vars):
        grads_and_vars = list(reduce(grads_and_vars))
        for name, value in clipping.items():
            setattr(optimizer, name, value)
        try:
            grads = optimizer._clip_gradients([g for g, _ in grads_and_vars])
        finally:
            for name in CLIPPING:
                setattr(optimizer, name, None)
        return list(zip(grads, [v for _, v in grads_and_vars]))

    optimizer._all_reduce_sum_gradients = reduce_then_clip
