"""Child process (Triton's compiler, no TRITON_INTERPRET): compiles the
Triton kernel variants that launch -- per dtype given on the command line
(fp32: with TF32 allowed), fused and deterministic backward, every
autotuning config -- for sm_90a *as launched* (`kernels.inspection.compile_for`),
and prints one JSON list of rows: ptxas' registers and spill bytes, shared
memory, dots per loop iteration, the tensor-core work the SASS issues over
the tiles' FLOPs (`kernels.inspection.mma_work`), and whether every batch /
head offset is 64-bit.

CI compiles a representative subset (`SUBSET`: head dims 64 and 128, each
mask kind, so every kernel, in bf16 for the 16-bit class; fp32 as TF32 at
its largest tile's case, head dim 128 with a general mask);
`--full` compiles the whole table (head dims 64 / 80 / 128 x no / key /
general mask, ~10 min per dtype on 2 cores) and `--markdown` prints it:

    python tests/helpers/triton_table.py --full --markdown bf16 fp16 fp32 \
        > benchmarks/results/kernel_table_sm90a.md
"""

import json
import os
import re
import subprocess
import sys


def loop_dots(ttir):
    """`tt.dot`s in the body of the kernel's first loop (one tile's work);
    all of them where there is no loop."""
    lines = ttir.splitlines()
    start = next((i for i, line in enumerate(lines) if "scf.for" in line), None)
    if start is None:
        return sum("tt.dot " in line for line in lines)
    end = next(i for i in range(start, len(lines)) if "scf.yield" in lines[i])
    return sum("tt.dot " in line for line in lines[start:end])


def offsets_64bit(ttir):
    """Every offset added to a kernel argument's pointer (the batch x head
    base of each tile) is an i64; per-tile offsets are added to that."""
    found = re.findall(r"tt\.addptr %([A-Z][A-Z_]*), %\S+ : !tt\.ptr<\w+>, (i\d+)", ttir)
    return bool(found) and all(bits == "i64" for _, bits in found)


# (head dim, mask) pairs CI compiles: both head-dim tile families, every mask
# kind; float32 (TF32) without the no-mask one, which bf16 covers (CI time).
SUBSET = {"bf16": ((64, None), (64, "key"), (128, "general")),
          "fp32": ((128, "general"),)}


def variants(full, dtype):
    from keras_reluvit.kernels import inspection as ta

    if full:
        return [(d, mask) for d in (64, 80, 128) for mask in ta.MASKS]
    return list(SUBSET.get(dtype, SUBSET["bf16"]))


def rows(dtypes, full=False):
    from keras_reluvit.kernels import inspection as ta

    out = []
    import torch

    for dtype in dtypes:
        # float32 as it launches with TF32 allowed; IEEE float32 is the
        # listed exception (triton_kernel.CONFIGS)
        torch.backends.cuda.matmul.allow_tf32 = dtype == "fp32"
        for d, mask in variants(full, dtype):
            for deterministic in (False, True):
                compiled = ta.compile_for(("cuda", 90, 32), dtype=dtype, head_dim=d, mask=mask,
                                          deterministic=deterministic,
                                          with_forward=not deterministic)
                for name, kernel, report in compiled:
                    consts = kernel.src.constants
                    names = kernel.src.fn.arg_names
                    const = {names[i[0]]: v for i, v in consts.items()}
                    out.append(dict(
                        dtype=dtype, head_dim=d, mask=mask or "none",
                        kernel=name.strip("_") + ("" if name != "_backward_kernel" else
                                                  (" (two-kernel)" if deterministic
                                                   else " (fused dQ)")),
                        tile=f"{const.get('BLOCK_Q')}x{const.get('BLOCK_K')}",
                        warps=kernel.metadata.num_warps, stages=kernel.metadata.num_stages,
                        precision=const.get("PRECISION"), shared=kernel.metadata.shared,
                        sm90a=".target sm_90a" in kernel.asm["ptx"],
                        dots=loop_dots(kernel.asm["ttir"]), mma=ta.mma_work(kernel),
                        offsets64=offsets_64bit(kernel.asm["ttir"]), **report))
    return out


def table_rows(*dtypes, full=False):
    """This script in a child process (Triton's compiler, not its
    interpreter): one row per compiled kernel variant."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(KERAS_BACKEND="torch", TRITON_DEFAULT_FP_FUSION="1")
    args = ["--full"] if full else []
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), *args, *dtypes], env=env,
                          capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


DOTS = {"forward_kernel": 2, "backward_kernel (fused dQ)": 5, "backward_kernel (two-kernel)": 4,
        "dq_kernel": 3, "dq_rows_kernel": 0}
COLUMNS = ("dtype", "head_dim", "mask", "kernel", "tile", "warps", "stages", "precision",
           "registers", "spill_stores", "spill_loads", "stack", "shared", "dots", "mma")


def exception(row):
    """The one kind of variant allowed to spill: float32 (TF32) backward
    kernels at head dims above 64 (triton_kernel.CONFIGS says why)."""
    return (row["dtype"] == "fp32" and row["head_dim"] > 64
            and row["kernel"].startswith(("backward", "dq_kernel")))


def markdown(rows):
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(str(r[c]) for c in COLUMNS) + " |" for r in rows]
    return "\n".join(lines)


def check(*dtypes, full=False):
    """Every kernel variant a launch can take, compiled for sm_90a as
    launched (`kernels.inspection.compile_for`: the launch's specialisation,
    precision and every autotuning config), read from ptxas' own report:
    no register spills anywhere (but the one listed exception: `exception`),
    shared memory within an H100/H200's
    227 KB, the dots per tile of FlashAttention-2's algorithm (2 forward,
    5 in the fused backward; the deterministic path 4 + 3), tensor-core
    work issued in the SASS equal to the tiles' FLOPs (`mma_work`), and 64-bit
    batch / head offsets in every kernel. The table is printed (pytest -s,
    or the failure message)."""
    rows = table_rows(*dtypes, full=full)
    table = markdown(rows)
    print(table)
    # Every (dtype, head dim, mask) has its forward, both backwards, dQ and the epilogue.
    compiled = {(r["dtype"], r["head_dim"], r["mask"]) for r in rows}
    assert len(compiled) == sum(len(variants(full, dtype)) for dtype in dtypes), table
    for variant in compiled:
        kernels = {r["kernel"] for r in rows if (r["dtype"], r["head_dim"], r["mask"]) == variant}
        assert kernels == set(DOTS), (variant, kernels)
    for r in rows:
        if exception(r):  # listed, with its bound, in triton_kernel.CONFIGS
            assert r["spill_stores"] <= 512 and r["registers"] <= 255, (r, table)
        else:
            assert r["spill_stores"] == 0 and r["spill_loads"] == 0 and r["stack"] == 0, (r, table)
        assert 0 < r["shared"] <= 227 * 1024 and r["sm90a"], r
        assert r["dots"] == DOTS[r["kernel"]], r
        # tensor-core work issued = the tile's FLOPs (none where there are no dots)
        assert r["mma"] == (1.0 if r["dots"] else None), (r, table)
        assert r["offsets64"], r
        # launches use tf32 only where PyTorch's matmuls may (off by default)
        # float32 as TF32 (16-bit dots ignore it); the dQ epilogue has no dots
        assert r["precision"] == ("tf32" if r["dots"] else None), r


if __name__ == "__main__":
    args = sys.argv[1:]
    full, md = "--full" in args, "--markdown" in args
    table = rows([a for a in args if not a.startswith("--")], full=full)
    print(markdown(table) if md else json.dumps(table))
