"""keras-reluvit: Vision Transformers with softmax or pointwise (ReLU/L)
attention, for Keras 3 on JAX, TensorFlow and PyTorch."""

import os as _os
import sys as _sys

from keras_reluvit._version import __version__

# The public face: every name a user imports from the package; each lives in
# one module (its home) and is imported here, nowhere else.
__all__ = [
    "__version__", "ACTIVATION_NAMES", "BUILDERS", "ClassToken", "EncoderBlock",
    "ImagePreprocessor", "MAPHead", "MLPBlock", "PointwiseAttention", "PositionEmbedding",
    "VARIANTS", "ViT", "ViT_B8", "ViT_B16", "ViT_B32", "ViT_H14", "ViT_L8", "ViT_L16",
    "ViT_L32", "ViT_S8", "ViT_S16", "ViT_S32", "ViT_Ti8", "ViT_Ti16", "ViT_Ti32",
    "attention_kinds", "attention_presets", "backup", "callbacks", "data", "decode_predictions",
    "distribution", "export", "fewshot", "finetune", "get_kernel", "image_folder",
    "imagenet1k_labels", "load_checkpoint",
    "load_image", "load_model", "load_weights", "pointwise_attention", "preprocess",
    "preprocessing", "recipes", "remat", "resample_posemb", "resize_model", "set_kernel",
    "checkpoints", "kernels", "models", "training",
    "settings", "train", "transfer_weights", "use_kernel",
]


def _program():
    """The running program's name, lower case, without its extension: the
    console script `keras-reluvit` (`keras-reluvit.exe` /
    `keras-reluvit-script.py` on Windows), `-m` while `python -m` imports
    this package, `cli` for `python keras_reluvit/cli.py`."""
    argv = _sys.argv
    return _os.path.splitext(_os.path.basename(argv[0] if argv else ""))[0].lower()


def _command_line_help_only():
    """`keras-reluvit --help` / `--version` / `<command> --help`: argparse
    answers and exits before any command runs, so nothing below (Keras, a
    backend) needs importing and the answer comes in a fraction of a second."""
    argv = _sys.argv
    return _program() in ("keras-reluvit", "keras-reluvit-script") and (
        len(argv) == 1 or any(a in ("-h", "--help", "--version") for a in argv[1:]))


def _command_line_train():
    """`keras-reluvit train` (or `python -m keras_reluvit.cli train`, as
    torchrun starts it): its SIGTERM handling begins before the imports
    below (seconds), so that a preemption notice that comes this early
    still ends in a clean stop (`kr.backup.signals_noted` reads `_EARLY`)."""
    return _program() in ("keras-reluvit", "keras-reluvit-script", "-m", "cli") and (
        _sys.argv[1:2] == ["train"])


_EARLY = []  # SIGTERM noted while `keras-reluvit train` imports
if _command_line_train():
    import signal as _signal

    _signal.signal(_signal.SIGTERM, lambda signum, frame: _EARLY.append(signum))

# Where each module lived before the packages (CHANGELOG, "The house, step 4"):
# `import keras_reluvit.vit`, `from keras_reluvit import recipes` and `kr.train`
# keep working, as the same module objects as their new homes, imported when
# first asked for (`keras_reluvit.embedded` needs tensorflow-datasets).
_MOVED = {
    "vit": "models.vit", "vit_config": "models.config", "layers": "models.layers",
    "attention": "models.attention", "attention_kinds": "models.attention_kinds",
    "activations": "models.activations", "posemb": "models.posemb",
    "variants": "models.variants", "zoo": "models.zoo", "remat": "models.remat",
    "keywords": "models.keywords", "train": "training.run", "recipes": "training.recipes",
    "backup": "training.backup", "callbacks": "training.callbacks",
    "fewshot": "training.fewshot", "finetune": "training.finetune",
    "settings": "training.settings", "runs": "training.runs", "embedded": "data.embedded",
    "image_folder": "data.folders",
}


