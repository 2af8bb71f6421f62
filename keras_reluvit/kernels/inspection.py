"""Reading the accelerator kernels without the accelerator, for benchmarks
and tests: the Triton kernels compiled ahead of time for a CUDA target as
they are launched (ptxas' register and spill report, the SASS, the
tensor-core work each CTA issues), and the JAX lowering target for Pallas'
CUDA path on a machine without a GPU. Nothing here runs in training."""

import contextlib


@contextlib.contextmanager
def jax_lowering_target(platform):
    """Inside: `jax.jit(f).trace(...).lower(lowering_platforms=(platform,))`
    lowers Pallas' kernels for `platform` on a machine without it. For
    "cuda", JAX 0.12 asks the device kind of an abstract GPU (its Triton
    lowering reads the compute capability from it): an H200 (sm_90), as
    `compile_for` targets. Nothing needed for "tpu" (Mosaic) or a machine
    with the GPU."""
    import jax

    abstract = getattr(jax.sharding, "AbstractDevice", None)
    if platform != "cuda" or abstract is None or jax.devices()[0].platform == "gpu":
        yield
        return
    mesh = jax.sharding.AbstractMesh((1,), ("_",), (jax.sharding.AxisType.Auto,),
                                     abstract_device=abstract("NVIDIA H200", None, "gpu"))
    with jax.sharding.use_abstract_mesh(mesh):
        yield


class _Target:
    """Triton's active driver while `compile_for` compiles: a GPU target on
    a machine without one (nothing is launched)."""

    def __init__(self, target):
        from triton.backends.compiler import GPUTarget

        self.target = GPUTarget(*target)
        self.device = f"compile_for:{target}:{len(_COMPILES)}"  # no in-memory cache hits
        _COMPILES.append(self.device)

    def get_current_target(self):
        return self.target

    def get_current_device(self):
        return self.device

    def get_current_stream(self, device=None):
        return 0


MASKS = (None, "key", "general")
_COMPILES = []


def compile_for(target=("cuda", 90, 32), activation="relu", dtype="bf16", mask=None,
                head_dim=64, tokens=197, heads=6, batch=2, deterministic=False, with_forward=True):
    """Compiles ahead of time, for a GPU target (no GPU needed; not under
    TRITON_INTERPRET), every kernel that one training step of attention
    launches -- the forward and the backward of `attention` on the q, k, v
    views of a fused qkv projection, `tokens` tokens -- *as launched*: the
    launches' own specialisation (pointer alignment, strides divisible by
    16), precision, and every config of the autotuning space. `mask`: None
    (then the row factor is the constant `1 / tokens`), "key" or "general"
    (row factors per row, from the mask's counts). Returns
    `[(kernel name, compiled kernel, ptxas' report)]`; the report is what
    Triton's own ptxas invocation printed (`Used N registers`, spill
    bytes). `with_forward=False` leaves the forward kernel out.
    """
    import torch

    from keras_reluvit.kernels import triton as kernels

    if kernels.interpreting():
        raise RuntimeError("compile_for needs Triton's compiler; unset TRITON_INTERPRET.")
    dt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
    qkv = torch.zeros(batch, tokens, 3, heads, head_dim, dtype=dt)
    q, k, v = qkv.unbind(2)
    if mask is None:
        m, r = None, 1.0 / tokens
    else:
        m = torch.ones(batch, 1 if mask == "key" else tokens, tokens, dtype=torch.bool)
        r = torch.full((batch, tokens, heads), 1.0 / tokens)
    out = torch.zeros(batch, tokens, heads, head_dim, dtype=dt)
    compiled = []

    def warm_up(fn, grid, args, meta):  # compiles what the launch would run
        found = fn.warmup(*args, grid=grid, **meta)
        compiled.extend(found if isinstance(found, list) else [found])

    launch, kernels._launch = kernels._launch, warm_up
    try:
        with compiling(target) as log:
            if with_forward:
                kernels.forward(q, k, v, r, m, activation)
            kernels.backward(q, k, v, r, m, out, out, activation, deterministic=deterministic)
    finally:
        kernels._launch = launch
    reports = ptxas_reports(log.getvalue())
    return [(c.name, c, reports[c.name].pop(0)) for c in compiled]


