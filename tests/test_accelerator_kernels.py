"""The fused accelerator kernels (Pallas on JAX, Triton on PyTorch) equal the
generic keras.ops path, outputs and every gradient, and the kernel switch
dispatches to them. On this CPU the Pallas kernel runs in Pallas'
interpreter and the Triton kernel in Triton's (conftest sets
TRITON_INTERPRET=1); the JAX lane also lowers a whole ViT-S/16 forward and
training step for TPU (Mosaic) and CUDA (Pallas' Triton backend) and counts
the kernel's custom calls per block."""

import os
import re

import keras
import numpy as np
import pytest
from conftest import grads

import keras_reluvit as kr
from keras_reluvit import kernels
from keras_reluvit import pointwise_attention
from keras_reluvit.kernels.inspection import jax_lowering_target

BACKEND = keras.backend.backend()
KERNEL = {"jax": "pallas", "torch": "triton"}.get(BACKEND)
KERNEL_TESTS = []


def needs_kernel(test):
    """A test of the kernel of this backend; not collected on TensorFlow,
    which has none (test_forced_kernel_on_the_wrong_backend runs there)."""
    KERNEL_TESTS.append(test.__name__)
    return test

ACTS = ["relu", "relu2", "relu6", "identity", "sigmoid", "gelu", "softplus"]


def inputs(b, t, s, h, d, dv=None, seed=0):
    rng = np.random.default_rng(seed)
    q, k = (rng.normal(size=(b, n, h, d)).astype("float32") for n in (t, s))
    v = rng.normal(size=(b, s, h, dv or d)).astype("float32")
    return q, k, v


def key_padding(b, t, s, lengths):
    mask = np.zeros((b, t, s), bool)
    for i, n in enumerate(lengths):
        mask[i, :, :n] = True
    return mask


def cast(x, dtype):
    return keras.ops.cast(keras.ops.convert_to_tensor(x), dtype)


def compare(q, k, v, dtype="float32", tol=2e-5, **kw):
    """Output and gradients (q, k, v, log_scale) of the kernel vs generic.

    float32: equal within `tol`. bfloat16: both paths in bfloat16 against
    the generic path in float32 on the same (bfloat16-rounded) inputs; the
    kernel (float32 scores and accumulators) must be within 4 bfloat16 ulps
    of the largest value and on average as close as the generic path."""
    log_scale = kw.pop("log_scale", None)
    extra = [] if log_scale is None else [np.asarray(log_scale, "float32")]
    q, k, v = (keras.ops.convert_to_numpy(cast(cast(x, dtype), "float32")) for x in (q, k, v))
    cot = None

    def results(impl, dt):
        nonlocal cot

        def f(a, b, c, *ls):
            out = pointwise_attention(cast(a, dt), cast(b, dt), cast(c, dt), implementation=impl,
                                      log_scale=ls[0] if ls else None, **kw)
            return cast(out, "float32")

        out = keras.ops.convert_to_numpy(f(q, k, v, *extra))
        if cot is None:
            cot = np.random.default_rng(5).normal(size=out.shape).astype("float32")
        cot_t = keras.ops.convert_to_tensor(cot)
        g, _ = grads(lambda *xs: keras.ops.sum(f(*xs) * cot_t), [], [q, k, v] + extra)
        return [out] + [np.asarray(x, "float32") for x in g]

    names = ("output", "dq", "dk", "dv", "dlog_scale")
    got = results(KERNEL, dtype)
    assert len(got) == 4 + len(extra)
    if dtype == "float32":
        for name, a, b in zip(names, got, results("generic", "float32")):
            scale = max(1.0, float(np.abs(b).max()))
            np.testing.assert_allclose(a, b, rtol=tol, atol=tol * scale, err_msg=name)
        return
    exact = results("generic", "float32")
    base = results("generic", dtype)
    for name, a, b, r in zip(names, got, base, exact):
        # Within 4 bfloat16 ulps (2^-6) of the largest value, and on average
        # as close as the generic bfloat16 path.
        err, mean, base_mean = np.abs(a - r).max(), np.abs(a - r).mean(), np.abs(b - r).mean()
        assert err <= 2.0**-6 * np.abs(r).max(), (name, err)
        assert mean <= 1.25 * base_mean, (name, mean, base_mean)


