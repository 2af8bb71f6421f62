"""Every computation path of the dispatch point equals the generic keras.ops
path, forward and gradient, on the current backend."""

import itertools
import os

import keras
import numpy as np
import pytest
from conftest import grads

from keras_reluvit import PointwiseAttention
from keras_reluvit import kernels
from keras_reluvit import pointwise_attention

B, T, S, H, D = 2, 7, 8, 2, 4
PATHS = ["chunked"] + (["torch_tiled"] if keras.backend.backend() == "torch" else [])
ACTS = ["relu", "relu2", "gelu", "softplus", "identity", "relu6", "sigmoid"]
CASES = [c for c in itertools.product(PATHS, ACTS, ["none", "padding"], [0.0, 1.0], [False, True])
         if not (c[0] == "torch_tiled" and c[2] == "padding")]


def inputs(seed):
    rng = np.random.default_rng(seed)
    q, k, v = (rng.normal(size=(B, n, H, D)).astype("float32") for n in (T, S, S))
    mask = np.ones((B, T, S), bool)
    mask[1, :, 5:] = False
    mask[0, 2, :] = False  # a query with nothing to attend to
    return q, k, v, mask


@pytest.mark.parametrize("path,act,mask_kind,alpha,scaled", CASES,
                         ids=["-".join(map(str, c)) for c in CASES])
def test_path_matches_generic_forward_and_gradient(path, act, mask_kind, alpha, scaled):
    q, k, v, mask = inputs(0)
    mask = mask if mask_kind == "padding" else None
    log_scale = keras.ops.convert_to_tensor(np.array([0.3, -0.7], "float32")) if scaled else None
    kw = dict(activation=act, seq_len_exponent=alpha, mask=mask, log_scale=log_scale)
    extra = dict(chunk_size=3) if path == "chunked" else {}

    def f(impl, **more):
        return lambda a, b, c: pointwise_attention(a, b, c, implementation=impl, **kw, **more)

    ref = keras.ops.convert_to_numpy(f("generic")(q, k, v))
    got = keras.ops.convert_to_numpy(f(path, **extra)(q, k, v))
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)

    cot = keras.ops.convert_to_tensor(np.random.default_rng(1).normal(size=ref.shape).astype("float32"))
    g_ref, _ = grads(lambda a, b, c: keras.ops.sum(f("generic")(a, b, c) * cot), [], [q, k, v])
    g_got, _ = grads(lambda a, b, c: keras.ops.sum(f(path, **extra)(a, b, c) * cot), [], [q, k, v])
    for a, b in zip(g_got, g_ref):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def _torch_tiled_without_autograd_writes_the_same_output():
    import torch

    q, k, v, _ = inputs(2)
    ref = keras.ops.convert_to_numpy(pointwise_attention(q, k, v, implementation="generic"))
    with torch.no_grad():
        got = kernels.torch_tiled(*(torch.tensor(x) for x in (q, k, v)), "relu",
                                  keras.ops.relu, float(S) ** -1, tile_bh=3, tile_q=4)
    np.testing.assert_allclose(got.numpy(), ref, rtol=1e-5, atol=1e-6)


if keras.backend.backend() == "torch":  # the torch-only no-grad buffer path
    test_torch_tiled_without_autograd_writes_the_same_output = (
        _torch_tiled_without_autograd_writes_the_same_output)


