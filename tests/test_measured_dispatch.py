"""The measured `auto` dispatch (kernels.measured), with fake kernels on a CPU.

On JAX the fake stands in for the Pallas kernel (JAX's default device is
faked as a CUDA GPU), on PyTorch for the Triton kernel (the candidate is
forced, as CPU tensors have none): a kernel that raises, one that is wrong
forward or only in its gradients, one that is slower and one that is faster
than the path the dispatch takes without it. The real Pallas kernel goes
through the same probe in its interpreter. TensorFlow has no fused kernel:
`auto` measures nothing there.
"""

import dataclasses
import json
import re
import time
import warnings

import keras
import numpy as np
import pytest
from conftest import backend_name
from conftest import grads

import keras_reluvit as kr
from keras_reluvit import kernels
from keras_reluvit.kernels import measured

BACKEND = backend_name()
KERNEL = {"jax": "pallas", "torch": "triton"}.get(BACKEND)


@pytest.fixture(autouse=True)
def fresh_decisions(monkeypatch):
    measured.clear()
    monkeypatch.delenv(measured.CACHE_ENV, raising=False)
    monkeypatch.delenv(kernels.KERNEL_ENV, raising=False)
    if BACKEND == "jax":
        monkeypatch.setattr(kernels, "jax_accelerator", lambda: "cuda")
    elif BACKEND == "torch":
        monkeypatch.setattr(kernels, "fused_kernel",
                            lambda switch, *a, **k: None if switch == "generic" else "triton")
    yield
    measured.clear()


def inputs(b=2, t=24, nh=2, d=8, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.normal(size=(b, t, nh, d)).astype("float32") for _ in range(3)]


def attention(q, k, v, activation="relu", **kw):
    return kr.pointwise_attention(q, k, v, activation=activation, **kw)


def numpy(x):
    return np.asarray(keras.ops.convert_to_numpy(x), np.float64)


def naive(q, k, v, act=lambda s: np.maximum(s, 0)):
    s = np.einsum("bthd,bshd->bhts", q, k) / np.sqrt(q.shape[-1])
    return np.einsum("bhts,bshd->bthd", act(s), v) / k.shape[1]


# A stand-in's sleep: long beside the tiny probe's compute even when the CI's
# other lane keeps both cores busy (10 ms was not: a descheduled computation
# took longer than a sleeping one, 2026-12-02).
PAUSE = 0.05


def pause(seconds=PAUSE):
    """Sleeps when the computation runs (under `jax.jit` too, not at trace time)."""
    if BACKEND == "jax":
        import jax

        jax.debug.callback(lambda: time.sleep(seconds))
    else:
        time.sleep(seconds)


class Fake:
    """A stand-in kernel: the generic path, changed by `how`; counts calls."""

    def __init__(self, how):
        self.how, self.calls = how, 0
        self.generic = kernels.PATHS["generic"]

    def __call__(self, c):
        self.calls += 1
        if self.how == "raises":
            raise RuntimeError("fake lowering failure: no such instruction")
        out, _ = self.generic(c)
        if self.how == "wrong":
            out = out * 1.5
        elif self.how == "wrong_gradient":  # equal values, gradients 1.5x
            out = out + 0.5 * (out - keras.ops.stop_gradient(out))
        elif self.how.startswith("scaled:"):  # off by a chosen relative error
            out = out * float(self.how.split(":")[1])
        elif self.how == "ignores_mask":  # right wherever the mask keeps every key
            out, _ = self.generic(dataclasses.replace(c, mask=None, kernel_mask=None))
        elif self.how == "slow":
            pause()
        elif self.how == "slower":
            pause(3 * PAUSE)
        return out, None


def install(monkeypatch, how):
    fake = Fake(how)
    monkeypatch.setitem(kernels.PATHS, KERNEL, fake)
    return fake