@needs_kernel
@pytest.mark.parametrize("act", ACTS)
def test_kernel_equals_generic_for_every_activation(act):
    """T != S, neither a multiple of the block (forced to 16: several tiles
    and partial ones), a learned per-head log-scale, alpha = 1."""
    q, k, v = inputs(2, 37, 53, 3, 32, seed=1)
    compare(q, k, v, activation=act, seq_len_exponent=1.0, log_scale=[0.2, -0.4, 0.1])


# Why a kernel case is left out of CI: the rest of its grid keeps each kernel, layout,
# mask kind, dtype and head dim covered.
REPRESENTATIVE = ("a representative case stays in CI: every kernel, layout, mask kind, dtype "
                  "and head dim is covered there")

GRID = [  # head dim, dtype, alpha, mask, tokens (T, S)
    (64, "float32", 0.0, False, (197, 197)),
    (128, "float32", 0.5, True, (21, 40)),
    (32, "bfloat16", 1.0, True, (33, 33)),
    (64, "bfloat16", 1.0, False, (197, 197)),
    (128, "bfloat16", 0.5, False, (17, 70)),
    (80, "float32", 1.0, True, (50, 61)),  # ViT-H's head dim: not a power of two
]


@needs_kernel
@pytest.mark.parametrize("d,dtype,alpha,masked,tokens", GRID,
                         ids=["-".join(map(str, c)) for c in GRID])
@pytest.mark.full_only(REPRESENTATIVE,
                       ids=('64-float32-0.0-False-(197, 197)', '64-bfloat16-1.0-False-(197, 197)'))