@contextlib.contextmanager
def compiling(target=("cuda", 90, 32)):
    """Inside: Triton compiles for `target` on a machine without that GPU
    (its active driver faked; nothing can be launched), every kernel afresh
    (no on-disk cache hits), and ptxas' `-v` report goes to the yielded
    StringIO (read it with `ptxas_reports`). `compile_for` and
    benchmarks/kernels_static.py compile through it."""
    import io

    from triton import knobs
    from triton.runtime import driver

    from keras_reluvit.kernels import triton as kernels

    if kernels.interpreting():
        raise RuntimeError("compiling for a GPU needs Triton's compiler; unset TRITON_INTERPRET.")
    previous = driver._active  # None where there is no GPU driver
    driver.set_active(_Target(target))
    log = io.StringIO()
    try:
        with knobs.nvidia.scope(), knobs.compilation.scope(), contextlib.redirect_stdout(log):
            knobs.nvidia.dump_ptxas_log = True
            knobs.compilation.always_compile = True  # no on-disk cache hits: ptxas reports each
            yield log
    finally:
        driver._active = previous


def sass(kernel):
    """The SASS of a compiled kernel (`compile_for`'s; its cubin through the
    cuobjdump Triton ships)."""
    import os
    import subprocess
    import tempfile

    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin",
                        "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        return subprocess.run([tool, "-sass", f.name], capture_output=True, text=True,
                              check=True).stdout


def tensor_core_macs(code, warps):
    """Multiply-adds the tensor-core instructions in SASS text `code` issue
    in a CTA of `warps` warps: an HGMMA m x n x k once per warpgroup (4
    warps), an HMMA 16 x 8 x k once per warp."""
    import re

    macs = sum(int(m) * int(n) * int(k) * (warps // 4)
               for m, n, k in re.findall(r"HGMMA\.(\d+)x(\d+)x(\d+)", code))
    return macs + sum(16 * 8 * int(k) * warps for k in re.findall(r"HMMA\.168(\d+)", code))


def mma_work(kernel):
    """Tensor-core work the CTA issues over the tile's own: the multiply-adds
    of every HGMMA (warpgroup: m x n x k, once per 4 warps) and HMMA (warp:
    16 x 8 x k, once per warp) in the SASS, over those of the `tt.dot`s in
    the TTGIR (M x N x K each; both count every loop body: the unmasked
    loop and the masked tail). 1.0: no warp computes rows another warp
    computes (a 64-row dot laid out on 8 warps is computed by both
    warpgroups); None without dots or tensor-core instructions (IEEE float32)."""
    import re

    issued = tensor_core_macs(sass(kernel), kernel.metadata.num_warps)
    nominal = 0
    for line in kernel.asm["ttgir"].splitlines():
        if re.search(r"\b(tt\.dot|ttng\.warp_group_dot) ", line):
            (m, k), (_, n) = re.findall(r"(\d+)x(\d+)x(?:bf16|f16|f32)", line)[:2]
            nominal += int(m) * int(n) * int(k)
    return round(issued / nominal, 3) if nominal and issued else None


def ptxas_reports(text):
    """ptxas' `-v` log -> {kernel name: {"registers", "spill_stores",
    "spill_loads", "stack"}} (a list per name, in compile order: each config of a
    kernel reports)."""
    import re

    reports, name = {}, None
    for line in text.splitlines():
        found = re.search(r"Compiling entry function '(\w+)'", line)
        if found:
            name = found.group(1)
            continue
        found = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes "
                          r"spill loads", line)
        if found and name:
            reports.setdefault(name, []).append(dict(
                stack=int(found.group(1)), spill_stores=int(found.group(2)),
                spill_loads=int(found.group(3))))
            continue
        found = re.search(r"Used (\d+) registers", line)
        if found and name:
            reports[name][-1]["registers"] = int(found.group(1))
    return reports