def __getattr__(name):
    """`kr.train`, `kr.recipes`, ...: the moved modules by their old names."""
    if name in _MOVED:
        import importlib

        return importlib.import_module(f"{__name__}.{_MOVED[name]}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class _MovedModules:
    """`import keras_reluvit.<old name>`: the module at its new home (a
    meta-path finder and loader: the import system then files it under the
    old name too, the same object)."""

    @staticmethod
    def find_spec(fullname, path=None, target=None):
        package, _, old = fullname.rpartition(".")
        if package == __name__ and old in _MOVED:
            import importlib.util

            return importlib.util.spec_from_loader(fullname, _MovedModules)
        return None

    specs = {}  # the new home's own spec, which the import system overwrites

    @staticmethod
    def create_module(spec):
        import importlib

        module = importlib.import_module(f"{__name__}.{_MOVED[spec.name.rpartition('.')[2]]}")
        _MovedModules.specs[module.__name__] = module.__spec__
        return module

    @staticmethod
    def exec_module(module):
        module.__spec__ = _MovedModules.specs[module.__name__]  # imported at its new home


if not any(isinstance(f, type) and f.__name__ == "_MovedModules" and
           getattr(f, "__module__", None) == __name__ for f in _sys.meta_path):
    _sys.meta_path.append(_MovedModules)

if not _command_line_help_only():
    from keras_reluvit import checkpoints
    from keras_reluvit import data
    from keras_reluvit import distribution
    from keras_reluvit import export
    from keras_reluvit import kernels
    from keras_reluvit import models
    from keras_reluvit import preprocessing
    from keras_reluvit import training
    from keras_reluvit.checkpoints import load_checkpoint
    from keras_reluvit.checkpoints import load_model
    from keras_reluvit.kernels import get_kernel
    from keras_reluvit.kernels import set_kernel
    from keras_reluvit.kernels import use_kernel
    from keras_reluvit.models import remat
    from keras_reluvit.models.attention import ACTIVATION_NAMES
    from keras_reluvit.models.attention import PointwiseAttention
    from keras_reluvit.models.attention import pointwise_attention
    from keras_reluvit.models.attention_kinds import attention_kinds
    from keras_reluvit.models.attention_kinds import attention_presets  # deprecated alias
    from keras_reluvit.models.layers import ClassToken
    from keras_reluvit.models.layers import EncoderBlock
    from keras_reluvit.models.layers import MAPHead
    from keras_reluvit.models.layers import MLPBlock
    from keras_reluvit.models.posemb import PositionEmbedding
    from keras_reluvit.models.posemb import resample_posemb
    from keras_reluvit.models.variants import VARIANTS
    from keras_reluvit.models.vit import ViT
    from keras_reluvit.models.zoo import BUILDERS
    from keras_reluvit.models.zoo import ViT_B8
    from keras_reluvit.models.zoo import ViT_B16
    from keras_reluvit.models.zoo import ViT_B32
    from keras_reluvit.models.zoo import ViT_H14
    from keras_reluvit.models.zoo import ViT_L8
    from keras_reluvit.models.zoo import ViT_L16
    from keras_reluvit.models.zoo import ViT_L32
    from keras_reluvit.models.zoo import ViT_S8
    from keras_reluvit.models.zoo import ViT_S16
    from keras_reluvit.models.zoo import ViT_S32
    from keras_reluvit.models.zoo import ViT_Ti8
    from keras_reluvit.models.zoo import ViT_Ti16
    from keras_reluvit.models.zoo import ViT_Ti32
    from keras_reluvit.models.zoo import load_weights
    from keras_reluvit.models.zoo import resize_model
    from keras_reluvit.models.zoo import transfer_weights
    from keras_reluvit.preprocessing import ImagePreprocessor
    from keras_reluvit.preprocessing import decode_predictions
    from keras_reluvit.preprocessing import imagenet1k_labels
    from keras_reluvit.preprocessing import load_image
    from keras_reluvit.preprocessing import preprocess
    from keras_reluvit.training import backup
    from keras_reluvit.training import callbacks
    from keras_reluvit.training import fewshot
    from keras_reluvit.training import finetune
    from keras_reluvit.training import recipes  # registers its optimizers, losses, schedule
    from keras_reluvit.training import run as train
    from keras_reluvit.training import settings

    # The old names of the modules imported above are those modules already
    # (`import keras_reluvit.attention_kinds` then finds the module without
    # rebinding `kr.attention_kinds`, the function); the others (`embedded`,
    # `runs`) are found when first imported.
    for _old, _new in _MOVED.items():
        if f"{__name__}.{_new}" in _sys.modules:
            _sys.modules.setdefault(f"{__name__}.{_old}", _sys.modules[f"{__name__}.{_new}"])
    del _old, _new


def __dir__():
    return sorted(set(globals()) | set(_MOVED))