def test_kernel_grid(d, dtype, alpha, masked, tokens):
    """Head dims 32/64/128 and 80, float32 and bfloat16, alpha 0 / 0.5 / 1, a
    key padding mask (L counts the unmasked keys), the default blocks."""
    t, s = tokens
    q, k, v = inputs(2, t, s, 2, d, seed=2)
    mask = key_padding(2, t, s, [s, s // 2 + 1]) if masked else None
    compare(q, k, v, dtype=dtype, activation="relu", seq_len_exponent=alpha, mask=mask)


@needs_kernel
def test_kernel_with_a_general_mask_and_empty_rows_and_value_dim():
    """A (B, T, S) mask (causal-like, one query with no key: zero output),
    value dim != key dim."""
    q, k, v = inputs(2, 19, 19, 2, 16, dv=24, seed=3)
    mask = np.tril(np.ones((19, 19), bool))[None].repeat(2, 0)
    mask[1, 4, :] = False
    compare(q, k, v, activation="relu2", seq_len_exponent=1.0, mask=mask)
    out = keras.ops.convert_to_numpy(pointwise_attention(q, k, v, mask=mask,
                                                         implementation=KERNEL))
    assert np.all(out[1, 4] == 0.0)


@needs_kernel
def test_key_mask_of_one_row():
    """A `(B, 1, S)` key mask (the kernels read it as one row per batch
    element) gives the generic path's outputs and gradients."""
    q, k, v = inputs(2, 21, 45, 2, 16, seed=6)
    mask = key_padding(2, 1, 45, [45, 17])
    compare(q, k, v, activation="sigmoid", seq_len_exponent=1.0, mask=mask)


@needs_kernel
def test_padded_keys_add_nothing_and_do_not_count_in_L():
    """The kernel with the last keys masked equals the kernel on the keys
    left, and the naive formula with L = the unmasked count."""
    q, k, v = inputs(1, 23, 40, 2, 16, seed=4)
    mask = key_padding(1, 23, 40, [29])
    masked = keras.ops.convert_to_numpy(pointwise_attention(
        q, k, v, mask=mask, implementation=KERNEL))
    cut = keras.ops.convert_to_numpy(pointwise_attention(
        q, k[:, :29], v[:, :29], implementation=KERNEL))
    np.testing.assert_allclose(masked, cut, rtol=1e-5, atol=1e-6)
    scores = np.einsum("bthd,bshd->bhts", q, k[:, :29]) / 4.0
    naive = np.einsum("bhts,bshd->bthd", np.maximum(scores, 0) / 29, v[:, :29])
    np.testing.assert_allclose(masked, naive, rtol=1e-5, atol=1e-6)


@needs_kernel
def test_switch_dispatches_the_kernel_in_a_vit(monkeypatch):
    """`set_kernel` / `use_kernel` route every block of a ViT through the
    kernel, with the generic path's logits and weight gradients; "auto" on
    a CPU and "generic" do not use it."""
    module = __import__(f"keras_reluvit.kernels.{KERNEL}", fromlist=["attention"])
    calls = []
    original = module.attention

    def spy(*a, **k):
        calls.append(a[3] if len(a) > 3 else k.get("activation"))
        return original(*a, **k)

    monkeypatch.setattr(module, "attention", spy)
    model = kr.ViT(image_size=32, patch_size=8, width=32, depth=2, num_heads=2, mlp_dim=64,
                   num_classes=5, attention="relu", pool="tok")
    rng = np.random.default_rng(0)
    for v in model.weights:  # perturbed: the zero head would make every logit 0
        v.assign((np.asarray(keras.ops.convert_to_numpy(v)) +
                  rng.normal(0, 0.2, tuple(v.shape))).astype("float32"))
    x = rng.normal(size=(2, 32, 32, 3)).astype("float32")

    def logits_and_grads():
        loss = lambda a: keras.ops.mean(keras.ops.square(model(a)))  # noqa: E731
        _, g = grads(loss, model.trainable_variables, [x])
        return keras.ops.convert_to_numpy(model(x)), g

    with kr.use_kernel("generic"):
        ref, g_ref = logits_and_grads()
    assert calls == []
    with kr.use_kernel("auto"):  # a CPU: today's CPU paths
        model(x)
    assert calls == []
    with kr.use_kernel(KERNEL):
        assert kr.get_kernel() == KERNEL
        got, g_got = logits_and_grads()
    assert kr.get_kernel() == "auto"
    assert calls and set(calls) == {"relu"} and len(calls) >= 2  # both blocks
    assert np.abs(ref).max() > 0.1 and all(np.abs(g).max() > 1e-4 for g in g_ref)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)
    for a, b in zip(g_got, g_ref):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


@needs_kernel
def test_forced_kernel_leaves_what_it_cannot_compute_to_the_generic_path(monkeypatch):
    """Weights returned, attention dropout and a custom activation take the
    generic path under a forced kernel (and still compute)."""
    q, k, v = inputs(1, 9, 9, 2, 8)
    with kr.use_kernel(KERNEL):
        out, w = pointwise_attention(q, k, v, return_weights=True)
        assert tuple(w.shape) == (1, 2, 9, 9)
        custom = pointwise_attention(q, k, v, activation=lambda x: keras.ops.relu(x) * 2.0)
    ref = pointwise_attention(q, k, v, implementation="generic")
    np.testing.assert_allclose(keras.ops.convert_to_numpy(custom),
                               2 * keras.ops.convert_to_numpy(ref), rtol=1e-5, atol=1e-6)


def test_forced_kernel_on_the_wrong_backend():
    q, k, v = inputs(1, 5, 5, 1, 8)
    for kernel, home in (("pallas", "jax"), ("triton", "torch")):
        if BACKEND == home:
            continue
        with kr.use_kernel(kernel):
            with pytest.raises(ValueError, match=f"KERAS_RELUVIT_KERNEL={kernel} needs the "):
                pointwise_attention(q, k, v)


def test_switch_values_are_checked(monkeypatch):
    with pytest.raises(ValueError, match="auto, pallas, triton, generic; got 'cuda'"):
        kr.set_kernel("cuda")
    monkeypatch.setenv("KERAS_RELUVIT_KERNEL", "Pallas")
    assert kr.get_kernel() == "pallas"  # case-insensitive
    monkeypatch.setenv("KERAS_RELUVIT_KERNEL", "flash")
    with pytest.raises(ValueError, match="KERAS_RELUVIT_KERNEL must be one of"):
        kr.get_kernel()
    kr.set_kernel("generic")  # Python over the environment
    try:
        assert kr.get_kernel() == "generic"
    finally:
        kr.set_kernel(None)
    monkeypatch.delenv("KERAS_RELUVIT_KERNEL")
    assert kr.get_kernel() == "auto"


def test_dispatch_rule_with_a_kernel():
    c = kernels.choose
    assert c("jax", "relu", None, False, False, 197, 197, None, kernel="pallas") == "pallas"
    assert c("jax", "relu", "m", False, False, 197, 197, 64, kernel="pallas") == "pallas"
    assert c("jax", "relu", None, True, False, 197, 197, None, kernel="pallas") == "generic"
    assert c("jax", "relu", None, False, True, 197, 197, None, kernel="pallas") == "generic"
    assert c("jax", "relu", None, False, False, 197, 197, None, sequence_parallel=True,
             kernel="pallas") == "sequence_parallel"
    assert c("torch", "relu", None, False, False, 197, 197, None, kernel="triton") == "triton"
    assert c("torch", "relu", None, False, False, 197, 197, None, fused=True,
             cpu_kernels=False) == "generic"


# --- JAX only: lowering for TPU and CUDA ------------------------------------------
if BACKEND == "jax":

    @pytest.mark.parametrize("d,dtype,alpha,masked,tokens", GRID[1:4],
                             ids=["-".join(map(str, c)) for c in GRID[1:4]])
    @pytest.mark.full_only(REPRESENTATIVE, ids=('64-bfloat16-1.0-False-(197, 197)',))
    def test_kernel_grid_in_the_tpu_layout(monkeypatch, d, dtype, alpha, masked, tokens):
        """Pallas' interpreter runs the CUDA layout by default (the layer's
        (B, T, H, D) arrays in place, masked loads; the interpreter pads
        with NaN, so a read past an array would show); here the TPU one
        ((B, H, T, D) padded to the blocks, plain loads), as Mosaic runs it:
        grid cases, and a general mask with a value dim of its own."""
        from keras_reluvit.kernels import pallas as pa

        padded = []
        pad = pa._padded_inputs
        monkeypatch.setattr(pa, "_padded_inputs", lambda *a: padded.append(1) or pad(*a))
        monkeypatch.setattr(pa, "INTERPRET_MODE", "interpret_padded")
        test_kernel_grid(d, dtype, alpha, masked, tokens)
        mask = np.tril(np.ones((19, 19), bool))[None].repeat(2, 0)
        q, k, v = inputs(2, 19, 19, 2, 16, dv=24, seed=3)
        compare(q, k, v, activation="relu2", seq_len_exponent=1.0, mask=mask)
        assert len(padded) >= 4  # forward and backward of both calls ran padded

    @pytest.mark.parametrize("platform", ["tpu", "cuda"])
    def test_vit_s16_lowers_to_the_kernel_in_every_block(platform):
        """A ViT-S/16 ReLU/L (its shapes; 3 of its 12 blocks, each lowered the
        same) forward and training step (value_and_grad) traced on this CPU
        lower for TPU (Mosaic `tpu_custom_call`) and CUDA (Pallas' Triton
        call): one forward kernel per block, and in the step one forward and
        the backward kernels (two on TPU, one on CUDA) per block."""
        import jax
        import jax.numpy as jnp

        blocks = 3
        model = kr.ViT_S16(attention="relu", num_classes=10, depth=blocks)
        tv = [v.value for v in model.trainable_variables]
        ntv = [v.value for v in model.non_trainable_variables]

        def forward(tv, x):
            return model.stateless_call(tv, ntv, x)[0]

        def loss(tv, x):
            return jnp.mean(jnp.square(forward(tv, x)))

        x = jax.ShapeDtypeStruct((2, 224, 224, 3), jnp.float32)
        call = {"tpu": "tpu_custom_call", "cuda": "__gpu$xla.gpu.triton"}[platform]
        other = {"tpu": "__gpu$xla.gpu.triton", "cuda": "tpu_custom_call"}[platform]
        # CUDA's backward is one kernel (dQ added atomically); TPU's two.
        backward = {"tpu": {"dkdv": blocks, "dq": blocks}, "cuda": {"bwd": blocks}}[platform]
        with kr.use_kernel("pallas"):
            for fn, expected in ((forward, {"fwd": blocks}),
                                 (jax.value_and_grad(loss), {"fwd": blocks, **backward})):
                with jax_lowering_target(platform):
                    text = jax.jit(fn).trace(tv, x).lower(lowering_platforms=(platform,)).as_text()
                calls = [line for line in text.splitlines()
                         if re.search(rf"custom_call @{re.escape(call)}\b|"
                                      rf"call_target_name = \"{re.escape(call)}\"", line)]
                assert len(calls) == sum(expected.values()), (platform, len(calls))
                for kind, n in expected.items():
                    named = [c for c in calls if f"pointwise_attention_{kind}" in c]
                    assert len(named) == n, (platform, kind, len(named))
                assert other not in text and "interpret" not in text
        with kr.use_kernel("generic"):  # a new function: jit caches traces per function
            with jax_lowering_target(platform):
                text = jax.jit(lambda *a: forward(*a)).trace(tv, x).lower(
                    lowering_platforms=(platform,)).as_text()
            assert call not in text

    @pytest.mark.parametrize("d,dtype,tokens,masked,row_bytes", [
        (128, "float32", (197, 197), False, 512), (128, "bfloat16", (150, 300), False, 256),
        (64, "float32", (100, 100), True, 512)])
    @pytest.mark.full_only(REPRESENTATIVE, ids=('128-bfloat16-tokens1-False-256',))
    def test_cuda_block_caps_compute_the_same(monkeypatch, d, dtype, tokens, masked, row_bytes):
        """On CUDA each kernel takes its own capped blocks (`GPU_BLOCKS`, so
        shared memory fits; a general mask counts its tiles) inside token
        counts padded for the traced 128-blocks: run here, interpreted, with
        the CUDA choice forced, the outputs and gradients equal the generic
        path's."""
        from keras_reluvit.kernels import pallas as pa

        chosen = {}
        blocks = pa._blocks

        def as_on_cuda(cfg, mode, kernel, row_bytes):
            chosen[kernel] = blocks(cfg, "triton", kernel, row_bytes)
            return chosen[kernel]

        monkeypatch.setattr(pa, "_blocks", as_on_cuda)
        t, s = tokens
        q, k, v = inputs(1, t, s, 2, d, seed=8)
        mask = None
        if masked:  # a general (B, T, S) mask: each query its own keys
            mask = np.random.default_rng(9).random((1, t, s)) < 0.7
        compare(q, k, v, dtype=dtype, activation="relu", seq_len_exponent=1.0, mask=mask)
        caps = pa.GPU_BLOCKS[row_bytes]
        assert chosen == {"fwd": caps["fwd"], "bwd": caps["bwd"]}, chosen
        assert chosen["fwd"] != (128, 128), chosen

    def test_block_caps_apply_only_on_cuda_and_to_default_blocks():
        from keras_reluvit.kernels import pallas as pa

        cfg = ("relu", 197, 128, 128, 0.125, False)
        assert pa._blocks(cfg, "triton", "fwd", 512) == (64, 32)
        assert pa._blocks(cfg, "triton", "dq", 128) == (128, 128)
        assert pa._blocks(cfg, "triton", "bwd", 2048) == (16, 16)
        assert pa._blocks(cfg, "triton", "bwd", 4096) == (16, 16)  # wider: the last row
        import jax
        import jax.numpy as jnp

        def row(d, dtype=jnp.float32):
            return jax.ShapeDtypeStruct((1, 8, 1, d), dtype)

        general, key = jax.ShapeDtypeStruct((1, 8, 8), bool), jax.ShapeDtypeStruct((1, 1, 8), bool)
        assert pa._row_bytes(row(128), row(128), None) == 512
        assert pa._row_bytes(row(128), row(128), key) == 512
        assert pa._row_bytes(row(128), row(128), general) == 1024  # its int32 tiles
        assert pa._row_bytes(row(64, jnp.bfloat16), row(80, jnp.bfloat16), None) == 160
        assert pa._row_bytes(row(256), row(256), None) == 2048  # above 128: 8 warps, next class
        assert pa._blocks(cfg, "tpu", "fwd", 512) == (128, 128)
        assert pa._blocks(cfg, "interpret", "fwd", 512) == (128, 128)
        assert pa._blocks(("relu", 20, 32, 16, 0.125, False), "triton", "fwd", 512) == (32, 16)
        forced = ("relu", 197, 128, 128, 0.125, True)  # the caller's blocks are kept
        assert pa._blocks(forced, "triton", "fwd", 512) == (128, 128)

    @pytest.mark.full_only(REPRESENTATIVE, ids=('key', 'None'))
    @pytest.mark.parametrize("masked", [None, "key", "general"])
    def test_pallas_deterministic_backward_equals_the_fused_one_and_repeats_bitwise(
            monkeypatch, masked):
        """On CUDA the backward is one kernel that adds dQ atomically
        (5 dots per tile); `deterministic=True` (or XLA's
        `--xla_gpu_deterministic_ops=true`) takes a dK/dV and a dQ kernel,
        no atomics. Both (run here in the CUDA layout, interpreted) equal
        the generic path, each repeats bitwise, and the flag picks the
        kernels. Blocks forced to 16: several query blocks add into each dQ
        row, a last partial block on both axes, odd head and value dims."""
        import jax
        import jax.numpy as jnp

        from keras_reluvit.kernels import pallas as pa

        q, k, v = (jnp.asarray(x) for x in inputs(2, 37, 45, 2, 24, dv=20, seed=3))
        log_scale = jnp.asarray([0.3, -0.2])
        rng = np.random.default_rng(4)
        mask = None if masked is None else jnp.asarray(
            rng.uniform(size=(2, 1 if masked == "key" else 37, 45)) > 0.3)
        cot = jnp.asarray(np.random.default_rng(5).normal(size=(2, 37, 2, 20)), jnp.float32)

        def run(impl, deterministic=None):
            def loss(q, k, v, log_scale):
                factor = jnp.exp(log_scale).reshape(1, 1, 2, 1) / 45.0
                if impl == "generic":
                    out = pointwise_attention(
                        q, k, v, "gelu", seq_len_exponent=0.0, implementation="generic",
                        mask=None if mask is None else jnp.broadcast_to(mask, (2, 37, 45))
                    ) * factor
                else:
                    out = pa.attention(q, k, v, "gelu", factor, mask, block_q=16, block_k=16,
                                       deterministic=deterministic)
                return jnp.sum(out * cot)

            return jax.grad(loss, argnums=(0, 1, 2, 3))(q, k, v, log_scale)

        ref = run("generic")
        names = []
        call = pa._pallas
        monkeypatch.setattr(pa, "_pallas", lambda *a, **kw: names.append(a[7]) or call(*a, **kw))
        for deterministic in (False, True):
            del names[:]
            first, second = run("pallas", deterministic), run("pallas", deterministic)
            assert all(np.array_equal(a, b) for a, b in zip(first, second))
            backward = [n for n in names if not n.endswith("_fwd")]
            assert set(backward) == ({"pointwise_attention_dkdv", "pointwise_attention_dq"}
                                     if deterministic else {"pointwise_attention_bwd"}), names
            for a, b in zip(first, ref):
                np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-5,
                                           atol=2e-5 * max(1.0, float(np.abs(b).max())))
        monkeypatch.setenv("XLA_FLAGS", "--xla_gpu_deterministic_ops=true")
        del names[:]
        run("pallas")
        assert "pointwise_attention_dq" in names, names

    def test_one_trace_lowers_per_platform():
        """The platform is chosen at lowering: one traced function gives the
        Mosaic call for TPU, the Triton call for CUDA and runs (interpreted)
        on this CPU."""
        import jax

        from keras_reluvit.kernels import pallas

        q, k, v = inputs(1, 20, 20, 2, 16)
        with jax_lowering_target("cuda"):  # JAX 0.12 reads the GPU's kind when tracing
            traced = jax.jit(lambda a, b, c: pallas.attention(a, b, c, "relu", 0.05)
                             ).trace(q, k, v)
            assert "tpu_custom_call" in traced.lower(lowering_platforms=("tpu",)).as_text()
            assert "__gpu$xla.gpu.triton" in traced.lower(lowering_platforms=("cuda",)).as_text()
            out = traced.lower(lowering_platforms=("cpu",)).compile()(q, k, v)
        ref = pointwise_attention(q, k, v, implementation="generic")
        np.testing.assert_allclose(np.asarray(out), np.asarray(ref), rtol=1e-5, atol=1e-6)


    def test_float32_dots_follow_jax_matmul_precision_on_cuda(monkeypatch):
        """float32 q / k / v: the CUDA lowering's dots are TF32 by default (as
        XLA's own on a GPU) and full float32 (IEEE) under
        `jax.default_matmul_precision("highest")`; bfloat16 dots are
        bfloat16 either way. Read from the Triton IR Pallas hands XLA (a
        private jax function, as tests/once/test_accelerator_build.py)."""
        import jax
        from helpers.pallas_ir import capture_triton_modules

        from keras_reluvit.kernels import pallas

        modules = capture_triton_modules(monkeypatch.setattr)

        def precisions(dtype, setting=None):
            del modules[:]
            q = jax.ShapeDtypeStruct((1, 64, 2, 64), dtype)
            loss = lambda q, k, v: pallas.attention(q, k, v, "relu").astype("float32").sum()  # noqa
            with jax.default_matmul_precision(setting), jax_lowering_target("cuda"):
                jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2))).trace(q, q, q).lower(
                    lowering_platforms=("cuda",))
            found = [re.findall(r"inputPrecision = (\w+)", m) for m in modules]
            dots = [m.count("tt.dot ") for m in modules]
            return sorted({p for f in found for p in f}), sum(dots)

        assert precisions("float32") == (["tf32"], 7)  # forward 2, backward 5
        # IEEE, Triton's default, is printed without the attribute
        assert precisions("float32", "highest") == ([], 7)
        assert precisions("float32", "tensorfloat32") == (["tf32"], 7)
        assert precisions("bfloat16", "highest") == ([], 7)


