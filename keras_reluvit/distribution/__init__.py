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

- PyTorch: `initialize()` joins torchrun's cluster and `ddp(model)` returns
  a `DataParallelModel` whose `fit` trains through `DistributedDataParallel`;
- TensorFlow: `initialize()` makes the `MultiWorkerMirroredStrategy` of
  `TF_CONFIG`, `DataParallelModel(model)` trains under it (or one host's
  `tf.distribute.MirroredStrategy`) with the clip after the all-reduce, and
  `multi_worker(parallel, train, val)` hands each worker's shard to it.

`keras-reluvit train` does either when launched as such a cluster. The
layout functions (`model_parallel`, `data_parallel`) say so when called on
those backends.

Modules: `engine` (`Engine`: the backend branches of a training run in one
object), `layouts` (the JAX mesh layouts of every strategy), `cluster`
(joining a multi-process cluster on each backend, process index / count,
barriers, the chief's writes, data shards), `parallel_model`
(`DataParallelModel`: a model's `fit` on DDP or a TensorFlow strategy, by
Keras' public hooks), `torch_ddp` (`ddp`) and `tf_multi_worker` (the data
for TensorFlow's MultiWorkerMirroredStrategy).
"""

from keras_reluvit.distribution.cluster import any_process
from keras_reluvit.distribution.cluster import barrier
from keras_reluvit.distribution.cluster import chief_writes
from keras_reluvit.distribution.cluster import initialize
from keras_reluvit.distribution.cluster import process_count
from keras_reluvit.distribution.cluster import process_index
from keras_reluvit.distribution.cluster import shard
from keras_reluvit.distribution.cluster import tf_strategy
from keras_reluvit.distribution.engine import Engine
from keras_reluvit.distribution.layouts import RULES
from keras_reluvit.distribution.layouts import STRATEGIES
from keras_reluvit.distribution.layouts import ViTModelParallel
from keras_reluvit.distribution.layouts import check_mesh
from keras_reluvit.distribution.layouts import data_parallel
from keras_reluvit.distribution.layouts import describe
from keras_reluvit.distribution.layouts import layout_map
from keras_reluvit.distribution.layouts import mesh_from_spec
from keras_reluvit.distribution.layouts import model_parallel
from keras_reluvit.distribution.parallel_model import DataParallelModel
from keras_reluvit.distribution.tf_multi_worker import multi_worker
from keras_reluvit.distribution.torch_ddp import ddp

__all__ = ["DataParallelModel", "Engine", "RULES", "STRATEGIES", "ViTModelParallel",
           "any_process", "barrier", "check_mesh", "chief_writes", "data_parallel", "ddp",
           "describe", "initialize", "layout_map", "mesh_from_spec", "model_parallel",
           "multi_worker", "process_count", "process_index", "shard",
           "tf_strategy"]