@pytest.mark.parametrize("how", ["raises", "wrong"])
def test_a_failing_or_wrong_kernel_warns_once_and_the_fallback_computes(monkeypatch, how):
    fake = install(monkeypatch, how)
    q, k, v = inputs()
    with pytest.warns(UserWarning, match=f"fused {KERNEL} kernel is not used") as caught:
        out = numpy(attention(q, k, v))
    text = str(caught[0].message)
    assert ("fake lowering failure" in text) if how == "raises" else ("differs from" in text)
    np.testing.assert_allclose(out, naive(q, k, v), rtol=1e-5, atol=1e-6)
    (decision,) = kr.kernels.report()
    assert decision.reason == ("error" if how == "raises" else "mismatch")
    assert decision.path == decision.fallback != KERNEL
    assert how != "wrong" or abs(decision.max_error - 0.5) < 1e-3
    probes = fake.calls
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # no second warning, no second probe
        np.testing.assert_allclose(numpy(attention(q, k, v)), out, rtol=1e-6)
    assert fake.calls == probes and len(kr.kernels.report()) == 1


@pytest.mark.parametrize("times,caught", [(2.0, True), (0.2, False)])
def test_the_check_draws_its_line_at_the_tolerance(monkeypatch, times, caught):
    """A kernel off by twice the float32 tolerance is refused, one off by a
    fifth of it is accepted; the error recorded is the one made. The
    tolerance is docs/kernels.md's (5e-3 for float32), not read from the code."""
    tolerance = 5e-3
    install(monkeypatch, f"scaled:{1 + times * tolerance}")
    q, k, v = inputs()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        attention(q, k, v)
    (decision,) = kr.kernels.report()
    assert (decision.reason == "mismatch") == caught, decision
    assert abs(decision.max_error - times * tolerance) < 0.05 * times * tolerance


def test_a_kernel_wrong_only_under_the_mask_is_caught(monkeypatch):
    """A kernel that ignores the mask is right on unmasked calls and must
    be refused on masked ones (the probe carries the call's kind of mask)."""
    install(monkeypatch, "ignores_mask")
    q, k, v = inputs()
    attention(q, k, v)
    (unmasked,) = kr.kernels.report()
    assert unmasked.reason in ("faster", "slower") and unmasked.max_error < 1e-5
    mask = np.ones((2, 24, 24), bool)
    mask[:, :, 17:] = False  # the last 7 keys of every row
    with pytest.warns(UserWarning, match="differs from"):
        out = numpy(attention(q, k, v, mask=mask))
    masked = [d for d in kr.kernels.report() if d is not unmasked]
    assert len(masked) == 1 and masked[0].reason == "mismatch", masked
    want = naive(q[:, :, :, :], k[:, :17], v[:, :17])  # masked keys left out, L = 17
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)


def test_a_kernel_wrong_only_in_its_gradients_is_caught_when_differentiated(monkeypatch):
    install(monkeypatch, "wrong_gradient")
    q, k, v = inputs()
    out = numpy(attention(q, k, v))  # forward only: it matches, and it is timed
    (forward,) = kr.kernels.report()
    assert not forward.differentiated and forward.reason in ("faster", "slower")
    assert forward.max_error < 1e-5
    with pytest.warns(UserWarning, match="differs from"):
        (gq, gk, gv), _ = grads(lambda a, b, c: keras.ops.sum(attention(a, b, c) ** 2), [],
                                [q, k, v])
    backward = [d for d in kr.kernels.report() if d.differentiated]
    assert len(backward) == 1 and backward[0].reason == "mismatch"
    assert abs(backward[0].max_error - 0.5) < 1e-3
    # the gradients are the fallback's: d/dq sum(o^2) by finite differences
    eps, i = 1e-3, (0, 3, 1, 2)
    qp, qm = q.copy(), q.copy()
    qp[i] += eps
    qm[i] -= eps
    fd = ((naive(qp, k, v) ** 2).sum() - (naive(qm, k, v) ** 2).sum()) / (2 * eps)
    assert abs(gq[i] - fd) < 2e-3 * max(1.0, abs(fd))
    assert out.shape == q.shape