# --- PyTorch only: the Triton kernel on strided views; the CPU guard --------------
if BACKEND == "torch":

    def test_triton_reads_strided_views_in_place():
        """q, k, v as the views of one fused qkv output (token stride 3 H D)
        and transposed (B, H, T, D) storage: no copies needed, same result."""
        import torch

        from keras_reluvit.kernels import triton as triton_kernel

        b, t, h, d = 2, 21, 2, 16
        qkv = torch.randn(b, t, 3, h, d)
        q, k, v = qkv.unbind(2)
        assert q.stride(1) == 3 * h * d
        kt = torch.randn(b, h, t, d).transpose(1, 2)
        for key in (k, kt):
            got = triton_kernel.attention(q, key, v, "relu", 1.0 / t)
            ref = keras.ops.convert_to_numpy(pointwise_attention(
                q, key, v, implementation="generic"))
            np.testing.assert_allclose(got.numpy(), ref, rtol=1e-5, atol=1e-6)

    def test_triton_refuses_cpu_tensors_without_the_interpreter(monkeypatch):
        import torch

        from keras_reluvit.kernels import triton as triton_kernel

        monkeypatch.setattr(triton_kernel, "interpreting", lambda: False)
        q = torch.zeros(1, 4, 1, 16)
        with kr.use_kernel("triton"):
            with pytest.raises(ValueError, match="runs on CUDA tensors; these are on 'cpu'.*"
                                                 "TRITON_INTERPRET=1"):
                pointwise_attention(q, q, q)
        with kr.use_kernel("auto"):  # auto never picks it for CPU tensors
            pointwise_attention(q, q, q)

    def test_triton_refuses_head_dims_over_its_limit_for_query_or_value():
        import torch

        from keras_reluvit.kernels import triton as triton_kernel

        limit = triton_kernel.MAX_HEAD_DIM
        small, big = torch.zeros(1, 4, 1, 16), torch.zeros(1, 4, 1, limit + 8)
        for q, v, what in ((big, small, "query/key"), (small, big, "value")):
            with kr.use_kernel("triton"):
                with pytest.raises(ValueError, match=f"the {what} head dim is {limit + 8}"):
                    pointwise_attention(q, q, v)
        out = pointwise_attention(small, small, big)  # auto: the generic path takes it
        assert tuple(out.shape) == (1, 4, 1, limit + 8)

    def test_environment_switch_is_read_per_call(monkeypatch):
        calls = []
        from keras_reluvit.kernels import triton as triton_kernel

        original = triton_kernel.attention
        monkeypatch.setattr(triton_kernel, "attention",
                            lambda *a, **k: calls.append(1) or original(*a, **k))
        q, k, v = inputs(1, 6, 6, 1, 16)
        monkeypatch.setenv("KERAS_RELUVIT_KERNEL", "triton")
        pointwise_attention(q, k, v)
        monkeypatch.setenv("KERAS_RELUVIT_KERNEL", "generic")
        pointwise_attention(q, k, v)
        assert calls == [1]

    @pytest.mark.full_only(REPRESENTATIVE, ids=('key',))
    @pytest.mark.parametrize("masked", [None, "key", "general"])
    def test_triton_deterministic_backward_equals_the_fused_one_and_repeats_bitwise(masked):
        """`torch.use_deterministic_algorithms(True)` takes the two-kernel
        backward (no atomics): it equals the generic path as the fused
        (atomic dQ) backward does, and two runs give bitwise equal
        gradients. Query blocks forced to 16: several blocks add into each
        dQ row, a last partial block on both axes."""
        import torch

        from keras_reluvit.kernels import triton as triton_kernel

        q, k, v = (torch.tensor(x, requires_grad=True) for x in inputs(2, 37, 45, 2, 24, seed=3))
        log_scale = torch.tensor([0.3, -0.2], requires_grad=True)
        rng = np.random.default_rng(4)
        mask = None if masked is None else torch.tensor(
            rng.uniform(size=(2, 1 if masked == "key" else 37, 45)) > 0.3)

        def run(impl, deterministic):
            factor = torch.exp(log_scale).reshape(1, 1, 2, 1) / 45.0
            if impl == "generic":
                out = keras.ops.convert_to_tensor(pointwise_attention(
                    q, k, v, mask=None if mask is None else mask.expand(2, 37, 45),
                    seq_len_exponent=0.0, implementation="generic")) * factor
            else:
                out = triton_kernel.attention(q, k, v, "relu", factor, mask, block_q=16,
                                                 block_k=16, deterministic=deterministic)
            cot = torch.tensor(np.random.default_rng(5).normal(size=tuple(out.shape)),
                               dtype=torch.float32)
            return [out] + list(torch.autograd.grad((out * cot).sum(), [q, k, v, log_scale]))

        ref = run("generic", None)
        for deterministic in (False, True):
            for a, b in zip(run("triton", deterministic), ref):
                np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), rtol=2e-5,
                                           atol=2e-5 * max(1.0, float(b.abs().max())))
        first, second = run("triton", True), run("triton", True)
        assert all(torch.equal(a, b) for a, b in zip(first, second))
        torch.use_deterministic_algorithms(True)
        try:
            calls = []
            original = triton_kernel.backward
            triton_kernel.backward = lambda *a, **kw: calls.append(kw["deterministic"]) or \
                original(*a, **kw)
            triton_kernel.attention(q, k, v, "relu", 0.5, mask).sum().backward()
        finally:
            triton_kernel.backward = original
            torch.use_deterministic_algorithms(False)
        assert calls == [True]

    def test_triton_float32_kernels_compile_for_sm90a_as_launched_without_spills():
        """The float32 (TF32) part of the table of tests/once/
        test_accelerator_build.py (the 16-bit part runs there): compiled for
        sm_90a in a child process, as launched, no register spills, 64-bit
        offsets, the dots per tile. Here, in the PyTorch lane, so that CI's
        two lanes share the compile time."""
        from helpers.triton_table import check

        check("fp32")

    def test_conftest_runs_triton_interpreted():
        assert os.environ.get("TRITON_INTERPRET") == "1"


