"""The kernels' switches: each one an environment variable (read when no
setting is made in Python) and a Python setting over it. The table of all
of them is in docs/kernels.md ("Switches").

- `set_kernel` / `use_kernel` / `get_kernel`: which fused kernel computes
  pointwise attention (`KERAS_RELUVIT_KERNEL`).
- `configure(torch_fused=, torch_fast=, kernel_cache=)` /
  `configured(...)` / `setting(name)`: PyTorch's compiled CPU kernel
  (`KERAS_RELUVIT_TORCH_FUSED`), PyTorch's fused projection layers
  (`KERAS_RELUVIT_TORCH_FAST`), the file of the measured dispatch's
  decisions (`KERAS_RELUVIT_KERNEL_CACHE`).
- `pallas_deterministic()`: XLA's `--xla_gpu_deterministic_ops=true` (read
  from `XLA_FLAGS`, XLA's own switch) chooses the Pallas kernel's
  deterministic backward; `pallas.attention(deterministic=True)` per call.
"""

import contextlib
import os

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
    tensors on PyTorch -- once it has run, matched and beaten the path
    taken without it on the call's signature (`kernels.measured`; see
    `report()`), and the CPU paths elsewhere), `"pallas"` (JAX; in
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


# --- the other switches -----------------------------------------------------------
# name -> (environment variable, default, kind)
SWITCHES = {
    "torch_fused": ("KERAS_RELUVIT_TORCH_FUSED", True, bool),
    "torch_fast": ("KERAS_RELUVIT_TORCH_FAST", True, bool),
    "kernel_cache": ("KERAS_RELUVIT_KERNEL_CACHE", None, str),
}
_settings = {}  # configure's values, over the environment variables


def _check(name, value):
    if name not in SWITCHES:
        raise ValueError(f"Unknown switch {name!r}; the switches are {', '.join(SWITCHES)}.")
    kind = SWITCHES[name][2]
    if value is not None and not isinstance(value, kind):
        raise ValueError(f"{name} must be a {kind.__name__} (or None: the environment's "
                         f"{SWITCHES[name][0]}), got {value!r}.")
    return value


def setting(name):
    """The switch `name` in force: `configure`'s value, else its environment
    variable (`"0"` is off for the on/off switches), else its default."""
    _check(name, None)
    if name in _settings:
        return _settings[name]
    env, default, kind = SWITCHES[name]
    raw = os.environ.get(env)
    if raw is None or raw == "":
        return default
    return raw.strip() != "0" if kind is bool else raw


def configure(**switches):
    """Sets switches for this process, over their environment variables:
    `torch_fused=False` (PyTorch on CPU: the tiled path, `torch_tiled`,
    instead of the compiled C++ kernel), `torch_fast=False` (PyTorch: Keras'
    own layer code instead of the fused q/k/v projections), `kernel_cache=
    "file.json"` (where the measured dispatch keeps its decisions across
    processes). A value of None goes back to the environment variable."""
    for name, value in switches.items():
        _check(name, value)
    for name, value in switches.items():
        if value is None:
            _settings.pop(name, None)
        else:
            _settings[name] = value


@contextlib.contextmanager
def configured(**switches):
    """`with configured(torch_fast=False): ...`: `configure` inside the block."""
    previous = dict(_settings)
    configure(**switches)
    try:
        yield
    finally:
        _settings.clear()
        _settings.update(previous)


def pallas_deterministic():
    """XLA's `--xla_gpu_deterministic_ops=true` (in `XLA_FLAGS`): the Pallas
    kernel's backward is then the deterministic one."""
    return "--xla_gpu_deterministic_ops=true" in os.environ.get("XLA_FLAGS", "")
