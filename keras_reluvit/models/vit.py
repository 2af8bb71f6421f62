"""Vision Transformer with softmax or pointwise (ReLU/L) attention.

A functional `keras.Model` whose config is its constructor arguments, in the
spirit of big_vision's `vit.py`: strings as the interface
(`attention="relu"`, `pool="gap"`, `posemb="sincos2d"`), big_vision's
variants and initialisation, and intermediates one call away
(`model.intermediates(images)`).
"""

import inspect
import re

import keras

from keras_reluvit._keras_compat import flatten_layers
from keras_reluvit._logging import say
from keras_reluvit.models import extensions
from keras_reluvit.models import layers
from keras_reluvit.models import lora
from keras_reluvit.models.attention_kinds import deserialize_attention
from keras_reluvit.models.attention_kinds import resolve_attention
from keras_reluvit.models.config import HEAD_INIT_STD
from keras_reluvit.models.config import POOLS  # noqa: F401 - kr.vit.POOLS
from keras_reluvit.models.config import POSEMBS  # noqa: F401
from keras_reluvit.models.config import _checked_config
from keras_reluvit.models.keywords import check_keywords
from keras_reluvit.models.keywords import parameters
from keras_reluvit.models.posemb import PositionEmbedding
from keras_reluvit.preprocessing import ImagePreprocessor


