"""Every computation path of pointwise attention, and the one dispatch point.

All paths compute `o_i = r_i * sum_j m_ij h(q_i . k_j / sqrt(d)) v_j` with the
row factor `r_i = exp(s_h) * L_i^-alpha` applied to the *output* rows (T x Dv)
rather than to the T x S weights: the only T x S work left is the score
matmul, the activation (and mask) and the value matmul.

| path | module | where |
|---|---|---|
| `generic`, `chunked` | `kernels.keras_ops` | every backend (`keras.ops`; the reference) |
| `torch_tiled`, `torch_fused` | `kernels.torch_cpu` (+ `csrc/`) | PyTorch on CPU |
| `pallas` | `kernels.pallas` | JAX: TPU (Mosaic), CUDA (Pallas' Triton backend) |
| `triton` | `kernels.triton` | PyTorch CUDA tensors |
| `sequence_parallel`, `pallas_sharded` | `kernels.sharded` | JAX under a multi-device `keras.distribution` |

This module holds the kernel switch (`set_kernel`, `use_kernel`,
`KERAS_RELUVIT_KERNEL`) and the dispatch rule (`fused_kernel`, `choose`);
each path's own module says how it works. Dependencies run one way: the
attention layer (`keras_reluvit.attention`) calls in here, nothing here
imports the layer.
"""

import contextlib
import os
import sys
import warnings

from keras_reluvit.kernels.keras_ops import apply_factor  # noqa: F401 -- the paths, by name
from keras_reluvit.kernels.keras_ops import chunked  # noqa: F401
from keras_reluvit.kernels.keras_ops import generic  # noqa: F401
from keras_reluvit.kernels.keras_ops import row_factor  # noqa: F401
from keras_reluvit.kernels.keras_ops import scores_and_weights  # noqa: F401
from keras_reluvit.kernels.sharded import pallas_sharded  # noqa: F401
from keras_reluvit.kernels.sharded import sequence_parallel  # noqa: F401
from keras_reluvit.kernels.sharded import sequence_parallel_context  # noqa: F401
from keras_reluvit.kernels.torch_cpu import torch_tiled  # noqa: F401

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
    """`keras_reluvit.kernels.triton`; raises ImportError / RuntimeError
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
        from keras_reluvit.kernels import triton
    except ImportError as error:
        raise ImportError("The Triton kernel needs triton: pip install "
                          "'keras-reluvit[cuda]'.") from error
    return triton


_WARNED = set()


def _warn_once(message):
    if message not in _WARNED:
        _WARNED.add(message)
        warnings.warn(message, stacklevel=3)


def _pallas_if(activation_name):
    from keras_reluvit.kernels import pallas

    return "pallas" if activation_name in pallas.ACTIVATIONS else None


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
    (the C++ kernel of `kernels.torch_cpu`; under autograd with its
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