def _torch_fused_kernel_equals_generic_forward():
    """The C++ kernel (torch CPU inference) against the generic path: each
    activation it takes, alpha 0 and 1, a learned scale, odd shapes (T != S,
    T not a multiple of the tile), and non-contiguous inputs."""
    import torch

    from keras_reluvit.kernels import torch_cpu

    rng = np.random.default_rng(3)
    log_scale = torch.tensor([0.3, -0.7, 0.1])
    for b, t, s, h, d in ((2, 7, 8, 3, 4), (1, 100, 333, 3, 16), (2, 70, 50, 3, 8)):
        q, k, v = (torch.tensor(rng.normal(size=(b, n, h, d)).astype("float32"))
                   for n in (t, s, s))
        for act in sorted(torch_cpu.ACTIVATIONS):
            for alpha, scale in ((0.0, None), (1.0, None), (1.0, log_scale), (0.5, None)):
                kw = dict(activation=act, seq_len_exponent=alpha, log_scale=scale)
                ref = pointwise_attention(q, k, v, implementation="generic", **kw)
                with torch.no_grad():
                    got = pointwise_attention(q, k, v, implementation="torch_fused", **kw)
                    tiny = torch_cpu.attention(q, k, v, act, 1.0, tile_q=16, tile_k=24)
                np.testing.assert_allclose(got.numpy(), ref.detach().numpy(), rtol=1e-5, atol=1e-5)
                if alpha == 0.0:  # out_scale 1: the small tiles give the same sums
                    np.testing.assert_allclose(tiny.numpy(), ref.detach().numpy(), rtol=1e-4,
                                               atol=1e-4)  # other summation order, unscaled sums
    # Non-contiguous views (a transposed tensor) are handled.
    q, k, v = (torch.tensor(rng.normal(size=(2, 3, 9, 4)).astype("float32")).transpose(1, 2)
               for _ in range(3))
    with torch.no_grad():
        got = pointwise_attention(q, k, v, implementation="torch_fused")
    np.testing.assert_allclose(got.numpy(), pointwise_attention(
        q, k, v, implementation="generic").numpy(), rtol=1e-5, atol=1e-5)
    # One query (a length-1 axis may carry any stride, here 0) against 300 keys.
    base = torch.tensor(rng.normal(size=(2, 3, 8)).astype("float32"))
    q1 = base.as_strided((2, 1, 3, 8), (24, 0, 8, 1))
    k, v = (torch.tensor(rng.normal(size=(2, 300, 3, 8)).astype("float32")) for _ in range(2))
    with torch.no_grad():
        got = pointwise_attention(q1, k, v, implementation="torch_fused")
    np.testing.assert_allclose(got.numpy(), pointwise_attention(
        q1.contiguous(), k, v, implementation="generic").numpy(), rtol=1e-5, atol=1e-5)
    # A NaN query row gives a NaN output row (as the generic path), not zeros:
    # the kernel's SIMD activations keep NaN scores.
    q, k, v = (torch.tensor(rng.normal(size=(1, 9, 2, 4)).astype("float32")) for _ in range(3))
    q[0, 4, 1, 2] = float("nan")
    for act in sorted(torch_cpu.ACTIVATIONS):
        with torch.no_grad():
            got = pointwise_attention(q, k, v, activation=act, implementation="torch_fused")
        ref = pointwise_attention(q, k, v, activation=act, implementation="generic")
        np.testing.assert_array_equal(np.isnan(got.numpy()), np.isnan(ref.numpy()))
        assert np.isnan(got.numpy()[0, 4, 1]).all(), act


def _torch_fused_backward_equals_generic_gradient(monkeypatch):
    """Training through the fused kernel (`trainable_attention`: the forward
    kernel, the C++ backward that recomputes the scores per tile) against
    autograd of the generic path: dQ, dK, dV and the learned log-scale's
    gradient, each activation, alpha 0 / 0.5 / 1, odd shapes (T != S, T and
    S not multiples of the tiles), and tiles forced small so that the query
    and key loops run many times (partial last tiles included)."""
    import torch

    from keras_reluvit.kernels import torch_cpu

    rng = np.random.default_rng(5)
    for b, t, s, h, d, tiles in ((2, 7, 8, 3, 4, (128, 512)), (1, 100, 333, 3, 16, (16, 24)),
                                 (2, 70, 50, 3, 8, (1, 7)), (1, 9, 600, 3, 8, (128, 512))):
        monkeypatch.setattr(torch_cpu, "BACKWARD_TILES", tiles)
        x = [rng.normal(size=(b, n, h, d)).astype("float32") for n in (t, s, s)]
        cot = torch.tensor(rng.normal(size=(b, t, h, d)).astype("float32"))
        for act in sorted(torch_cpu.ACTIVATIONS):
            for alpha, learned in ((0.0, False), (1.0, True), (0.5, False)):
                results = []
                for impl in ("generic", "torch_fused"):
                    q, k, v = (torch.tensor(a, requires_grad=True) for a in x)
                    log_scale = torch.tensor([0.3, -0.7, 0.1], requires_grad=True)
                    out = pointwise_attention(q, k, v, activation=act, seq_len_exponent=alpha,
                                              log_scale=log_scale if learned else None,
                                              implementation=impl)
                    (out * cot).sum().backward()
                    results.append([out.detach(), q.grad, k.grad, v.grad]
                                   + ([log_scale.grad] if learned else []))
                for got, ref in zip(results[1], results[0]):
                    np.testing.assert_allclose(got.numpy(), ref.numpy(), rtol=1e-4, atol=2e-5)
    # q, k, v as strided views of one (B, T, 3, H, D) qkv tensor (what the
    # PyTorch fast path hands over; the kernels read them in place) and a
    # transposed (B, H, T, D) layout: same outputs and gradients.
    x = rng.normal(size=(2, 37, 3, 3, 8)).astype("float32")
    cot = torch.tensor(rng.normal(size=(2, 37, 3, 8)).astype("float32"))
    results = []
    for impl, layout in (("generic", "qkv"), ("torch_fused", "qkv"), ("torch_fused", "bhtd")):
        xt = torch.tensor(x if layout == "qkv" else x.transpose(0, 2, 3, 1, 4).copy(),
                          requires_grad=True)
        q, k, v = xt.unbind(2) if layout == "qkv" else (a.transpose(1, 2) for a in xt.unbind(1))
        assert layout == "bhtd" or q.stride(1) == 3 * 3 * 8  # not contiguous
        out = pointwise_attention(q, k, v, implementation=impl)
        (out * cot).sum().backward()
        grad = xt.grad if layout == "qkv" else xt.grad.permute(0, 3, 1, 2, 4)
        results.append([out.detach(), grad])
    for got in results[1:]:
        for g, r in zip(got, results[0]):
            np.testing.assert_allclose(g.numpy(), r.numpy(), rtol=1e-4, atol=2e-5)