def test_a_slower_kernel_is_not_used_and_a_faster_one_is(monkeypatch):
    slow = install(monkeypatch, "slow")
    q, k, v = inputs()
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # slower is no warning: report() says it
        out = numpy(attention(q, k, v))
    (decision,) = kr.kernels.report()
    assert decision.reason == "slower" and decision.path == decision.fallback
    assert decision.kernel_ms > 1e3 * PAUSE and decision.kernel_ms > decision.fallback_ms
    probes = slow.calls
    attention(q, k, v)
    assert slow.calls == probes  # the calls take the fallback
    assert "slower" in str(kr.kernels.report())

    measured.clear()
    fast = install(monkeypatch, "as_generic")
    generic = kernels.PATHS["generic"]

    def slow_generic(c):
        pause()
        return generic(c)

    # the fallback (generic, or torch's CPU paths) made slow for the timing
    for name in ("generic", "torch_fused", "torch_tiled"):
        monkeypatch.setitem(kernels.PATHS, name, slow_generic)
    got = numpy(attention(q, k, v))
    (decision,) = kr.kernels.report()
    assert decision.reason == "faster" and decision.path == KERNEL
    assert decision.kernel_ms < decision.fallback_ms
    probes = fast.calls
    np.testing.assert_allclose(numpy(attention(q, k, v)), got, rtol=1e-6)
    assert fast.calls == probes + 1  # the call itself ran the kernel
    np.testing.assert_allclose(got, out, rtol=1e-5, atol=1e-6)


class Variants(Fake):
    """A stand-in whose backward variants differ: `hows` maps the option
    `deterministic` (None: the kernel's default) to a `Fake` behaviour;
    keeps the options of every call."""

    def __init__(self, hows):
        super().__init__(None)
        self.hows, self.seen = hows, []

    def __call__(self, c):
        options = dict(c.options or {})
        self.seen.append(options)
        self.how = self.hows[options.get("deterministic")]
        return super().__call__(c)


def loss_grads(q, k, v):
    return grads(lambda a, b, c: keras.ops.sum(attention(a, b, c) ** 2), [], [q, k, v])[0]


@pytest.mark.parametrize("faster", ["deterministic", "fused"])
def test_training_times_both_backward_passes_and_keeps_the_faster(monkeypatch, tmp_path,
                                                                  faster):
    """Differentiated calls time the fused backward (atomic dQ) and the
    deterministic one against each other: the faster variant's options go
    with the calls. Forward-only calls measure the kernel's defaults."""
    slow = "fused" if faster == "deterministic" else "deterministic"
    fake = Variants({True: "slower" if slow == "deterministic" else "as_generic",
                     False: "slower" if slow == "fused" else "as_generic", None: "as_generic"})
    monkeypatch.setitem(kernels.PATHS, KERNEL, fake)
    generic = kernels.PATHS["generic"]

    def slower_generic(c):  # the fallback: a pause behind the fast variant, 2 before the slow
        pause()
        return generic(c)

    for name in ("generic", "torch_fused", "torch_tiled"):
        monkeypatch.setitem(kernels.PATHS, name, slower_generic)
    monkeypatch.setenv(measured.CACHE_ENV, str(tmp_path / "decisions.json"))
    q, k, v = inputs()
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        got = loss_grads(q, k, v)
    (decision,) = kr.kernels.report()
    assert decision.differentiated and decision.path == KERNEL and decision.reason == "faster"
    assert decision.variant == faster and "variants[fused,deterministic]" in decision.signature
    assert f"{slow} " in decision.detail and f"{faster} " in decision.detail
    assert {o.get("deterministic") for o in fake.seen} == {True, False}
    assert f"{KERNEL} ({faster})" in str(kr.kernels.report())
    fake.seen.clear()
    again = loss_grads(q, k, v)  # decided: the call runs the faster variant only
    assert fake.seen and all(o == {"deterministic": faster == "deterministic"} for o in fake.seen)
    for a, b in zip(again, got):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    eps, i = 1e-3, (1, 5, 0, 3)
    qp, qm = q.copy(), q.copy()
    qp[i] += eps
    qm[i] -= eps
    fd = ((naive(qp, k, v) ** 2).sum() - (naive(qm, k, v) ** 2).sum()) / (2 * eps)
    assert abs(got[0][i] - fd) < 2e-3 * max(1.0, abs(fd))

    measured.clear()  # a new process: the variant comes back from the disk cache
    fake.seen.clear()
    loss_grads(q, k, v)
    (decision,) = kr.kernels.report()
    assert decision.source == "disk" and decision.variant == faster
    assert fake.seen and all(o == {"deterministic": faster == "deterministic"} for o in fake.seen)

    monkeypatch.delenv(measured.CACHE_ENV)
    measured.clear()
    fake.seen.clear()
    attention(q, k, v)  # forward only: no variants
    (decision,) = kr.kernels.report()
    assert not decision.differentiated and decision.variant is None
    assert "variants" not in decision.signature and all(o == {} for o in fake.seen)


