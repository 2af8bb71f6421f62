"""The building blocks of a ViT: class token, MLP, encoder block, MAP head
(the position embedding: `keras_reluvit.models.posemb`).

Initialisation follows big_vision's `vit.py`: xavier-uniform kernels,
normal(1e-6) MLP biases, posemb normal(1/sqrt(D)), zero class token,
LayerNorm epsilon 1e-6, pre-LN residual blocks.
"""

import math

import keras
from keras import ops

from keras_reluvit.kernels import torch_fast
from keras_reluvit.kernels.keras_ops import is_symbolic
from keras_reluvit.models import remat as remat_module
from keras_reluvit.models.attention import PointwiseAttention
from keras_reluvit.models.attention import check_heads
from keras_reluvit.models.attention import check_qk_norm
from keras_reluvit.models.attention import check_rate
from keras_reluvit.models.attention_kinds import deserialize_attention
from keras_reluvit.models.attention_kinds import resolve_attention

LN_EPS = 1e-6
MLP_ACTIVATIONS = ("gelu_tanh", "gelu", "quick_gelu")


def check_mlp_activation(activation):
    if activation not in MLP_ACTIVATIONS:
        raise ValueError(
            f"Unknown mlp_activation {activation!r}; valid: {', '.join(MLP_ACTIVATIONS)}.")
    return activation


@keras.saving.register_keras_serializable(package="keras_reluvit")
class ClassToken(keras.layers.Layer):
    """Prepends `num_tokens` learned tokens (zero-initialised, as big_vision):
    the class token, or register tokens (Darcet et al. 2023; timm `reg_token`).
    """

    def __init__(self, num_tokens=1, **kwargs):
        super().__init__(**kwargs)
        self.num_tokens = int(num_tokens)

    def build(self, input_shape):
        self.token = self.add_weight(
            name="token",
            shape=(1, self.num_tokens, input_shape[-1]),
            initializer="zeros",
        )

    def call(self, x):
        token = ops.cast(self.token, x.dtype)
        shape = (ops.shape(x)[0], self.num_tokens, ops.shape(x)[2])
        return ops.concatenate([ops.broadcast_to(token, shape), x], axis=1)

    def get_config(self):
        return {**super().get_config(), "num_tokens": self.num_tokens}


@keras.saving.register_keras_serializable(package="keras_reluvit")
class MLPBlock(keras.layers.Layer):
    """Dense -> GELU -> Dropout -> Dense, big_vision's `MlpBlock`.

    Args:
        mlp_dim: hidden size.
        activation: `"gelu_tanh"` (big_vision / Flax default, as the paper
            trained), `"gelu"` (exact, as timm and keras-hub) or
            `"quick_gelu"` (`x * sigmoid(1.702 x)`, OpenAI's CLIP).
        dropout: rate after the activation.
    """

    def __init__(self, mlp_dim, activation="gelu_tanh", dropout=0.0, **kw):
        super().__init__(**kw)
        self.mlp_dim = int(mlp_dim)
        self.activation = check_mlp_activation(activation)
        self.dropout = check_rate(dropout, "dropout")
        dense = dict(
            kernel_initializer="glorot_uniform",
            bias_initializer=keras.initializers.RandomNormal(stddev=1e-6),
            dtype=self.dtype_policy,
        )
        self.fc1 = keras.layers.Dense(self.mlp_dim, name="fc1", **dense)
        self.fc2 = None
        self._dense_kwargs = dense
        self.drop = keras.layers.Dropout(self.dropout, dtype=self.dtype_policy)

    def build(self, input_shape):
        self.fc1.build(input_shape)
        self.fc2 = keras.layers.Dense(
            input_shape[-1], name="fc2", **self._dense_kwargs
        )
        self.fc2.build(tuple(input_shape[:-1]) + (self.mlp_dim,))

    def call(self, x, training=None):
        fast = torch_fast.dense_eligible(x, self.fc1, self.fc2)  # PyTorch: bias fused into the GEMM
        x = torch_fast.linear(self.fc1, x) if fast else self.fc1(x)
        if self.activation == "gelu" and keras.backend.backend() == "tensorflow":
            # tf.nn.gelu writes erfc, which ONNX has no op for (an exported
            # model would not load in onnxruntime): the same function with erf.
            x = 0.5 * x * (1.0 + ops.erf(x * (1.0 / math.sqrt(2.0))))
        elif self.activation == "quick_gelu":
            x = x * ops.sigmoid(1.702 * x)
        else:
            x = ops.gelu(x, approximate=self.activation == "gelu_tanh")
        x = self.drop(x, training=training)
        return torch_fast.linear(self.fc2, x) if fast else self.fc2(x)

    def get_config(self):
        return {
            **super().get_config(),
            "mlp_dim": self.mlp_dim,
            "activation": self.activation,
            "dropout": self.dropout,
        }


