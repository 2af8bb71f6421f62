"""The training engine of the Keras backend in use: the one place a training
run asks what differs between JAX, TensorFlow and PyTorch.

- JAX: `keras.distribution` -- a mesh and layouts (`layouts.py`) over every
  process' devices; the data are fed per host.
- PyTorch: `DistributedDataParallel` (`torch_ddp.py`) under torchrun.
- TensorFlow: `MultiWorkerMirroredStrategy` (`tf_multi_worker.py`) from
  TF_CONFIG.

`Engine()` answers for the current backend: `check` (what the command line
asked that the engine cannot do), `join` (the cluster), `layout` (JAX's
mesh), `scope` (where variables are created), `wrap` (the model
`fit` trains: a `DataParallelModel` in a torch or TensorFlow cluster) and
`distribute` (the data as `fit` takes them).
"""

import contextlib
import os

import keras

from keras_reluvit.distribution import cluster
from keras_reluvit.distribution import layouts

ENGINES = {"jax": "keras.distribution", "torch": "DistributedDataParallel",
           "tensorflow": "MultiWorkerMirroredStrategy"}


class Engine:
    """The backend's training engine (see the module docstring)."""

    def __init__(self, backend=None):
        self.backend = backend or keras.backend.backend()

    @property
    def name(self):
        return ENGINES.get(self.backend, self.backend)

    # --- before the cluster --------------------------------------------------------
    def launched(self):
        """Whether a launcher started this process as one of a cluster:
        torchrun (`WORLD_SIZE > 1`) on torch, `TF_CONFIG` on TensorFlow."""
        if self.backend == "torch":
            return int(os.environ.get("WORLD_SIZE", "1")) > 1
        return self.backend == "tensorflow" and bool(os.environ.get("TF_CONFIG"))

    def check(self, mesh=None, sequence_axis=None, sharding=None, coordinator=None,
              accum_steps=None):
        """A ValueError naming what this engine cannot do of what was asked."""
        world = os.environ.get("WORLD_SIZE", "1")
        if self.backend != "torch" and world.isdigit() and int(world) > 1:
            # torchrun (or another launcher) started WORLD_SIZE processes; off the
            # torch backend each would train alone into the same --output.
            raise ValueError(
                f"WORLD_SIZE={world}: launched as one of {world} processes (torchrun?), but the "
                f"Keras backend is {self.backend}, which cannot join a torch.distributed "
                f"cluster: each process would train a separate model into the same --output. "
                f"Set KERAS_BACKEND=torch (KERAS_BACKEND=torch torchrun ... -m keras_reluvit_cli "
                f"train ...), or launch {self.backend} clusters as docs/distribution.md shows.")
        if self.backend == "jax":
            return
        if mesh or sequence_axis:
            raise ValueError(f"--mesh / --sequence-axis lay a model out with keras.distribution, "
                             f"which runs on JAX only; on {self.backend} a cluster trains data "
                             "parallel (leave them out, or set KERAS_BACKEND=jax).")
        if sharding not in (None, "data"):
            if self.backend == "torch" and sharding == "fsdp":
                why = ("PyTorch's FSDP2 (fully_shard) swaps each module's parameters for "
                       "sharded DTensors, but Keras' torch variables keep their own tensors (the "
                       "layers compute with those and the optimizer updates them), so the model "
                       "would not see the sharding")
            else:
                why = (f"{self.name} replicates every weight; sharded layouts are "
                       "keras.distribution's (JAX)")
            raise ValueError(f"--sharding {sharding} is not available on {self.backend}: {why}. "
                             "Use --sharding data (the default there), or KERAS_BACKEND=jax for "
                             "fsdp / tensor layouts.")
        if self.backend == "tensorflow" and coordinator:
            raise ValueError("On TensorFlow the cluster comes from TF_CONFIG (every worker's "
                             "HOST:PORT and this worker's index), not --coordinator.")
        if self.backend == "tensorflow" and self.launched() and (accum_steps or 1) > 1:
            raise ValueError(f"--accum-steps {accum_steps} in a TensorFlow cluster: Keras "
                             "3.15's gradient accumulation all-reduces inside a conditional, "
                             "which tf.distribute cannot run. Leave it out (a larger global "
                             "batch over the workers), or accumulate on JAX or PyTorch.")

    def join(self, coordinator=None, num_processes=None, process_id=None, distributed=False,
             timeout=120):
        """Joins the cluster when asked to (the three arguments, or
        `distributed`) or launched as one; True when in a cluster of several
        processes."""
        explicit = (coordinator, num_processes, process_id)
        if any(v is not None for v in explicit):
            cluster.initialize(*explicit, timeout=timeout)
        elif distributed or self.launched():
            cluster.initialize(timeout=timeout)
        else:
            return False
        return cluster.process_count() > 1

    # --- the model and the data ----------------------------------------------------------
    def layout(self, mesh=None, sharding=None, sequence_axis=None, in_cluster=False):
        """JAX: lays the model out over `mesh` ("batch=2,model=4"; without
        one, in a cluster or when `sharding` is asked for: every device on
        the batch axis) with `sharding`'s layouts; nothing to do on the other
        engines."""
        if self.backend != "jax" or not (mesh or sharding or in_cluster):
            return None
        spec = mesh or f"batch={len(keras.distribution.list_devices())}"
        dist = layouts.model_parallel(layouts.mesh_from_spec(spec), sharding or "fsdp",
                                      sequence_axis=sequence_axis)
        keras.distribution.set_distribution(dist)
        return dist

    def scope(self):
        """Where the model, its optimizer and its metrics are created: the
        TensorFlow cluster's strategy scope, else nothing."""
        strategy = cluster.tf_strategy() if self.backend == "tensorflow" else None
        return strategy.scope() if strategy is not None else contextlib.nullcontext()

    def wrap(self, model):
        """The model `fit` trains, for a built, compiled `model`: in a torch
        or TensorFlow cluster a `DataParallelModel` around it (DDP's
        all-reduce; the strategy's, with the clip after it), made in the
        strategy's scope; else `model` itself (JAX's mesh all-reduces
        already)."""
        if self.backend in ("torch", "tensorflow") and cluster.process_count() > 1:
            from keras_reluvit.distribution.parallel_model import DataParallelModel

            with self.scope():
                return DataParallelModel(model)
        return model

    def distribute(self, model, train, val=None):
        """The data as `fit` takes them (`model`: what `wrap`
        returned): on a TensorFlow cluster each worker's own shard handed to
        the strategy as is; elsewhere unchanged."""
        if self.backend == "tensorflow" and cluster.tf_strategy() is not None:
            from keras_reluvit.distribution.tf_multi_worker import multi_worker

            return multi_worker(model, train, val)
        return train, val