def _torch_dispatch_uses_the_fused_kernel_without_a_mask():
    import torch

    from keras_reluvit.kernels import torch_cpu

    calls = []
    original = torch_cpu.attention
    torch_cpu.attention = lambda *a, **k: calls.append(1) or original(*a, **k)
    try:
        q, k, v, mask = inputs(4)
        q, k, v = (torch.tensor(x) for x in (q, k, v))
        with torch.no_grad():
            pointwise_attention(q, k, v)                           # relu: fused
            pointwise_attention(q, k, v, activation="gelu")        # not in the kernel: tiled
            pointwise_attention(q, k, v, mask=torch.tensor(mask))  # mask: generic
        assert len(calls) == 1
        qg = q.clone().requires_grad_(True)
        pointwise_attention(qg, k, v).sum().backward()             # training: fused too
        assert len(calls) == 2 and qg.grad is not None
    finally:
        torch_cpu.attention = original
    with pytest.raises(ValueError, match="torch_fused"):
        pointwise_attention(q, k, v, activation="sigmoid", implementation="torch_fused")
    # Where the kernel cannot be built, inference falls back to the tiled path.
    saved = dict(torch_cpu._state)
    torch_cpu._state["module"] = None
    try:
        assert not torch_cpu.usable(q, "relu")
        with torch.no_grad():
            np.testing.assert_allclose(pointwise_attention(q, k, v).numpy(),
                                       pointwise_attention(q, k, v, implementation="generic").numpy(),
                                       rtol=1e-5, atol=1e-6)
    finally:
        torch_cpu._state.clear()
        torch_cpu._state.update(saved)


def _fused_probe(tmp_path, code, extensions_dir=None, timeout=300):
    """Runs `code` in a fresh torch process; returns (stdout, stderr)."""
    import subprocess
    import sys

    from conftest import subprocess_env

    env = subprocess_env("torch")
    if extensions_dir:
        env["TORCH_EXTENSIONS_DIR"] = str(extensions_dir)
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=timeout, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout, proc.stderr


def _torch_fused_builds_only_when_chosen_and_only_for_cpu_tensors(tmp_path):
    import torch

    from keras_reluvit.kernels import torch_cpu

    code = (
        "import numpy as np, torch\n"
        "from keras_reluvit.models.attention import pointwise_attention\n"
        "q = torch.tensor(np.random.default_rng(0).normal(size=(1, 64, 2, 8)).astype('float32'))\n"
        "with torch.no_grad():\n"
        "    pointwise_attention(q, q, q, chunk_size=16)\n"
        "    pointwise_attention(q, q, q, mask=torch.ones(1, 64, 64, dtype=torch.bool))\n"
        "    pointwise_attention(q, q, q, activation='gelu')\n"
        "    pointwise_attention(q, q, q, return_weights=True)\n"
        "pointwise_attention(q.requires_grad_(True), q, q, activation='gelu')\n"
        "print('ok')\n")
    out, err = _fused_probe(tmp_path, code, extensions_dir=tmp_path / "ext")
    assert "ok" in out and "building" not in err
    assert not list((tmp_path / "ext").rglob("*.so"))  # nothing was compiled
    meta = torch.empty(1, 4, 2, 8, device="meta")
    assert not torch_cpu.eligible(meta, "relu")
    assert torch_cpu.eligible(torch.empty(1, 4, 2, 8), "relu")