if KERNEL is None:
    for _name in KERNEL_TESTS:
        del globals()[_name]


def test_softmax_keeps_multiheadattention_flash_choice():
    """Softmax layers leave flash attention to Keras (None: the backend picks,
    e.g. cuDNN for 16-bit inputs on a JAX GPU; True/False as given); a
    pointwise layer refuses `flash_attention=True`, naming the kernel switch."""
    assert kr.PointwiseAttention(2, 8, activation="softmax")._flash_attention is None
    assert kr.PointwiseAttention(2, 8, activation="softmax",
                                 flash_attention=True)._flash_attention is True
    assert kr.PointwiseAttention(2, 8, activation="relu")._flash_attention is False
    with pytest.raises(ValueError, match="selects a softmax kernel.*does not apply to "
                                         "pointwise attention.*KERAS_RELUVIT_KERNEL"):
        kr.PointwiseAttention(2, 8, activation="relu", flash_attention=True)
    x = np.random.default_rng(0).normal(size=(2, 5, 16)).astype("float32")
    mha = keras.layers.MultiHeadAttention(2, 8)
    ours = kr.PointwiseAttention(2, 8, activation="softmax")
    mha(x, x), ours(x, x)
    ours.set_weights(mha.get_weights())
    np.testing.assert_allclose(keras.ops.convert_to_numpy(ours(x, x)),
                               keras.ops.convert_to_numpy(mha(x, x)), rtol=1e-5, atol=1e-6)