@keras.saving.register_keras_serializable(package="keras_reluvit")
class ViT(keras.Model):
    """Vision Transformer (big_vision layout) with pointwise attention.

    Inputs are float images in `[-1, 1]` (big_vision's value range), NHWC,
    of exactly `image_size`. Outputs are logits `(B, num_classes)`, or pooled
    features `(B, D)` with `include_top=False`.

    Args:
        variant: `"<size>/<patch>"`, size in Ti, S, M, B, L, So400m, H, g
            (big_vision's widths/depths/MLP/heads). `width`, `depth`,
            `mlp_dim`, `num_heads`, `patch_size` override its parts (for tiny
            test models: `ViT("Ti/16", depth=2, width=64, num_heads=2, ...)`).
        attention: an attention kind (see `keras_reluvit.attention_kinds()`;
            default `"relu"`, the paper's ReLU/L) or a dict of
            `PointwiseAttention` arguments, e.g.
            `{"activation": "relu", "seq_len_exponent": 0.5}`.
        num_classes: classifier outputs (with `include_top=True`).
        image_size: int or `(height, width)`, divisible by the patch size.
        pool: `"gap"` (mean of the patch tokens), `"tok"` (class token),
            `"map"` (attention-pooling probe over the patch tokens) or
            `"tok_gap"` (the class token concatenated with the mean of the
            patch tokens, `2 * width` features: DINOv2's linear classifier).
        posemb: `"learn"` or `"sincos2d"` (fixed).
        qk_norm: LayerNorm on per-head q and k (default True, as the paper;
            `"affine"` adds a bias, as timm's `qk_norm=True`).
        representation_size: if set, a Dense + tanh pre-logits layer.
        dropout: dropout rate after posemb, attention and in the MLPs.
        include_top: False returns the pooled (pre-logits) features.
        mlp_activation: `"gelu_tanh"` (default, big_vision and the paper),
            `"gelu"` (exact, timm, keras-hub and Hugging Face checkpoints) or
            `"quick_gelu"` (`x * sigmoid(1.702 x)`, OpenAI's CLIP towers).
        head_bias_init: initial head bias (big_vision uses -6.9 / -10 with a
            sigmoid cross-entropy).
        head_init: the head kernel's initialisation: `"zeros"` (big_vision's)
            or `"trunc_normal"` (timm's `trunc_normal_(std=.02)`, DeiT's and
            DeiT III's; its bounds +-2 lie 100 standard deviations out, so a
            normal of std 0.02).
        class_token: prepend a learned class token (default: `pool == "tok"`;
            timm/MAE models also pair one with `"gap"`, which then skips it).
        num_register_tokens: learned register tokens after the class token
            (Darcet et al. 2023; timm `reg_tokens`), skipped by the pooling.
        posemb_prefix: whether a learned position embedding has rows for the
            class/register tokens (original ViT, AugReg, timm's default) or is
            added to the patches only, before those tokens are prepended
            (big_vision, DeiT-3, timm `no_embed_class=True`).
        pre_norm: a LayerNorm on the tokens after the position embedding,
            before the first block (CLIP's `ln_pre`; timm `norm_pre`).
        fc_norm: the final LayerNorm after pooling instead of before (timm's
            `fc_norm`, MAE / BEiT-style `"gap"` models).
        layer_scale: None, or the initial value of per-channel LayerScale on
            each residual branch (CaiT / DeiT-3; timm `init_values`).
        layer_norm_epsilon: epsilon of every LayerNorm (1e-6 as big_vision,
            timm and keras-hub).
        remat: recompute each encoder block's activations in the backward
            pass to save memory (big_vision's `remat_policy`, timm's
            `set_grad_checkpointing`): None (off), `"full"`, or a
            `jax.checkpoint_policies` name (JAX; whole blocks elsewhere).
            See `keras_reluvit.remat`.
        drop_path: stochastic depth rate (timm's `drop_path_rate`): block
            `i` of `depth` drops each residual branch per sample with
            probability `drop_path * i / (depth - 1)`, linearly from 0 as in
            timm and DeiT (`EncoderBlock(drop_path=)`); off at inference.
        drop_path_schedule: `"linear"` (above) or `"uniform"`: every block
            at `drop_path` (DeiT III's `models_v2.py`, `dpr_constant`).
        preprocessing: how images are prepared for this model (resize, crop,
            mean/std; a dict, see `keras_reluvit.preprocessing`). Default:
            our own evaluation recipe (shorter side to 256/224 of the size,
            area, centre crop, [-1, 1]); checkpoint readers set their
            source's. Applied by `model.preprocessor`, the SavedModel
            signatures, the data pipelines, `keras-reluvit eval | predict`.
        label_names: the class names, one per output (with `include_top`);
            checkpoint readers set their source's, training runs the data
            set's. Used by `keras_reluvit.decode_predictions` and exports.
        dtype: a Keras dtype policy, e.g. `"float32"`, `"mixed_bfloat16"`.
            Logits are float32 under mixed policies.

    Example:

    >>> import numpy as np, keras_reluvit
    >>> model = keras_reluvit.ViT("S/16", attention="relu", num_classes=10,
    ...                           image_size=64, depth=2)
    >>> x = np.random.uniform(-1, 1, (2, 64, 64, 3)).astype("float32")
    >>> tuple(model(x).shape)
    (2, 10)
    >>> out = model.intermediates(x)
    >>> tuple(out["attention_01"].shape)  # (B, heads, tokens, tokens)
    (2, 6, 16, 16)
    """

    def __init__(
        self,
        variant="S/16",
        attention="relu",
        num_classes=1000,
        image_size=224,
        pool="gap",
        posemb="learn",
        qk_norm=True,
        representation_size=None,
        dropout=0.0,
        include_top=True,
        mlp_activation="gelu_tanh",
        head_bias_init=0.0,
        width=None,
        depth=None,
        mlp_dim=None,
        num_heads=None,
        patch_size=None,
        class_token=None,
        num_register_tokens=0,
        posemb_prefix=True,
        fc_norm=False,
        layer_scale=None,
        pre_norm=False,
        layer_norm_epsilon=layers.LN_EPS,
        remat=None,
        drop_path=0.0,
        drop_path_schedule="linear",
        head_init="zeros",
        preprocessing=None,
        label_names=None,
        dtype=None,
        name=None,
        **kwargs,
    ):
        check_keywords("keras_reluvit.ViT", {k: v for k, v in kwargs.items() if k != "trainable"},
                       accepted_keywords())
        config, attention_args = _checked_config(
            variant=variant, attention=attention, num_classes=num_classes,
            image_size=image_size, pool=pool, posemb=posemb, qk_norm=qk_norm,
            representation_size=representation_size, dropout=dropout,
            include_top=include_top, mlp_activation=mlp_activation,
            head_bias_init=head_bias_init, width=width, depth=depth, mlp_dim=mlp_dim,
            num_heads=num_heads, patch_size=patch_size, class_token=class_token,
            num_register_tokens=num_register_tokens, posemb_prefix=posemb_prefix,
            fc_norm=fc_norm, layer_scale=layer_scale, pre_norm=pre_norm,
            layer_norm_epsilon=layer_norm_epsilon, remat=remat, drop_path=drop_path,
            drop_path_schedule=drop_path_schedule, head_init=head_init,
            preprocessing=preprocessing, label_names=label_names, dtype=dtype)
        parts = _build_parts(config, attention_args)
        inputs = keras.Input((*config["image_size"], 3), name="images", dtype="float32")
        outputs = _forward(parts, inputs)["output"]
        if name is None:
            name = "vit_" + re.sub(r"\W", "", str(variant)).lower()
        super().__init__(inputs=inputs, outputs=outputs, name=name, **kwargs)
        # Keras' functional models take no dtype: the model reports the policy
        # its layers compute with (`model.dtype_policy`, `model.compute_dtype`).
        self.dtype_policy = parts["policy"]
        # Image checks are ours (`_check_images`), with messages that say what
        # to do; Keras' generic input-spec check would pre-empt some of them.
        self.input_spec = None
        self._parts = parts
        self._config = config

    # ---- properties -------------------------------------------------------
    @property
    def image_size(self):
        return self._config["image_size"]

    @property
    def patch_size(self):
        return self._config["patch_size"]

    @property
    def grid_size(self):
        return tuple(s // self.patch_size for s in self.image_size)

    @property
    def num_prefix_tokens(self):
        """Class + register tokens before the patch tokens."""
        return self._parts["num_prefix_tokens"]

    @property
    def posemb_prefix_tokens(self):
        """Rows of the position embedding before the patch grid."""
        return self.num_prefix_tokens if self._parts["posemb_prefix"] else 0

    @property
    def preprocessing(self):
        """The input recipe (a dict; see `keras_reluvit.preprocessing`)."""
        return dict(self._config["preprocessing"])

    @property
    def preprocessor(self):
        """An `ImagePreprocessor` for this model: pixel images of any size
        (uint8 or 0-255 floats; one, a batch or a list) -> its inputs.

        Example: `model.predict(model.preprocessor(photos))`."""
        return ImagePreprocessor(self.image_size, name=f"{self.name}_preprocessor",
                                 **self._config["preprocessing"])

    @property
    def label_names(self):
        """The class names (a list, one per output), or None."""
        names = self._config["label_names"]
        return None if names is None else list(names)

    @property
    def blocks(self):
        return list(self._parts["blocks"])

    @property
    def attention_args(self):
        """The resolved `PointwiseAttention` arguments of every block."""
        return resolve_attention(self._config["attention"])

    # ---- calling ----------------------------------------------------------
    def _check_images(self, images):
        shape = tuple(images.shape)
        want = (*self.image_size, 3)
        if len(shape) != 4:
            raise ValueError(
                f"{self.name} expects NHWC images of rank 4 (batch, height, "
                f"width, 3), got rank {len(shape)} with shape {shape}."
            )
        if shape[-1] is not None and shape[-1] != 3:
            raise ValueError(
                f"{self.name} expects 3 (RGB) channels, got {shape[-1]} in "
                f"shape {shape}; convert grayscale with "
                "keras.ops.repeat(x, 3, axis=-1) or drop alpha channels."
            )
        if tuple(shape[1:3]) != tuple(want[:2]) and None not in shape[1:3]:
            raise ValueError(
                f"{self.name} was built for {want[0]}x{want[1]} images, got "
                f"{shape[1]}x{shape[2]}. Build a model for that size with "
                "keras_reluvit.resize_model(model, image_size) (resamples the "
                "position embedding)."
            )

    def call(self, inputs, training=None, mask=None):
        self._check_images(inputs)
        return super().call(inputs, training=training, mask=mask)

    def intermediates_model(self, attention_weights=True):
        """A `keras.Model` sharing this model's weights with dict outputs.

        Keys: `"tokens"` (embedded patches with posemb), `"block_XX"` (each
        block's output), `"attention_XX"` (each block's `(B, H, T, T)`
        attention weights, when `attention_weights`), `"encoded"` (after the
        final LayerNorm), `"pooled"`, `"pre_logits"` and `"logits"` (with a
        head).
        """
        inputs = keras.Input((*self.image_size, 3), dtype="float32")
        out = _forward(self._parts, inputs, collect=True,
                       attention_weights=attention_weights)
        out.pop("output")
        return keras.Model(inputs, out, name=f"{self.name}_intermediates")

    def intermediates(self, images, attention_weights=True):
        """Runs `images` and returns the dict of `intermediates_model()`."""
        self._check_images(images)
        return self.intermediates_model(attention_weights)(images)

    def get_config(self):
        config = {"name": self.name, "trainable": self.trainable, **self._config}
        mode = _quantization_mode(self)
        if mode is not None:  # model.quantize(mode): from_config quantizes again
            config["quantization_mode"] = mode
        return config

    # ---- fine-tuning --------------------------------------------------------
    def enable_lora(self, rank, target_layer_names=None, train_head=True, lora_alpha=None):
        """LoRA of rank `rank` (keras-hub's `Backbone.enable_lora`): Keras'
        `enable_lora` on each block's attention `query` and `value`
        projections (or `target_layer_names`, among `query`, `key`, `value`,
        `attention_output`, `fc1`, `fc2`); every other weight is frozen
        except the classifier head (`train_head`). Saved and exported
        models hold the merged kernels. See `keras_reluvit.models.lora`.

        Example:

        ```python
        model = kr.load_checkpoint("vit_s16.safetensors", num_classes=5)
        model.enable_lora(8)           # then compile and fit
        ```
        """
        lora.enable_lora(self, rank, target_layer_names, train_head, lora_alpha)

    # ---- presets (keras-hub's convention) ----------------------------------
    @classmethod
    def from_preset(cls, preset, **overrides):
        """Loads a model directory: a preset written by `save_to_preset`, a
        keras-hub `ViTBackbone` / `ViTImageClassifier` preset, a Hugging
        Face transformers ViT / DeiT / DINOv2 / CLIP directory or a timm hub
        directory. Overrides
        (`attention`, `num_classes`, `image_size`, ...) as
        `keras_reluvit.load_checkpoint`.

        Example:

        ```python
        model = keras_reluvit.ViT.from_preset("presets/vit_s16_augreg", attention="relu")
        ```
        """
        return extensions.provider("checkpoints").from_preset(preset, **overrides)

    def save_to_preset(self, preset_dir):
        """Writes `config.json` (the full config), `model.weights.h5` and
        `metadata.json` (versions, parameter count, source) to `preset_dir`,
        loadable with `ViT.from_preset` on any backend."""
        return extensions.provider("checkpoints").save_to_preset(self, preset_dir)

    # ---- Keras' own export call -------------------------------------------
    def export(self, filepath, format="tf_saved_model", verbose=None, input_signature=None,
               **kwargs):
        """Keras' `model.export`, on every backend: `format="tf_saved_model"`
        writes `keras_reluvit.export.saved_model`'s archive (Keras' `serve`
        endpoint, plus the serving signatures with this model's
        preprocessing and class names), `"onnx"` `keras_reluvit.export.onnx`;
        both from JAX, TensorFlow or PyTorch (Keras 3.15's own writer fails
        on PyTorch). `input_signature` sets the `serve` / ONNX input shape;
        other formats go to Keras. Keras' backend-specific options
        (`is_static`, `jax2tf_kwargs`, ...) are refused by name: a TensorFlow
        process writes the archive from the `.keras` model, so they would do
        nothing.

        Example:

        ```python
        model.export("vit_s16_relu", format="tf_saved_model")
        reloaded = tf.saved_model.load("vit_s16_relu")
        logits = reloaded.serve(x)                         # == model.predict(x)
        probs = reloaded.serve_bytes(image_bytes=jpegs)    # photographs in
        ```
        """
        if format not in ("tf_saved_model", "onnx"):
            return super().export(filepath, format=format, verbose=verbose,
                                  input_signature=input_signature, **kwargs)
        if kwargs:
            raise ValueError(
                f"{self.name}.export(format={format!r}) does not take {sorted(kwargs)}: "
                "keras_reluvit writes the archive in a TensorFlow process from the .keras "
                "model (see keras_reluvit.export), where those options do nothing. Drop them.")
        kr_export = extensions.provider("export")
        if format == "onnx":
            path = kr_export.onnx(self, filepath, input_signature=input_signature)
            what = "an ONNX model (model inputs -> logits)"
        else:
            path = kr_export.saved_model(self, filepath, input_signature=input_signature)
            what = ("a SavedModel: serve (Keras' endpoint: model inputs -> logits), "
                    "serving_default / serve_bytes (uint8 images / encoded bytes with the "
                    "model's own preprocessing -> probabilities, top-k)")
        if verbose is None or verbose:
            say(f"wrote {what} to {path} (see keras_reluvit.export).")
        return path

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        if isinstance(config.get("dtype"), dict):
            config["dtype"] = keras.dtype_policies.deserialize(config["dtype"])
        config["attention"] = deserialize_attention(config.get("attention", "relu"))
        mode = config.pop("quantization_mode", None)
        model = cls(**config)
        if mode is not None:  # a quantized model's saved variables are the quantized ones
            model.quantize(mode)
        return model


def check_arguments(**kwargs):
    """`ViT(**kwargs)`'s arguments checked as it checks them, without
    building it: a ValueError naming the bad one (the training run checks
    its model before it reads any data)."""
    accepted = accepted_keywords()
    check_keywords("keras_reluvit.ViT", {k: v for k, v in kwargs.items() if k not in accepted},
                   accepted)
    bound = inspect.signature(ViT.__init__).bind_partial(
        None, **{k: v for k, v in kwargs.items() if k != "trainable"})
    bound.apply_defaults()
    arguments = {k: v for k, v in bound.arguments.items()
                 if k not in ("self", "name", "kwargs")}
    _checked_config(**arguments)


def accepted_keywords():
    """The keywords `ViT` takes (its own, and Keras' `trainable`)."""
    return parameters(ViT.__init__) + ["trainable"]


def _quantization_mode(model):
    """The mode of `model.quantize(mode)` (every quantized layer's), or None."""
    modes = {getattr(layer, "quantization_mode", None)
             for layer in flatten_layers(model, include_self=False)} - {None}
    if len(modes) > 1:
        raise ValueError(f"{model.name} has layers quantized in several modes {sorted(modes)}: "
                         "its config can name one (quantize the whole model with "
                         "model.quantize(mode)).")
    return modes.pop() if modes else None


def drop_path_rates(rate, depth, schedule="linear"):
    """Each block's stochastic depth rate: linearly from 0 (the first block)
    to `rate` (the last), as timm's `torch.linspace(0, rate, depth)`; or
    `rate` for every block (`schedule="uniform"`, DeiT III)."""
    if schedule == "uniform":
        return [rate] * depth
    return [rate * i / (depth - 1) if depth > 1 else 0.0 for i in range(depth)]


def _build_parts(c, attention_args):
    """The layers of a ViT with the checked config `c`, by role (what
    `_forward` wires: stem, tokens, prefix tokens, position embedding,
    blocks, final norm, pooling head, pre-logits, classifier)."""
    policy = keras.dtype_policies.get(c["dtype"] or keras.config.dtype_policy())
    width, heads, patch, mlp = c["width"], c["num_heads"], c["patch_size"], c["mlp_dim"]
    grid = (c["image_size"][0] // patch, c["image_size"][1] // patch)
    prefix = int(c["class_token"]) + c["num_register_tokens"]
    eps = c["layer_norm_epsilon"]
    block_args = (heads, mlp, attention_args, c["qk_norm"], c["mlp_activation"])
    head_policy = "float32" if policy.compute_dtype != "float32" else policy
    return dict(
        policy=policy,
        stem=keras.layers.Conv2D(width, patch, strides=patch, padding="valid",
                                 kernel_initializer="lecun_normal", name="embedding",
                                 dtype=policy),
        to_tokens=keras.layers.Reshape((grid[0] * grid[1], width)),
        cls=layers.ClassToken(name="cls", dtype=policy) if c["class_token"] else None,
        reg=(layers.ClassToken(c["num_register_tokens"], name="reg", dtype=policy)
             if c["num_register_tokens"] else None),
        pos=PositionEmbedding(grid, c["posemb"], prefix if c["posemb_prefix"] else 0,
                                name="pos_embedding", dtype=policy),
        posemb_prefix=c["posemb_prefix"],
        num_prefix_tokens=prefix,
        fc_norm=c["fc_norm"],
        drop=keras.layers.Dropout(c["dropout"], dtype=policy),
        pre_norm=(keras.layers.LayerNormalization(name="pre_norm", epsilon=eps, dtype=policy)
                  if c["pre_norm"] else None),
        blocks=[layers.EncoderBlock(*block_args, c["dropout"], layer_scale=c["layer_scale"],
                                    layer_norm_epsilon=eps, remat=c["remat"],
                                    drop_path=rate, name=f"block_{i:02d}", dtype=policy)
                for i, rate in enumerate(drop_path_rates(c["drop_path"], c["depth"],
                                                          c["drop_path_schedule"]))],
        norm=keras.layers.LayerNormalization(name="encoder_norm", epsilon=eps, dtype=policy),
        map_head=(layers.MAPHead(*block_args, layer_norm_epsilon=eps, name="map_head",
                            dtype=policy) if c["pool"] == "map" else None),
        pre_logits=(keras.layers.Dense(c["representation_size"], activation="tanh",
                                       name="pre_logits", dtype=policy)
                    if c["representation_size"] else None),
        head=(keras.layers.Dense(c["num_classes"], kernel_initializer=(
                  "zeros" if c["head_init"] == "zeros"
                  else keras.initializers.RandomNormal(stddev=HEAD_INIT_STD)),
                                 bias_initializer=keras.initializers.Constant(
                                     c["head_bias_init"]),
                                 name="head", dtype=head_policy)
              if c["include_top"] else None),
        pool=c["pool"],
    )


class _WithScores(keras.layers.Layer):
    """Calls a block with `return_attention_scores=True` (intermediates)."""

    def __init__(self, block, **kwargs):
        super().__init__(**kwargs)
        self.block = block

    def call(self, x):
        return self.block(x, return_attention_scores=True)


def _forward(parts, images, collect=False, attention_weights=False):
    """The ViT graph, shared by the model and its intermediates model."""
    out = {}
    x = parts["to_tokens"](parts["stem"](images))
    if not parts["posemb_prefix"]:
        x = parts["pos"](x)
    # Prefix order as timm: [class, registers..., patches].
    for name in ("reg", "cls"):
        if parts[name] is not None:
            x = parts[name](x)
    if parts["posemb_prefix"]:
        x = parts["pos"](x)
    out["tokens"] = x
    x = parts["drop"](x)
    if parts["pre_norm"] is not None:
        x = parts["pre_norm"](x)
    for i, block in enumerate(parts["blocks"]):
        if collect and attention_weights:
            # A distinct operation: a Keras graph node must keep one output
            # structure per layer, and the block already has a 1-output node.
            x, w = _WithScores(block, name=f"{block.name}_scores")(x)
            out[f"attention_{i:02d}"] = w
        else:
            x = block(x)
        out[f"block_{i:02d}"] = x
    if not parts["fc_norm"]:
        x = parts["norm"](x)
    out["encoded"] = x
    pool, prefix = parts["pool"], parts["num_prefix_tokens"]
    if pool == "gap":
        x = keras.ops.mean(x[:, prefix:] if prefix else x, axis=1)
    elif pool == "tok":
        x = x[:, 0]
    elif pool == "tok_gap":
        x = keras.ops.concatenate([x[:, 0], keras.ops.mean(x[:, prefix:], axis=1)], axis=-1)
    else:
        x = parts["map_head"](x[:, prefix:] if prefix else x)
    if parts["fc_norm"]:
        x = parts["norm"](x)
    out["pooled"] = x
    if parts["pre_logits"] is not None:
        x = parts["pre_logits"](x)
    out["pre_logits"] = x
    if parts["head"] is not None:
        x = parts["head"](x)
        out["logits"] = x
    out["output"] = x
    if not collect:
        return {"output": x}
    return out
