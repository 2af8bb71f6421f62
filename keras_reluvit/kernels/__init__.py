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

Around the attention, `kernels.torch_fast` holds PyTorch's fused projections
(q/k/v in one GEMM, bias-fused MLP GEMMs), stepping aside for what it does
not compute (quantized or LoRA layers, dtype policies).

Under the `auto` switch a fused kernel is used only once measured on the
call's signature (`kernels.measured`: it ran, matched the path taken
without it and was faster); `report()` says what was chosen and why.

This module holds the kernel switch (`set_kernel`, `use_kernel`,
`KERAS_RELUVIT_KERNEL`), the dispatch rule (`fused_kernel`, `choose`) and
the table of paths (`PATHS`: each path's name, once, and what runs it);
`attend` is the one dispatch point, called by `attention.pointwise_attention`.
Each path's own module says how it works. Dependencies run one way: the
attention layer (`keras_reluvit.attention`) calls in here, nothing here
imports the layer.
"""

import sys
import warnings
from dataclasses import dataclass

import keras
from keras import ops

from keras_reluvit.kernels import measured
from keras_reluvit.kernels import torch_cpu
from keras_reluvit.kernels.keras_ops import apply_factor
from keras_reluvit.kernels.keras_ops import chunked
from keras_reluvit.kernels.keras_ops import generic
from keras_reluvit.kernels.keras_ops import is_symbolic
from keras_reluvit.kernels.keras_ops import row_factor
from keras_reluvit.kernels.measured import report
from keras_reluvit.kernels.sharded import pallas_sharded
from keras_reluvit.kernels.sharded import sequence_parallel
from keras_reluvit.kernels.sharded import sequence_parallel_context
from keras_reluvit.kernels.switches import KERNEL_ENV
from keras_reluvit.kernels.switches import KERNELS
from keras_reluvit.kernels.switches import configure
from keras_reluvit.kernels.switches import configured
from keras_reluvit.kernels.switches import get_kernel
from keras_reluvit.kernels.switches import pallas_deterministic
from keras_reluvit.kernels.switches import set_kernel
from keras_reluvit.kernels.switches import setting
from keras_reluvit.kernels.switches import use_kernel
from keras_reluvit.kernels.torch_cpu import torch_tiled

# The package's face: the switch, the dispatch, and the paths other modules call.
__all__ = ["KERNELS", "KERNEL_ENV", "PATHS", "apply_factor", "attend", "choose", "chunked",
           "configure", "configured", "fused_kernel", "generic", "get_kernel", "is_symbolic",
           "jax_accelerator", "pallas_deterministic", "pallas_sharded", "report", "row_factor",
           "sequence_parallel", "sequence_parallel_context", "set_kernel", "setting",
           "torch_recording", "torch_tiled", "triton_module", "use_kernel"]


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


def backward_variants(kernel):
    """The fused kernel's two backward passes, which `auto` times against
    each other when a call is differentiated (`kernels.measured`): "fused"
    (one kernel, dQ added atomically: 5 dots per tile) and "deterministic"
    (dK/dV, then dQ: 4 + 3 dots, no atomics). On CUDA only (a TPU has no
    atomics), and not when the framework asks for deterministic algorithms
    (`torch.use_deterministic_algorithms`, XLA's
    `--xla_gpu_deterministic_ops`): then the kernel's own choice. None: no
    variants. Why both: our Pallas backward's atomic adds carry GPU-scope
    fences (Pallas lowers `atomic_add` with acquire-release semantics), whose
    cost only a GPU can tell."""
    if kernel == "triton":
        import torch

        if torch.are_deterministic_algorithms_enabled():
            return None
    elif kernel != "pallas" or jax_accelerator() != "cuda" or pallas_deterministic():
        return None
    return {"fused": {"deterministic": False}, "deterministic": {"deterministic": True}}


# --- the paths: one table, each name once ------------------------------------------
@dataclass
class Call:
    """One pointwise-attention call as the paths receive it: `(B, T, H, D)`
    tensors, the activation's name (None for a callable) and function `h`,
    the broadcast `(B, T, S)` mask and the kernels' `kernel_mask` (a key
    mask stays `(B, 1, S)`), the row factor, and what the dispatch found
    (`options`: the fused kernel's, a variant `auto` measured)."""
    query: object
    key: object
    value: object
    name: object
    h: object
    mask: object
    kernel_mask: object
    factor: object
    dropout_fn: object
    want_weights: bool
    chunk_size: object
    recording: bool
    sp: object
    kernel: object
    backend: str
    options: object = None


def _generic(c):
    out, weights = generic(c.query, c.key, c.value, c.h, c.mask, c.factor, c.dropout_fn)
    if not c.want_weights:
        return out, None
    if isinstance(c.factor, float):
        weights = ops.multiply(weights, ops.cast(c.factor, weights.dtype))
    elif c.factor is not None:
        weights = ops.multiply(weights, ops.transpose(c.factor, (0, 2, 1, 3)))
    return out, weights


def _chunked(c):
    size = c.chunk_size if isinstance(c.chunk_size, int) else AUTO_CHUNK_SIZE
    return chunked(c.query, c.key, c.value, c.h, c.mask, c.factor, size), None


def _torch_tiled(c):
    if c.mask is not None or c.backend != "torch":
        raise ValueError("implementation='torch_tiled' needs PyTorch and takes no mask.")
    return torch_tiled(c.query, c.key, c.value, c.name, c.h, c.factor), None


def _torch_fused(c):
    if c.mask is not None or not torch_cpu.usable(c.query, c.name):
        raise ValueError(
            "implementation='torch_fused' needs PyTorch on CPU, float32, no mask, "
            f"an activation of {sorted(torch_cpu.ACTIVATIONS)} and the kernel "
            "built (see keras_reluvit.kernels.torch_cpu).")
    fn = torch_cpu.trainable_attention if c.recording else torch_cpu.attention
    if isinstance(c.factor, float) or c.factor is None:
        return fn(c.query, c.key, c.value, c.name, 1.0 if c.factor is None else c.factor), None
    return apply_factor(fn(c.query, c.key, c.value, c.name), c.factor), None


def _sequence_parallel(c):
    if c.sp is None or c.mask is not None:
        raise ValueError(
            "implementation='sequence_parallel' needs the JAX backend, a "
            "kr.distribution.model_parallel(..., sequence_axis=...) distribution "
            "and no mask.")
    return sequence_parallel(c.query, c.key, c.value, c.h, c.factor, *c.sp,
                             kernel_activation=c.name if c.kernel == "pallas" else None), None


def _pallas(c):
    if c.backend != "jax":
        raise ValueError("implementation='pallas' needs the JAX backend.")
    from keras_reluvit.kernels import pallas  # imports jax: only on this path

    if c.name not in pallas.ACTIVATIONS:
        raise ValueError(f"implementation='pallas' computes {sorted(pallas.ACTIVATIONS)}, "
                         f"not {c.name or 'a callable'!r}.")
    return pallas_sharded(c.query, c.key, c.value, c.name, c.factor, c.kernel_mask,
                          **(c.options or {})), None


def _triton(c):
    module = triton_module() if c.backend == "torch" else None
    if module is None or c.name not in module.ACTIVATIONS:
        raise ValueError("implementation='triton' needs the PyTorch backend and an "
                         "activation of the Triton kernel.")
    return module.attention(c.query, c.key, c.value, c.name, c.factor, c.kernel_mask,
                            **(c.options or {})), None


# name -> what computes it: the only place the names are written.
PATHS = {"generic": _generic, "chunked": _chunked, "torch_tiled": _torch_tiled,
         "torch_fused": _torch_fused, "sequence_parallel": _sequence_parallel,
         "pallas": _pallas, "triton": _triton}


def attend(query, key, value, activation_name, h, mask, kernel_mask, factor, dropout_fn=None,
           want_weights=False, chunk_size=None, implementation=None, per_head=False):
    """The dispatch point: picks a path of `PATHS` (`choose` under the kernel
    switch, or `implementation`) and runs it. Returns `(out, weights)`;
    weights only from the generic path when `want_weights`."""
    backend = keras.backend.backend()
    sp = sequence_parallel_context()
    recording = backend == "torch" and torch_recording(query, key, value)
    # Keras' symbolic pass: one generic einsum gives the shapes; the tile
    # loops would cost minutes for a large model for nothing.
    symbolic = backend == "torch" and is_symbolic(query)
    switch = get_kernel()
    kernel = None if symbolic else fused_kernel(switch, backend, query, activation_name, value)
    call = Call(query, key, value, activation_name, h, mask, kernel_mask, factor, dropout_fn,
                want_weights, chunk_size, recording, sp, kernel, backend)
    path = implementation
    if path is None and (symbolic or per_head):
        path = "generic"
    elif path is None:
        t, s = ops.shape(query)[1], ops.shape(key)[1]

        def rule(kernel):
            chosen = choose(backend, activation_name, mask, want_weights, dropout_fn is not None,
                            t, s, chunk_size, recording=recording,
                            sequence_parallel=sp is not None,
                            fused=backend == "torch" and mask is None and switch != "generic"
                            and torch_cpu.eligible(query, activation_name),
                            kernel=kernel, cpu_kernels=switch != "generic")
            if chosen == "torch_fused" and torch_cpu.load() is None:
                chosen = "torch_tiled"  # chosen, but not buildable here: the tiled path
            return chosen

        path = rule(kernel)
        # auto: a fused kernel only once it has run, matched and beaten the
        # path taken without it, on this call's signature (kernels.measured).
        if switch == "auto" and kernel is not None and path in (kernel, "sequence_parallel"):
            fallback = rule(None)
            options = measured.trusted(kernel, fallback, call, PATHS,
                                       backward_variants(kernel) if path == kernel else None)
            if options is None:
                call.kernel, path = None, fallback
            else:
                call.options = options
    if path not in PATHS:
        raise ValueError(f"Unknown implementation {path!r}; valid: {', '.join(PATHS)}.")
    if path != "generic" and (want_weights or dropout_fn is not None):
        raise ValueError(f"implementation={path!r} returns no weights and has no dropout.")
    return PATHS[path](call)
