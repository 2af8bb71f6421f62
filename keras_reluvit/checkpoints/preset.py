"""Our own preset directories (keras-hub's convention: `config.json`,
`model.weights.h5`, `metadata.json`), in and out, and `.keras` models read
as checkpoints."""

import datetime
import json
import os

import keras

from keras_reluvit._version import __version__
from keras_reluvit.checkpoints.common import CheckpointError
from keras_reluvit.checkpoints.common import model_class
from keras_reluvit.checkpoints.common import _model_weights
from keras_reluvit.checkpoints.common import _Weights
from keras_reluvit.checkpoints.keras_hub import _keras_hub

PRESET_CONFIG = "config.json"
PRESET_WEIGHTS = "model.weights.h5"
PRESET_METADATA = "metadata.json"


def _ours(model):
    arch = model.get_config()
    arch.pop("name", None)
    arch.pop("trainable", None)
    w = _Weights()
    for key, value in _model_weights(model).items():
        w.put(key, value, key)
    arch["_native_grid"] = model.grid_size
    return arch, w


def _read_preset(directory, path):
    with open(os.path.join(directory, PRESET_CONFIG)) as f:
        config = json.load(f)
    registered = str(config.get("registered_name", ""))
    if registered.startswith("keras_hub>") or str(config.get("module", "")).startswith("keras_hub"):
        if config.get("class_name") not in ("ViTBackbone",):
            raise CheckpointError(
                f"{path}: a keras-hub {config.get('class_name')} preset, not a ViTBackbone.")
        return _keras_hub(directory, config, path)
    if config.get("class_name") != "ViT":
        raise CheckpointError(f"{path}: {PRESET_CONFIG} describes a "
                              f"{config.get('class_name')!r}, not a ViT.")
    model = model_class().from_config(config["config"])
    weights = os.path.join(directory, PRESET_WEIGHTS)
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