def _attention_layer(width, num_heads, attention, qk_norm, dtype, name, eps=LN_EPS):
    return PointwiseAttention(
        num_heads=num_heads,
        key_dim=width // num_heads,
        qk_norm=qk_norm,
        qk_norm_epsilon=eps,
        # xavier-uniform with Flax DenseGeneral fans: the (D, H, Dh) kernel
        # is a (D, H * Dh) matrix, not a convolution (Keras' rank-3 default).
        kernel_initializer=keras.initializers.GlorotUniform(
            input_axes=[0], output_axes=[1, 2]
        ),
        bias_initializer="zeros",
        dtype=dtype,
        name=name,
        **attention,
    )


class _AttentionOwner(keras.layers.Layer):
    """What `EncoderBlock` and `MAPHead` share: the arguments of their
    attention and MLP, the attention layer they build, and their config."""

    def __init__(self, num_heads, mlp_dim, attention=None, qk_norm=True,
                 mlp_activation="gelu_tanh", layer_norm_epsilon=LN_EPS, **kwargs):
        super().__init__(**kwargs)
        self.num_heads = int(num_heads)
        self.mlp_dim = int(mlp_dim)
        # An attention kind ("relu", "softmax", ...) or a dict of
        # PointwiseAttention arguments, as `ViT(attention=...)` takes it.
        self.attention = resolve_attention("relu" if attention is None else attention)
        self.qk_norm = check_qk_norm(qk_norm)
        self.mlp_activation = mlp_activation
        self.layer_norm_epsilon = float(layer_norm_epsilon)
        self.attn = None

    def _norm(self, name):
        return keras.layers.LayerNormalization(
            epsilon=self.layer_norm_epsilon, name=name, dtype=self.dtype_policy)

    def _attention(self, width):
        check_heads(width, self.num_heads)
        return _attention_layer(width, self.num_heads, self.attention, self.qk_norm,
                                self.dtype_policy, "attention", self.layer_norm_epsilon)

    def get_config(self):
        return {
            **super().get_config(),
            "num_heads": self.num_heads,
            "mlp_dim": self.mlp_dim,
            "attention": self.attention,
            "qk_norm": self.qk_norm,
            "mlp_activation": self.mlp_activation,
            "layer_norm_epsilon": self.layer_norm_epsilon,
        }

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["attention"] = deserialize_attention(config.get("attention"))
        return super().from_config(config)


