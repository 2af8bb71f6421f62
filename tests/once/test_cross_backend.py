"""Weights saved under one backend load under the others with the same logits.

Each backend runs in its own subprocess (a Python process holds one Keras
backend). Every backend saves a `.weights.h5` and a `.keras` file; every
other backend loads both and compares logits (max abs diff <= 1e-4, float32).
"""

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from conftest import subprocess_env

BACKENDS = ("jax", "tensorflow", "torch")
CONFIG = dict(variant="Ti/8", width=32, depth=2, num_heads=2, mlp_dim=64, image_size=32,
              num_classes=7, pool="map", attention="relu_learned", qk_norm=True)

# One child process does a job: {"save": dir, "load": [dirs], "quantize": [flags]}
# (each part optional, in that order); it prints {"load": ..., "quantize": ...}.
JOB = textwrap.dedent("""
    import json, os, sys, numpy as np, keras, keras_reluvit as kr
    config, job, results = json.loads(sys.argv[1]), json.loads(sys.argv[2]), {}
    if job.get("save"):
        out = job["save"]
        keras.utils.set_random_seed(0)
        model = kr.ViT(**config)
        rng = np.random.default_rng(0)
        for v in model.weights:   # make every weight non-trivial (head is zero-init)
            v.assign(rng.normal(0, 0.3, v.shape).astype("float32") + ("gamma" in v.path))
        x = rng.uniform(-1, 1, (3, 32, 32, 3)).astype("float32")
        np.save(out + "/x.npy", x)
        np.save(out + "/logits.npy", keras.ops.convert_to_numpy(model(x)))
        model.save_weights(out + "/m.weights.h5")
        model.save(out + "/m.keras")
    for src in job.get("load", []):
        x, ref = np.load(src + "/x.npy"), np.load(src + "/logits.npy")
        model = kr.ViT(**config)
        model.load_weights(src + "/m.weights.h5")
        a = np.abs(keras.ops.convert_to_numpy(model(x)) - ref).max()
        loaded = keras.saving.load_model(src + "/m.keras")
        b = np.abs(keras.ops.convert_to_numpy(loaded(x)) - ref).max()
        results.setdefault("load", {})[src] = {"h5": float(a), "keras": float(b),
                                               "scale": float(np.abs(ref).max())}
    if job.get("quantize"):
        import gc   # quantize's gc.collect() per dropped kernel scans only what follows
        gc.collect(), gc.freeze()
        config = dict(config, **job["quantize_config"])
        rng = np.random.default_rng(0)
        x = rng.uniform(-1, 1, (4, 32, 32, 3)).astype("float32")
        for mode in ("int8", "float8", "int4"):
            for fast in job["quantize"]:  # KERAS_RELUVIT_TORCH_FAST (PyTorch's switch)
                os.environ["KERAS_RELUVIT_TORCH_FAST"] = fast
                model = kr.ViT(**config)
                w = np.random.default_rng(1)   # the same weights on every backend
                for v in model.weights:
                    v.assign(w.normal(0, 0.3, v.shape).astype("float32") + ("gamma" in v.path))
                ref = keras.ops.convert_to_numpy(model(x))
                model.quantize(mode)
                got = keras.ops.convert_to_numpy(model(x))
                results.setdefault("quantize", {})[mode + "/" + fast] = dict(
                    error=float(np.abs(got - ref).max() / np.abs(ref).max()),
                    logits=got.tolist(), scale=float(np.abs(ref).max()))
    print(json.dumps(results))
""")
QUANTIZE_CONFIG = dict(attention="relu", pool="gap", num_classes=5)


