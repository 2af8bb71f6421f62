"""Our own preset directories (keras-hub's convention: `config.json`,
`model.weights.h5`, `metadata.json`), in and out, and `.keras` models read
as checkpoints."""

import datetime
import json
import os

import keras

from keras_reluvit._version import __version__
from keras_reluvit.checkpoints.common import CheckpointError
from keras_reluvit.checkpoints.common import WeightReader
from keras_reluvit.checkpoints.common import model_class
from keras_reluvit.checkpoints.common import model_weights
from keras_reluvit.checkpoints.common import read_json

PRESET_CONFIG = "config.json"
PRESET_WEIGHTS = "model.weights.h5"
PRESET_METADATA = "metadata.json"


def _ours(model):
    arch = model.get_config()
    arch.pop("name", None)
    arch.pop("trainable", None)
    if arch.pop("quantization_mode", None):
        raise CheckpointError(
            f"{model.name} is quantized: load it as it is (keras.saving.load_model / "
            "kr.load_model), or save the float model and quantize after loading.")
    w = WeightReader()
    for key, value in model_weights(model).items():
        w.put(key, value, key)
    arch["_native_grid"] = model.grid_size
    return arch, w


def detect(path):
    """A directory with our `config.json` (after the keras-hub and
    transformers directories, which have one too)."""
    return os.path.isdir(path) and os.path.exists(os.path.join(path, PRESET_CONFIG))


def read(path, overrides):
    return _read_preset(path)


def detect_keras(path):
    """A `.keras` file (a zip archive with `config.json`)."""
    import zipfile

    if not os.path.isfile(path):
        return False
    if path.lower().endswith(".keras"):
        return True
    return zipfile.is_zipfile(path) and "config.json" in zipfile.ZipFile(path).namelist()


def read_keras(path, overrides):
    try:
        model = keras.saving.load_model(path, compile=False)
    except Exception as e:
        raise CheckpointError(f"{path}: cannot load the .keras file ({e}).") from e
    if not isinstance(model, model_class()):
        raise CheckpointError(f"{path} does not hold a keras_reluvit ViT.")
    return _ours(model)


def detect_weights_h5(path):
    """A Keras `.weights.h5` file (HDF5)."""
    if not os.path.isfile(path):
        return False
    if path.lower().endswith(".h5"):
        return True
    with open(path, "rb") as f:
        return f.read(8).startswith(b"\x89HDF")


def read_weights_h5(path, overrides):
    raise CheckpointError(
        f"{path}: a .weights.h5 file stores no architecture; build the model and "
        "call model.load_weights / kr.load_weights(model, path), or save a preset.")


def _read_preset(path):
    config = read_json(os.path.join(path, PRESET_CONFIG))
    if config.get("class_name") != "ViT":
        raise CheckpointError(f"{path}: {PRESET_CONFIG} describes a "
                              f"{config.get('class_name')!r}, not a ViT.")
    try:
        model = model_class().from_config(config["config"])
    except (TypeError, ValueError) as e:  # e.g. a malformed preprocessing recipe
        raise CheckpointError(f"{os.path.join(path, PRESET_CONFIG)}: {e}") from None
    weights = os.path.join(path, PRESET_WEIGHTS)
    try:
        model.load_weights(weights)
    except Exception as e:
        raise CheckpointError(f"{weights}: cannot load into the preset's ViT ({e}).") from e
    return _ours(model)


def save_to_preset(model, directory, source=None):
    """Writes `model` as a preset directory in keras-hub's convention:
    `config.json` (the full ViT config), `model.weights.h5` and
    `metadata.json` (versions, parameter count, source, date)."""
    directory = os.fspath(directory)
    os.makedirs(directory, exist_ok=True)
    config = keras.saving.serialize_keras_object(model)
    config.pop("build_config", None)
    config.pop("compile_config", None)
    with open(os.path.join(directory, PRESET_CONFIG), "w") as f:
        json.dump(config, f, indent=2)
    model.save_weights(os.path.join(directory, PRESET_WEIGHTS))
    source = source or getattr(model, "checkpoint_source", None)
    meta = dict(
        keras_reluvit_version=__version__, keras_version=keras.__version__,
        parameter_count=int(model.count_params()), source=source,
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    )
    with open(os.path.join(directory, PRESET_METADATA), "w") as f:
        json.dump(meta, f, indent=2)
    return directory