@keras.saving.register_keras_serializable(package="keras_reluvit")
class EncoderBlock(_AttentionOwner):
    """Pre-LN transformer block: `x + Attn(LN(x))`, then `x + MLP(LN(x))`.

    Args:
        num_heads: attention heads; `width` must be divisible by it.
        mlp_dim: MLP hidden size.
        attention: an attention kind (`"relu"`, `"softmax"`, ... as
            `ViT(attention=...)`) or a dict of `PointwiseAttention`
            arguments (activation, seq_len_exponent, gated, learned_scale).
        qk_norm: LayerNorm on per-head queries and keys (True: without bias,
            `"affine"`: with bias, as timm).
        mlp_activation: `"gelu_tanh"`, `"gelu"` or `"quick_gelu"`.
        dropout: rate after attention, inside and after the MLP.
        layer_scale: None, or the initial value of per-channel scales on the
            two residual branches (LayerScale, CaiT / DeiT-3; timm `ls1`/`ls2`).
        layer_norm_epsilon: epsilon of the block's LayerNorms (1e-6).
        remat: recompute the block's activations in the backward pass
            (`keras_reluvit.remat`: None, `"full"` or a JAX policy name).
        drop_path: stochastic depth (timm's `DropPath`): in training each
            residual branch is dropped for a whole sample with this
            probability and the kept ones scaled by `1 / (1 - drop_path)`;
            nothing at inference. Keras' `Dropout` with a per-sample
            `noise_shape`. `ViT(drop_path=r)` sets it per block, 0 to `r`.

    Call `block(x, return_attention_scores=True)` to also get the
    `(B, H, T, T)` attention weights.

    Example:

    ```python
    block = kr.EncoderBlock(num_heads=6, mlp_dim=1536, attention="relu")
    y, weights = block(tokens, return_attention_scores=True)   # tokens: (B, T, 384)
    ```
    """

    def __init__(self, num_heads, mlp_dim, attention=None, qk_norm=True,
                 mlp_activation="gelu_tanh", dropout=0.0, layer_scale=None,
                 layer_norm_epsilon=LN_EPS, remat=None, drop_path=0.0, **kwargs):
        super().__init__(num_heads, mlp_dim, attention, qk_norm, mlp_activation,
                         layer_norm_epsilon, **kwargs)
        self.dropout = check_rate(dropout, "dropout")
        self.drop_path = check_rate(drop_path, "drop_path")
        self.remat = remat_module.check(remat)
        self.layer_scale = None if layer_scale is None else float(layer_scale)
        policy = self.dtype_policy
        self.norm1 = self._norm("norm1")
        self.norm2 = self._norm("norm2")
        self.mlp = MLPBlock(mlp_dim, mlp_activation, self.dropout, name="mlp", dtype=policy)
        self.drop = keras.layers.Dropout(self.dropout, dtype=policy)
        # Made only when on: a layer draws its seed from Python's RNG, which
        # would move every later initialiser's draws for a given seed.
        self.stochastic_depth = (
            keras.layers.Dropout(self.drop_path, noise_shape=(None, 1, 1), dtype=policy)
            if self.drop_path else None)

    def _residual(self, y, which, training):
        y = self.drop(self._scale(y, which), training=training)
        if self.stochastic_depth is None:
            return y
        return self.stochastic_depth(y, training=training)

    def build(self, input_shape):
        self.attn = self._attention(input_shape[-1])
        self.norm1.build(input_shape)
        self.attn.build(input_shape, input_shape)
        self.norm2.build(input_shape)
        self.mlp.build(input_shape)
        if self.layer_scale is not None:
            init = keras.initializers.Constant(self.layer_scale)
            self.ls1 = self.add_weight(name="ls1", shape=(input_shape[-1],), initializer=init)
            self.ls2 = self.add_weight(name="ls2", shape=(input_shape[-1],), initializer=init)

    def _scale(self, y, which):
        if self.layer_scale is None:
            return y
        return y * ops.cast(getattr(self, which), y.dtype)

    def call(self, x, training=None, return_attention_scores=False):
        if self.remat and not return_attention_scores and not is_symbolic(x):
            return remat_module.rematerialised(lambda t: self._forward(t, training),
                                               self.remat, self)(x)
        return self._forward(x, training, return_attention_scores)

    def _forward(self, x, training=None, return_attention_scores=False):
        y = self.norm1(x)
        scores = None
        if return_attention_scores:
            y, scores = self.attn(y, y, training=training, return_attention_scores=True)
        else:
            y = self.attn(y, y, training=training)
        x = x + self._residual(y, "ls1", training)
        y = self.mlp(self.norm2(x), training=training)
        x = x + self._residual(y, "ls2", training)
        if return_attention_scores:
            return x, scores
        return x

    def get_config(self):
        return {**super().get_config(), "dropout": self.dropout,
                "layer_scale": self.layer_scale, "remat": self.remat,
                "drop_path": self.drop_path}


@keras.saving.register_keras_serializable(package="keras_reluvit")
class MAPHead(_AttentionOwner):
    """Multihead attention pooling (big_vision `MAPHead`).

    A learned probe attends over the tokens with the model's attention, then
    a residual MLP; returns `(B, D)`. Arguments as `EncoderBlock` (no dropout).
    """

    def __init__(self, num_heads, mlp_dim, attention=None, qk_norm=True,
                 mlp_activation="gelu_tanh", layer_norm_epsilon=LN_EPS, **kwargs):
        super().__init__(num_heads, mlp_dim, attention, qk_norm, mlp_activation,
                         layer_norm_epsilon, **kwargs)
        self.norm = self._norm("norm")
        self.mlp = MLPBlock(mlp_dim, mlp_activation, name="mlp", dtype=self.dtype_policy)

    def build(self, input_shape):
        width = input_shape[-1]
        self.probe = self.add_weight(name="probe", shape=(1, 1, width),
                                     initializer="glorot_uniform")
        self.attn = self._attention(width)
        self.attn.build((None, 1, width), input_shape)
        self.norm.build((None, 1, width))
        self.mlp.build((None, 1, width))

    def call(self, x):
        probe = ops.cast(self.probe, x.dtype)
        probe = ops.broadcast_to(probe, (ops.shape(x)[0], 1, ops.shape(x)[2]))
        y = self.attn(probe, x)
        y = y + self.mlp(self.norm(y))
        return y[:, 0]
