"""keras-reluvit: Vision Transformers with softmax or pointwise (ReLU/L)
attention, for Keras 3 on JAX, TensorFlow and PyTorch."""

from keras_reluvit._version import __version__

# The public face: every name a user imports from the package; each lives in
# one module (its home) and is imported here, nowhere else.
__all__ = [
    "__version__", "ACTIVATION_NAMES", "BUILDERS", "ClassToken", "EncoderBlock",
    "ImagePreprocessor", "MAPHead", "MLPBlock", "PointwiseAttention", "PositionEmbedding",
    "VARIANTS", "ViT", "ViT_B8", "ViT_B16", "ViT_B32", "ViT_H14", "ViT_L8", "ViT_L16",
    "ViT_L32", "ViT_S8", "ViT_S16", "ViT_S32", "ViT_Ti8", "ViT_Ti16", "ViT_Ti32",
    "attention_kinds", "attention_presets", "backup", "build_config", "callbacks", "data",
    "decode_predictions",
    "distribution", "export", "fewshot", "finetune", "get_kernel", "image_folder",
    "imagenet1k_labels", "load_checkpoint",
    "load_image", "load_model", "load_weights", "pointwise_attention", "preprocess",
    "preprocessing", "recipes", "remat", "resample_posemb", "resize_model", "set_kernel",
    "checkpoints", "kernels", "models", "training",
    "settings", "train", "transfer_weights", "use_kernel",
]


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
from keras_reluvit.data import folders as image_folder
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
from keras_reluvit.training import settings
from keras_reluvit.training.run import build_config
from keras_reluvit.training.run import train