def _torch_fused_recovers_a_stale_build_lock_and_never_waits(tmp_path):
    import os
    import subprocess
    import sys

    from keras_reluvit.kernels import torch_cpu

    directory = torch_cpu.build_directory()  # the real cache (built by the tests above)
    lock = os.path.join(directory, "lock")
    owner = os.path.join(directory, "keras_reluvit.owner")
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    code = ("import warnings; warnings.simplefilter('always')\n"
            "from keras_reluvit.kernels import torch_cpu\n"
            "print('built' if torch_cpu.load() is not None else 'none')\n")
    try:
        # A build killed half-way: torch's lock file and a dead owner.
        open(lock, "w").close()
        with open(owner, "w") as f:
            f.write(dead + "\n")
        out, err = _fused_probe(tmp_path, code, timeout=300)
        assert "built" in out and "removed a stale PyTorch build lock" in err
        assert not os.path.exists(lock)
        # A live owner (this test process): no waiting, the tiled path.
        open(lock, "w").close()
        with open(owner, "w") as f:
            f.write(f"{os.getpid()}\n")
        out, err = _fused_probe(tmp_path, code, timeout=60)
        assert "none" in out and "is being built by process" in err
    finally:
        for f in (lock, owner):
            if os.path.exists(f):
                os.remove(f)


def _torch_symbolic_build_takes_the_generic_path(monkeypatch):
    """Building a functional ViT runs torch ops on "meta" tensors: one
    generic einsum, not the tile loops (ViT_L8 took 80 s to build before)."""
    from keras_reluvit import kernels as K

    def boom(*a, **k):
        raise AssertionError("a tiled / fused path ran in the symbolic pass")

    monkeypatch.setattr(K, "torch_tiled", boom)
    import keras_reluvit as kr

    with keras.StatelessScope():
        model = kr.ViT("Ti/8", image_size=64, depth=1, width=32, num_heads=2, mlp_dim=64)
    assert model.output_shape == (None, 1000)


if keras.backend.backend() == "torch":
    test_torch_symbolic_build_takes_the_generic_path = _torch_symbolic_build_takes_the_generic_path
    test_torch_fused_kernel_equals_generic_forward = _torch_fused_kernel_equals_generic_forward
    test_torch_fused_backward_equals_generic_gradient = _torch_fused_backward_equals_generic_gradient
    test_torch_dispatch_uses_the_fused_kernel_without_a_mask = (
        _torch_dispatch_uses_the_fused_kernel_without_a_mask)
    test_torch_fused_builds_only_when_chosen_and_only_for_cpu_tensors = (
        _torch_fused_builds_only_when_chosen_and_only_for_cpu_tensors)
    test_torch_fused_recovers_a_stale_build_lock_and_never_waits = (
        _torch_fused_recovers_a_stale_build_lock_and_never_waits)


def test_dispatch_rule():
    c = kernels.choose
    assert c("torch", "relu", None, False, False, 197, 197, None) == "torch_tiled"
    assert c("torch", "relu", "mask", False, False, 197, 197, None) == "generic"
    assert c("torch", "relu", None, True, False, 197, 197, None) == "generic"  # weights wanted
    assert c("jax", "relu", None, False, False, 197, 197, None) == "generic"
    assert c("jax", "relu", None, False, False, 197, 197, 64) == "chunked"
    assert c("tensorflow", "relu", None, False, False, 197, 197, "auto") == "generic"
    assert c("tensorflow", "relu", None, False, False, 8192, 8192, "auto") == "chunked"
    assert c("torch", None, None, False, False, 197, 197, None) == "generic"  # callable
    assert c("torch", "relu", None, False, False, 197, 197, None, recording=True) == "generic"
    assert c("torch", "relu", None, False, False, 197, 197, None, recording=True,
             fused=True) == "torch_fused"
    assert c("torch", "relu", None, False, False, 197, 197, None, fused=True) == "torch_fused"
    assert c("torch", "relu", "mask", False, False, 197, 197, None, fused=True) == "generic"


def test_layer_with_chunks_equals_dense_layer_and_serializes():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(2, 9, 8)).astype("float32")
    dense = PointwiseAttention(2, 4, activation="relu", qk_norm=True)
    chunked = PointwiseAttention(2, 4, activation="relu", qk_norm=True, chunk_size=4)
    dense(x, x)
    chunked(x, x)
    chunked.set_weights(dense.get_weights())
    mask = np.tril(np.ones((2, 9, 9), bool))
    for kw in ({}, {"attention_mask": mask}):
        np.testing.assert_allclose(keras.ops.convert_to_numpy(chunked(x, x, **kw)),
                                   keras.ops.convert_to_numpy(dense(x, x, **kw)), rtol=1e-5, atol=1e-6)
    assert PointwiseAttention.from_config(chunked.get_config())._chunk_size == 4
    with pytest.raises(ValueError, match="chunk_size"):
        PointwiseAttention(2, 4, chunk_size=0)