def run(backend, job):
    proc = subprocess.run([sys.executable, "-c", JOB, json.dumps(CONFIG), json.dumps(job)],
                          env=subprocess_env(backend), capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, f"{backend} failed:\n{proc.stderr[-3000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    """Five processes instead of one per save and per load (each costs a
    backend's start): each backend saves once and loads all three backends'
    files; JAX and PyTorch also quantize (PyTorch with its fast paths on and off).
    Returns (the save folders, {(src, dst): diffs}, {backend: quantized})."""
    saved = {b: tmp_path_factory.mktemp(f"saved_{b}") for b in BACKENDS}
    d = {b: str(saved[b]) for b in BACKENDS}
    quantize = dict(quantize_config=QUANTIZE_CONFIG)
    plan = [("jax", dict(save=d["jax"], quantize=["1"], **quantize)),
            ("tensorflow", dict(save=d["tensorflow"], load=[d["jax"], d["tensorflow"]])),
            ("torch", dict(save=d["torch"], load=list(d.values()), quantize=["1", "0"],
                           **quantize)),
            ("jax", dict(load=list(d.values()))),
            ("tensorflow", dict(load=[d["torch"]]))]
    loaded, quantized = {}, {}
    for backend, job in plan:
        result = run(backend, job)
        for src, diffs in result.get("load", {}).items():
            loaded[next(b for b in BACKENDS if d[b] == src), backend] = diffs
        if "quantize" in result:
            quantized[backend] = result["quantize"]
    assert len(loaded) == 9, sorted(loaded)
    return saved, loaded, quantized


@pytest.mark.parametrize("src", BACKENDS)
@pytest.mark.parametrize("dst", BACKENDS)
def test_weights_and_keras_files_port_across_backends(jobs, src, dst):
    result = jobs[1][(src, dst)]
    assert result["scale"] > 0.1  # logits are not trivially zero
    assert result["h5"] <= 1e-4, result
    assert result["keras"] <= 1e-4, result


def test_same_weights_give_same_logits_on_every_backend(jobs):
    """The three saving backends computed the same logits from the same
    (NumPy-generated) weights: the forward pass agrees across backends."""
    logits = [np.load(jobs[0][b] / "logits.npy") for b in BACKENDS]
    for other in logits[1:]:
        np.testing.assert_allclose(other, logits[0], atol=1e-4)


# Quantized logits, PyTorch vs JAX, as a share of the logit scale: the same
# weights quantized the same way, activations rounded by each backend's
# float arithmetic. Measured on 2026-12-03: 2e-7 (int8), 0 (float8), 2.2e-7
# (int4); PyTorch's fast paths on vs off: 0. (The quantization errors
# themselves: 2.0 %, 6.6 %, 8.9 %.)
QUANTIZED_ACROSS_BACKENDS = {"int8": 1e-5, "float8": 1e-5, "int4": 1e-5}


def test_quantized_logits_error_equals_across_backends_and_fast_paths(jobs):
    """`model.quantize(mode)` of one model (NumPy weights) on JAX and on
    PyTorch with our fast paths on (default) and off, for int8, float8 and
    int4: PyTorch's quantized logits are the same with and without the fast
    paths (they step aside for quantized layers: equal to 1e-6 of the logit
    scale) and JAX's up to float rounding (QUANTIZED_ACROSS_BACKENDS); the
    relative error against the float model is Keras' own quantization error,
    within 1.5x of JAX's both ways and not zero."""
    out = jobs[2]
    for mode in ("int8", "float8", "int4"):
        on, off, jax_ = out["torch"][mode + "/1"], out["torch"][mode + "/0"], out["jax"][mode + "/1"]
        scale = jax_["scale"]
        np.testing.assert_allclose(on["logits"], off["logits"], rtol=0, atol=1e-6 * scale)
        np.testing.assert_allclose(on["logits"], jax_["logits"], rtol=0,
                                   atol=QUANTIZED_ACROSS_BACKENDS[mode] * scale)
        assert jax_["error"] > 1e-3, (mode, jax_["error"])  # quantization changed the logits
        assert jax_["error"] / 1.5 <= on["error"] <= 1.5 * jax_["error"], (mode, out)
