"""The Triton IR that Pallas hands XLA for CUDA, as text: Pallas' Triton
lowering (a private jax function: jax 0.10's) wrapped so that each kernel's
module is kept when a function is lowered with `lowering_platforms=("cuda",)`."""

from jax._src.pallas.triton import pallas_call_registration as registration


def capture_triton_modules(setattr_=setattr):
    """Starts keeping the modules; returns the list they are appended to.
    `setattr_`: pytest's `monkeypatch.setattr` to undo it after a test."""
    modules = []
    lower = registration.lowering.lower_jaxpr_to_triton_module

    def capture(*args, **kwargs):
        result = lower(*args, **kwargs)
        modules.append(result.module.operation.get_asm(enable_debug_info=False))
        return result

    setattr_(registration.lowering, "lower_jaxpr_to_triton_module", capture)
    return modules


_MODULES = []  # this process' capture list (one capture: wrapping twice would keep each twice)


def compile_for_sm90(fn, *args):
    """`[(kernel name, Triton IR text, compiled kernel, ptxas' report)]`: each
    Triton module Pallas hands XLA when `jax.jit(fn)` is lowered for CUDA on
    `args`, compiled for sm_90 by Triton's own compiler with the warps and
    stages its launch hands XLA (read from the lowered program). Used by
    tests/once/test_accelerator_build.py and benchmarks/kernels_static.py."""
    import os
    import re
    import tempfile

    import jax
    import triton
    from triton.backends.compiler import GPUTarget

    from keras_reluvit.kernels.inspection import compiling
    from keras_reluvit.kernels.inspection import jax_lowering_target
    from keras_reluvit.kernels.inspection import ptxas_reports

    if not _MODULES:
        _MODULES.append(capture_triton_modules())
    modules = _MODULES[0]
    del modules[:]
    with jax_lowering_target("cuda"):
        hlo = jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    launched = {n: (int(s), int(w)) for n, s, w in re.findall(
        r'name = "(\w+)", num_stages = (\d+) : i32, num_warps = (\d+)', hlo)}
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for text in modules:
            name = re.search(r"tt.func public @(\w+)", text).group(1)
            stages, warps = launched[name]
            path = os.path.join(tmp, name + ".ttir")
            with open(path, "w") as f:
                f.write(text)
            with compiling(("cuda", 90, 32)) as log:  # ptxas' own report
                compiled = triton.compile(path, target=GPUTarget("cuda", 90, 32),
                                          options=dict(num_warps=warps, num_stages=stages))
            report = next(iter(ptxas_reports(log.getvalue()).values()))[0]
            out.append((name, text, compiled, report))
    return out