def test_auto_picks_the_kernel_on_accelerators(monkeypatch):
    """`auto`: Pallas when JAX's default device is a TPU or CUDA GPU (faked
    here), Triton for CUDA tensors on torch (a stand-in tensor), head dims
    past the Triton kernel's 128 and custom activations generic."""
    import types

    monkeypatch.setattr(kernels, "jax_accelerator", lambda: "tpu")
    q = np.zeros((1, 4, 1, 64), "float32")
    assert kernels.fused_kernel("auto", "jax", q, "relu") == "pallas"
    assert kernels.fused_kernel("auto", "jax", q, None) is None
    assert kernels.fused_kernel("generic", "jax", q, "relu") is None
    assert kernels.fused_kernel("auto", "tensorflow", q, "relu") is None
    monkeypatch.setattr(kernels, "jax_accelerator", lambda: None)
    assert kernels.fused_kernel("auto", "jax", q, "relu") is None
    if BACKEND == "torch":
        cuda = types.SimpleNamespace(device=types.SimpleNamespace(type="cuda"), shape=q.shape)
        assert kernels.fused_kernel("auto", "torch", cuda, "gelu") == "triton"
        wide = types.SimpleNamespace(device=cuda.device, shape=(1, 4, 1, 256))
        assert kernels.fused_kernel("auto", "torch", wide, "relu") is None