def test_a_failing_backward_variant_is_left_out_without_a_warning(monkeypatch):
    fake = Variants({True: "as_generic", False: "wrong_gradient", None: "as_generic"})
    monkeypatch.setitem(kernels.PATHS, KERNEL, fake)
    q, k, v = inputs()
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        loss_grads(q, k, v)
    (decision,) = kr.kernels.report()
    assert decision.reason in ("faster", "slower") and decision.max_error < 1e-5
    assert "fused: mismatch, its probe differs" in decision.detail
    assert decision.variant == ("deterministic" if decision.path == KERNEL else None)


def test_asking_for_determinism_leaves_the_backward_to_the_kernel(monkeypatch):
    """Under the framework's deterministic switch the fused backward is
    never a candidate: the kernel's own (deterministic) choice is measured."""
    fake = Variants({True: "as_generic", False: "as_generic", None: "as_generic"})
    monkeypatch.setitem(kernels.PATHS, KERNEL, fake)
    if BACKEND == "jax":
        monkeypatch.setenv("XLA_FLAGS", "--xla_gpu_deterministic_ops=true")
    else:
        import torch

        monkeypatch.setattr(torch, "are_deterministic_algorithms_enabled", lambda: True)
    assert kernels.backward_variants(KERNEL) is None
    loss_grads(*inputs())
    (decision,) = kr.kernels.report()
    assert decision.differentiated and decision.variant is None
    assert "variants" not in decision.signature and all(o == {} for o in fake.seen)


def test_forced_kernels_are_not_measured(monkeypatch):
    fake = install(monkeypatch, "wrong")
    q, k, v = inputs()
    with kr.use_kernel(KERNEL):
        out = numpy(attention(q, k, v))
    np.testing.assert_allclose(out, 1.5 * naive(q, k, v), rtol=1e-5, atol=1e-6)
    assert fake.calls == 1 and len(kr.kernels.report()) == 0
    with kr.use_kernel("generic"):
        attention(q, k, v)
    assert fake.calls == 1 and len(kr.kernels.report()) == 0


def test_decisions_persist_on_disk_keyed_by_versions_and_signature(monkeypatch, tmp_path):
    path = tmp_path / "decisions.json"
    monkeypatch.setenv(measured.CACHE_ENV, str(path))
    fake = install(monkeypatch, "wrong")
    q, k, v = inputs()
    with pytest.warns(UserWarning):
        attention(q, k, v)
    stored = json.loads(path.read_text())
    (key,) = stored
    assert "keras-reluvit" in key and keras.__version__ in key and "q(2, 24, 2, 8)" in key
    assert stored[key]["reason"] == "mismatch"
    measured.clear()  # a new process, as far as decisions go
    probes = fake.calls
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        out = numpy(attention(q, k, v))
    assert fake.calls == probes  # read, not measured
    (decision,) = kr.kernels.report()
    assert decision.source == "disk" and decision.reason == "mismatch"
    np.testing.assert_allclose(out, naive(q, k, v), rtol=1e-5, atol=1e-6)
    q2, k2, v2 = inputs(t=16)  # another signature: measured, added
    with pytest.warns(UserWarning):
        attention(q2, k2, v2)
    assert len(json.loads(path.read_text())) == 2
    path.write_text("{ not json")
    measured.clear()
    with pytest.warns(UserWarning) as caught:
        attention(q, k, v)
    messages = " ".join(str(w.message) for w in caught)
    assert "could not be read" in messages and "differs from" in messages  # measured again


