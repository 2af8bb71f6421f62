"""keras.distribution layouts: rule coverage for every builder (any
backend), and end to end on JAX with 8 virtual CPU devices (subprocess)."""

import json
import math
import os
import subprocess
import sys

import keras
import pytest
from conftest import subprocess_env

import keras_reluvit as kr

MESH = keras.distribution.DeviceMesh((2, 4), ["batch", "model"], [f"cpu:{i}" for i in range(8)])

# The child-process scripts these tests run.
HELPERS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "helpers")


def test_every_large_kernel_of_every_builder_has_a_sharding_rule():
    layouts = {s: kr.distribution.layout_map(MESH, s) for s in ("fsdp", "tensor")}
    for name, builder in kr.BUILDERS.items():
        # One block: the blocks of a variant are alike (same paths but the
        # index, same shapes), and building 32 of ViT-H/14's costs ~9 s.
        with keras.StatelessScope():
            model = builder(pool="map", representation_size=256, attention="relu_gated",
                            depth=1)
        for v in model.weights:
            nbytes = 4 * math.prod(v.shape)
            for strategy, lm in layouts.items():
                layout = lm[v.path]
                if v.path.endswith("kernel") and nbytes > 2**20:
                    assert layout is not None, f"{name} {strategy}: {v.path} ({nbytes} B) has no rule"
                    assert any(a is not None for a in layout.axes), f"{name} {strategy}: {v.path}"
                if layout is not None:
                    assert len(layout.axes) == len(v.shape), (v.path, layout.axes, v.shape)


def test_data_strategy_replicates_everything():
    layouts = kr.distribution.layout_map(MESH, "data")
    assert all(all(a is None for a in layouts[k].axes) for k in layouts)


def test_bad_strategy_and_mesh_names():
    with pytest.raises(ValueError, match="Unknown strategy"):
        kr.distribution.layout_map(MESH, "pipeline")
    mesh = keras.distribution.DeviceMesh((8,), ["data"], [f"cpu:{i}" for i in range(8)])
    with pytest.raises(ValueError, match="needs a mesh axis named 'model'"):
        kr.distribution.layout_map(mesh, "tensor")