def test_layer_passes_the_activation_name_to_the_dispatch_rule(monkeypatch):
    """The backend fast paths are chosen by activation name: the layer (and so
    every ViT) must hand the name, not only the function, to the dispatch point."""
    seen = []
    original = kernels.choose
    monkeypatch.setattr(kernels, "choose",
                        lambda *a, **k: seen.append(a[1]) or original(*a, **k))
    x = np.random.default_rng(5).normal(size=(2, 5, 8)).astype("float32")
    for act in ("relu", "relu2", "sigmoid"):
        PointwiseAttention(num_heads=2, key_dim=4, activation=act)(x, x)
    assert seen[-3:] == ["relu", "relu2", "sigmoid"]


def test_dispatch_names_each_path_once_and_refuses_what_a_path_cannot_do():
    """`kernels.PATHS` is the one table of paths: an unknown name lists it;
    a path asked for weights or dropout, or one this backend lacks, says so.
    Every path of the table that this backend runs gives the generic
    output."""
    from keras_reluvit import kernels as K

    q, k, v = (np.random.default_rng(i).normal(size=(1, 9, 2, 16)).astype("float32")
               for i in range(3))
    with pytest.raises(ValueError, match="Unknown implementation 'flash'; valid: "
                       + ", ".join(K.PATHS)):
        pointwise_attention(q, k, v, implementation="flash")
    with pytest.raises(ValueError, match="implementation='chunked' returns no weights"):
        pointwise_attention(q, k, v, implementation="chunked", return_weights=True)
    backend = keras.backend.backend()
    if backend != "jax":
        with pytest.raises(ValueError, match="implementation='pallas' needs the JAX backend"):
            pointwise_attention(q, k, v, implementation="pallas")
    if backend != "torch":
        with pytest.raises(ValueError, match="implementation='triton' needs the PyTorch"):
            pointwise_attention(q, k, v, implementation="triton")
        with pytest.raises(ValueError, match="implementation='torch_tiled' needs PyTorch"):
            pointwise_attention(q, k, v, implementation="torch_tiled")
    with pytest.raises(ValueError, match="implementation='sequence_parallel' needs"):
        pointwise_attention(q, k, v, implementation="sequence_parallel")
    ref = keras.ops.convert_to_numpy(pointwise_attention(q, k, v, implementation="generic"))
    runs = {"jax": ["chunked", "pallas"], "tensorflow": ["chunked"],
            "torch": ["chunked", "torch_tiled"]}[backend]
    for path in runs:
        got = keras.ops.convert_to_numpy(pointwise_attention(q, k, v, implementation=path))
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6, err_msg=path)


def test_every_switch_has_a_python_setting_over_its_environment_variable(monkeypatch):
    """`kr.kernels.configure` sets what the environment variables set; None
    goes back to them; the docs' one table names each switch."""
    from keras_reluvit.kernels import switches
    from keras_reluvit.kernels import torch_fast

    for name, (env, default, kind) in switches.SWITCHES.items():
        monkeypatch.delenv(env, raising=False)
        assert switches.setting(name) == default
        on = "/tmp/decisions.json" if kind is str else True
        monkeypatch.setenv(env, "0" if kind is bool else on)
        assert switches.setting(name) == (False if kind is bool else on)
        with kernels.configured(**{name: True if kind is bool else "/tmp/other.json"}):
            assert switches.setting(name) == (True if kind is bool else "/tmp/other.json")
        assert switches.setting(name) == (False if kind is bool else on)  # restored
    monkeypatch.delenv("KERAS_RELUVIT_TORCH_FAST")
    with kernels.configured(torch_fast=False):
        assert not torch_fast.enabled()
    assert torch_fast.enabled() == (keras.backend.backend() == "torch")
    with pytest.raises(ValueError, match="Unknown switch 'torch_fats'"):
        kernels.configure(torch_fats=False)
    with pytest.raises(ValueError, match="torch_fast must be a bool"):
        kernels.configure(torch_fast="no")
    docs = open(os.path.join(os.path.dirname(__file__), "..", "docs", "kernels.md")).read()
    table = docs[docs.index("## Switches"):]
    for env, _, _ in switches.SWITCHES.values():
        assert f"`{env}" in table, env
    assert "`KERAS_RELUVIT_KERNEL`" in table
