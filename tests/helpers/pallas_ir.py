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