@pytest.fixture(scope="module")
def jax_runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("strategies")
    script = os.path.join(HELPERS, "dist_check.py")
    proc = subprocess.run([sys.executable, script, "data,fsdp,tensor", str(out)],
                          env=subprocess_env("jax"), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


EXPECTED = {
    "fsdp": {
        "block_00/attention/query/kernel": ["batch", None, None],
        "block_01/attention/attention_output/kernel": [None, None, "batch"],
        "block_00/mlp/fc1/kernel": [None, "batch"],
        "block_00/mlp/fc2/kernel": ["batch", None],
        "embedding/kernel": [None, None, None, "batch"],
        "pos_embedding/embedding": [None, None, "batch"],
        "map_head/attention/value/kernel": ["batch", None, None],
        "head/kernel": ["batch", None],
        "block_00/norm1/gamma": [None],
    },
    "tensor": {
        "block_00/attention/query/kernel": [None, "model", None],
        "block_00/attention/key/bias": ["model", None],
        "block_01/attention/attention_output/kernel": ["model", None, None],
        "block_00/mlp/fc1/kernel": [None, "model"],
        "block_00/mlp/fc1/bias": ["model"],
        "block_00/mlp/fc2/kernel": ["model", None],
        "head/kernel": ["model", None],
        "embedding/kernel": [None, None, None, "model"],
        "block_00/attention/query_norm/gamma": [None],
    },
}


@pytest.mark.parametrize("strategy", ["data", "fsdp", "tensor"])
def test_jax_mesh_shardings_losses_and_checkpoint(jax_runs, strategy):
    r = jax_runs[strategy]
    assert r["jax_devices"] == 8
    for path, spec in EXPECTED.get(strategy, {}).items():
        assert r["specs"][path] == spec, (path, r["specs"][path])
    if strategy == "data":
        assert all(all(a is None for a in s) for s in r["specs"].values())
    assert all(n == 8 for n in r["devices"].values())  # every variable lives on the mesh
    for a, b in zip(r["losses"], r["reference"]):
        assert a == pytest.approx(b, rel=1e-4)
    assert r["losses"][-1] != r["losses"][0]
    assert r["logits_diff"] <= 1e-4
    if strategy == "tensor":
        msg = r["bad_error"] or ""
        assert "attention/query/kernel" in msg and "'model'" in msg and "not divisible" in msg


def test_tensorflow_mirrored_strategy_recipe_matches_one_device():
    script = os.path.join(HELPERS, "mirrored_check.py")
    proc = subprocess.run([sys.executable, script], env=subprocess_env("tensorflow"),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    assert r["replicas"] == 2
    assert len(r["single"][1]) == 6  # 3 steps' losses and accuracies
    # an active clip of each kind: DataParallelModel clips the all-reduced gradient;
    # a clip that never bites: the clip path's step is the plain one (its all-reduce
    # averaged, not summed)
    for kind in ("", "_clipped", "_clipnorm", "_clipvalue", "_loss_scaled", "_unbitten"):
        for a, b in zip(r[f"mirrored{kind}"], r[f"single{kind}"]):
            assert a == pytest.approx(b, rel=1e-4), kind
        if kind not in ("", "_unbitten"):
            assert r[f"single{kind}"] != r["single"], kind  # the clip is active
    assert "gradient_accumulation_steps" in r["accumulated_error"]  # (Keras' merge_call fails)
    # Keras 3.15's own train function clips each replica's gradient: another update
    assert r["per_replica"][0][0] != pytest.approx(r["single_clipped"][0][0], rel=1e-3)


@pytest.mark.full_only(
    "The CLI's 2-D mesh on 8 devices in one process (~45 s): the 2-D meshes' shardings, "
    "losses and checkpoints run through the API in test_jax_mesh_shardings_losses_and_checkpoint; "
    "the CLI's --sharding fsdp trains, records its distribution in config.json and resumes in "
    "test_multihost's killed FSDP cluster, whose one-process reference passes a 1-D --mesh; "
    "the CLI's 2-D --mesh is parsed only in full runs.")
def test_cli_train_with_a_mesh_on_eight_jax_devices(tmp_path, digits_built):
    env = subprocess_env("jax")
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    code = ("import sys; from keras_reluvit import cli; sys.exit(cli.main(sys.argv[1:]))")
    # batch 256: 5 steps (the 2-D mesh's layout and the run's artefacts, not its training)
    proc = subprocess.run([sys.executable, "-c", code, "train", "--epochs", "1", "--no-export",
                           "--batch-size", "256",
                           "--mesh", "batch=2,model=4", "--sharding", "fsdp", "--quiet",
                           "--data-dir", str(digits_built), "--output", str(tmp_path / "run")],
                          env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["optimizer_steps"] > 0 and "accuracy" in metrics["final"]
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["distribution"] == {"type": "ViTModelParallel",
                                      "mesh": {"batch": 2, "model": 4},
                                      "strategy": "fsdp", "sequence_axis": None}


def run_on_eight_devices(script):
    """A check script of tests/helpers/ on 8 virtual JAX CPU devices, in a
    child process; its last line of output, as JSON."""
    env = subprocess_env("jax")
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    proc = subprocess.run([sys.executable, os.path.join(HELPERS, script)],
                          env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_pallas_kernel_runs_per_shard_under_a_distribution():
    """XLA cannot split the kernel's custom call; under DataParallel and a
    tensor-parallel layout each device runs the Pallas kernel on its own
    batch (and head) shard, with the one-device numbers."""
    r = run_on_eight_devices("pallas_dist_check.py")
    assert r["devices"] == 8
    local = {"data_parallel": [[1, 37, 4, 16]],     # batch 8 over 8 devices
             "tensor_parallel": [[4, 37, 1, 16]]}   # batch over 2, 4 heads over 4
    for name, c in r["cases"].items():
        assert c["kernel_shapes"] == local[name], (name, c)
        assert c["forward"] <= 1e-5 and c["grad"] <= 1e-5, (name, c)
    assert r["cases"]["tensor_parallel"]["out_sharding"] == "P('batch', None, 'model')"
    assert r["vit"]["kernel_shapes"] == [[1, 16, 2, 16]] and r["vit"]["logits"] <= 1e-5, r["vit"]


def test_jax_sequence_parallel_attention_equals_dense_on_eight_devices():
    """Tokens sharded over a `seq` mesh axis: partial sums over each device's
    keys combined by one reduce-scatter equal the dense attention, forward
    and gradient; a ViT uses it through the distribution API."""
    r = run_on_eight_devices("sp_check.py")
    assert r["jax_devices"] == 8
    assert len(r["kernel"]) == 11  # 8 + the padded uneven / one-probe cases + Pallas shards
    for key, e in r["kernel"].items():
        assert e["used"], key                      # the sequence-parallel path ran
        assert e["forward"] <= 1e-5 and e["grad"] <= 1e-5, (key, e)
        assert "'seq'" in e["out_sharding"], (key, e)   # output stays token-sharded
    assert sorted(r["vits"]) == ["gap", "map", "tok"]
    for pool, v in r["vits"].items():
        assert v["used"], pool
        assert v["logits_scale"] > 1e-3, pool      # a trained head, not all-zero logits
        assert v["logits_diff"] <= 1e-4 * max(1.0, v["logits_scale"]), (pool, v)
        for a, b in zip(v["losses"], v["reference"]):
            assert a == pytest.approx(b, rel=1e-4), (pool, v)
        assert v["losses"][-1] != v["losses"][0]