def test_probes_take_the_signature_of_the_call_and_bound_their_batch(monkeypatch):
    fake, seen = Fake("slow"), []

    def spy(c):
        seen.append((tuple(c.query.shape), None if c.kernel_mask is None
                     else tuple(c.kernel_mask.shape), type(c.factor).__name__))
        return fake(c)

    monkeypatch.setitem(kernels.PATHS, KERNEL, spy)
    monkeypatch.setattr(measured, "PROBE_SCORES", 2 * 24 * 24 * 2)
    q, k, v = inputs(b=5)
    mask = np.random.default_rng(1).random((5, 1, 24)) < 0.7
    attention(q, k, v, mask=mask)
    (decision,) = kr.kernels.report()
    assert decision.probe_batch == 2 and "mask(5, 1, 24)" in decision.signature
    assert seen[0][:2] == ((2, 24, 2, 8), (2, 1, 24)) and seen[0][2] != "float"
    assert "factor('array'" in decision.signature


def test_under_jit_and_grad_the_decision_is_made_at_trace_time(monkeypatch):
    import jax

    fake = install(monkeypatch, "slow")
    q, k, v = inputs()
    f = jax.jit(lambda q: kr.pointwise_attention(q, k, v, activation="gelu"))
    g = jax.jit(jax.grad(lambda q: kr.pointwise_attention(q, k, v, activation="gelu").sum()))
    f(q), g(q)
    kinds = sorted(d.differentiated for d in kr.kernels.report())
    assert kinds == [False, True] and all(d.reason == "slower" for d in kr.kernels.report())
    probes = fake.calls
    f(q + 1), g(q + 1)  # traced already: nothing measured again
    assert fake.calls == probes and len(kr.kernels.report()) == 2


def test_the_real_pallas_kernel_passes_its_probe_in_the_interpreter():
    """The Pallas kernel itself (Pallas' interpreter on a CPU), forward and
    both backward passes, masked: each matches XLA's path and is slower here."""
    import jax

    q, k, v = inputs(t=40)
    mask = np.random.default_rng(2).random((2, 1, 40)) < 0.8
    loss = lambda q: kr.pointwise_attention(q, k, v, activation="relu", mask=mask).sum()  # noqa
    jax.jit(jax.grad(loss))(q)
    (decision,) = kr.kernels.report()
    assert decision.differentiated and decision.reason == "slower"
    assert decision.max_error < 1e-5
    # both variants ran and passed: each has a time, neither a failure
    assert re.fullmatch(r"fused \S+ ms; deterministic \S+ ms", decision.detail), decision.detail


def test_tensorflow_auto_measures_nothing():
    q, k, v = inputs()
    np.testing.assert_allclose(numpy(attention(q, k, v)), naive(q, k, v), rtol=1e-5, atol=1e-6)
    assert kr.kernels.report() == [] and "No fused-kernel decision" in str(kr.kernels.report())


# Each backend collects what applies to it (deselected elsewhere, never skipped):
# the fakes where there is a fused kernel (JAX, torch), JAX's tracing and
# Pallas' interpreter on JAX, and TensorFlow's "no kernel, nothing measured".
_ONLY = {"test_under_jit_and_grad_the_decision_is_made_at_trace_time": "jax",
         "test_the_real_pallas_kernel_passes_its_probe_in_the_interpreter": "jax",
         "test_tensorflow_auto_measures_nothing": "tensorflow"}
for _name in [n for n in list(globals()) if n.startswith("test_")]:
    if _ONLY.get(_name, BACKEND if KERNEL else None) != BACKEND:
        del globals()[_name]
