"""Multi-process clusters on each backend's own engine: joining one
(JAX's coordinator, torchrun's rendezvous, TensorFlow's TF_CONFIG with a
watchdog), this process' index and the count, barriers, the chief's writes
and each process' shard of the data."""

import contextlib
import json
import os
import sys

import keras

from keras_reluvit import _keras_compat as compat

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
      `tf_strategy()` returns it, build and compile the model in its scope.
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
        raise RuntimeError(f"Clusters run on the JAX, TensorFlow and PyTorch backends; this is "
                           f"{backend}.")
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
            "--nproc_per_node N -m keras_reluvit_cli train ...`, or pass --coordinator, "
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
    # `timeout` bounds the joining (the store's rendezvous); the collectives keep
    # the backend's own timeout (gloo's 30 min, NCCL's 10): the chief writing a
    # large model's export while the others wait in a barrier takes longer than
    # a join should. The store's own, once joined, is torch's default.
    try:
        # process 0 hosts it, but under torchrun, whose agent does
        agent = not explicit and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
        store = dist.TCPStore(host, port, world, rank == 0 and not agent,
                              timeout=datetime.timedelta(seconds=timeout), multi_tenant=True)
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo", store=store,
                                world_size=world, rank=rank)
        store.set_timeout(dist.default_pg_timeout)
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


def tf_strategy():
    """The `tf.distribute.MultiWorkerMirroredStrategy` `initialize()` made on
    TensorFlow (None outside a cluster)."""
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


def torch_distributed():
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
        dist = torch_distributed()
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


def barrier(name):
    """Waits until every process of the cluster reaches `name`."""
    if process_count() == 1:
        return
    backend = keras.backend.backend()
    if backend == "jax":
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)
    elif backend == "torch":
        torch_distributed().barrier()
    else:  # one all-reduce over the workers
        s = _TF_STRATEGY
        s.reduce("SUM", s.run(lambda: keras.ops.ones(())), axis=None)


def any_process(flag):
    """True on every process when `flag` is True on any: a collective, every
    process calls it at the same point (`kr.backup.StepBackup` after each
    step, so that a signal to one process stops all at one step)."""
    if process_count() == 1:
        return bool(flag)
    backend = keras.backend.backend()
    if backend == "jax":
        import numpy as np
        from jax.experimental import multihost_utils

        return bool(np.max(multihost_utils.process_allgather(np.int32(bool(flag)))))
    if backend == "torch":
        import torch

        dist = torch_distributed()
        device = (torch.device("cuda", torch.cuda.current_device())
                  if dist.get_backend() == "nccl" else "cpu")
        value = torch.tensor([int(bool(flag))], device=device)
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
        return bool(value.item())
    s = _TF_STRATEGY
    total = s.reduce("SUM", s.run(lambda: keras.ops.cast(bool(flag), "float32")), axis=None)
    return bool(keras.ops.convert_to_numpy(total) > 0)


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
            swapped.append((v, compat.variable_value(v)))
            compat.set_variable_value(v, jax.numpy.asarray(full))
    before = keras.distribution.distribution()
    keras.distribution.set_distribution(None)
    try:
        yield process_index() == 0
    finally:
        keras.distribution.set_distribution(before)
        for v, value in swapped:
            compat.set_variable_value(v, value)
        barrier("chief_writes")



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

