"""Pointwise attention: `a_ij = L^-alpha * h(q_i . k_j / sqrt(d))`.

The paper (Wortsman et al. 2023, arXiv 2309.08586) replaces the softmax of
dot-product attention by a pointwise activation `h` scaled by the sequence
length `L` to the power `-alpha`. With `h = relu` and `alpha = 1` ViTs match
softmax's accuracy-vs-compute curve.

This module holds the activation registry, the functional op
`pointwise_attention` (the one dispatch point every backend goes through) and
the `PointwiseAttention` layer, a drop-in subclass of
`keras.layers.MultiHeadAttention`.

**What `L` means under a mask.** The paper only trains unmasked ViTs, where
`L` is the number of keys. Here `L` is the number of keys *each query may
attend to*: with a padding or causal mask it is the count of unmasked keys in
that query's row (so a causal query at position `t` uses `L = t + 1`), never
the padded length. This keeps `E_j[a_ij] = O(1/L)` for every query, which is
the paper's argument for the factor, and makes outputs independent of how
much padding a batch carries. A query whose keys are all masked gets all-zero
weights and a zero attention output (before the output projection's bias).
"""

import math

import keras
from keras import ops

from keras_reluvit import _keras_compat as compat
from keras_reluvit import kernels
from keras_reluvit.kernels import torch_fast
from keras_reluvit.models.activations import ACTIVATION_NAMES  # noqa: F401 - kr.attention.ACTIVATION_NAMES
from keras_reluvit.models.activations import ACTIVATIONS  # noqa: F401 - kr.attention.ACTIVATIONS
from keras_reluvit.models.activations import SOFTMAX  # noqa: F401 - kr.attention.SOFTMAX
from keras_reluvit.models.activations import get_activation  # noqa: F401 - kr.attention.get_activation


def check_seq_len_exponent(seq_len_exponent):
    if isinstance(seq_len_exponent, bool) or not isinstance(
        seq_len_exponent, (int, float)
    ):
        raise ValueError(
            "`seq_len_exponent` (alpha) must be a real number >= 0, got "
            f"{seq_len_exponent!r}."
        )
    if not math.isfinite(seq_len_exponent) or seq_len_exponent < 0:
        raise ValueError(
            "`seq_len_exponent` (alpha) must be a finite number >= 0 (the "
            "paper sweeps alpha in [0, 1]); got "
            f"{seq_len_exponent!r}."
        )
    return float(seq_len_exponent)


def check_attention_args(activation="relu", seq_len_exponent=1.0, gated=False,
                         learned_scale=False, dropout=0.0):
    """Validates the pointwise-attention arguments (as `PointwiseAttention`
    and the ViT builders take them); returns `(name, fn, alpha)`."""
    name, fn = get_activation(activation)
    alpha = check_seq_len_exponent(seq_len_exponent)
    if learned_scale and name == SOFTMAX:
        raise ValueError(
            "`learned_scale=True` scales pointwise attention weights; "
            "softmax weights are normalised to sum to 1, so a learned "
            "scale is not defined for activation='softmax'."
        )
    check_rate(dropout, "dropout")
    return name, fn, alpha


def check_rate(value, what):
    """A dropout rate in [0, 1) (ViT, blocks and attention share it)."""
    try:
        ok = 0.0 <= float(value) < 1.0
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ValueError(f"`{what}` must be in [0, 1), got {value!r}.")
    return float(value)


def check_heads(width, num_heads):
    """`width` must split into `num_heads` heads of integer size."""
    if width % num_heads:
        raise ValueError(
            f"width {width} is not divisible by num_heads {num_heads} "
            "(key_dim = width / num_heads must be an integer).")
    return width // num_heads


QK_NORMS = (False, True, "scale", "affine")


def check_qk_norm(qk_norm):
    """`qk_norm` as stored: False, True (LayerNorm without bias, as Flax's
    `normalize_qk`; `"scale"` is an alias) or `"affine"` (with bias, timm)."""
    if qk_norm is None or qk_norm is False:
        return False
    if qk_norm is True or qk_norm == "scale":
        return True
    if qk_norm == "affine":
        return "affine"
    raise ValueError(
        f"`qk_norm` must be one of {QK_NORMS} (True: LayerNorm without bias on "
        f"per-head q and k; 'affine': with bias, as timm), got {qk_norm!r}."
    )


def check_chunk_size(chunk_size):
    if chunk_size not in (None, "auto") and (
        isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size <= 0
    ):
        raise ValueError(f"`chunk_size` must be None, 'auto' or a positive int, got {chunk_size!r}.")
    return chunk_size


def pointwise_attention(
    query,
    key,
    value,
    activation="relu",
    seq_len_exponent=1.0,
    mask=None,
    log_scale=None,
    dropout_fn=None,
    return_weights=False,
    chunk_size=None,
    implementation=None,
):
    """Pointwise attention on projected, multi-head tensors.

    The single dispatch point of keras-reluvit: every `PointwiseAttention`
    with a pointwise activation calls this function, which picks one of the
    paths of `keras_reluvit.kernels` by backend, activation, mask and shape
    (`kernels.choose`). All paths are tested against the generic `keras.ops`
    path, forward and gradient.

    Args:
        query: `(B, T, H, Dh)` projected queries (unscaled).
        key: `(B, S, H, Dh)` projected keys.
        value: `(B, S, H, Dv)` projected values.
        activation: an activation name of `ACTIVATIONS` or a callable `h`.
        seq_len_exponent: alpha >= 0; weights are scaled by `L^-alpha`.
        mask: optional boolean `(B, T, S)` (or broadcastable), True = attend,
            or a per-head `(B, H, T, S)` (broadcastable; the generic path
            computes it). `L` is then the number of True entries of each
            query's row (of its head).
        log_scale: optional `(H,)` per-head log-scale `s_h`; the weights are
            multiplied by `exp(s_h)`.
        dropout_fn: optional callable applied to the weights before they
            multiply the values (attention dropout).
        return_weights: also return the `(B, H, T, S)` weights.
        chunk_size: None (dense), an int (blocks of keys and queries of that
            size, summed: O(T * chunk) memory, rematerialised for training) or
            `"auto"` (chunk above 4096 x 4096 scores per head).
        implementation: force a path, a name of `kernels.PATHS`; default:
            the dispatch rule under the kernel switch (`kernels.set_kernel` /
            `KERAS_RELUVIT_KERNEL`).

    Returns:
        `(B, T, H, Dv)` outputs, and the weights if `return_weights`.
    """
    name, h = get_activation(activation)
    if h is None:
        raise ValueError(
            "pointwise_attention needs a pointwise activation, not softmax; "
            "use keras.ops.dot_product_attention for softmax."
        )
    alpha = check_seq_len_exponent(seq_len_exponent)
    query, key, value = (ops.convert_to_tensor(x) for x in (query, key, value))
    check_chunk_size(chunk_size)
    kernel_mask = None  # what the fused kernels read: a key mask stays (B, 1, S)
    per_head = False
    if mask is not None:
        mask = ops.cast(mask, "bool")
        while len(mask.shape) < 3:
            mask = ops.expand_dims(mask, 0)
        b, t_, h_ = ops.shape(query)[:3]
        if len(mask.shape) == 4:  # per-head, as MultiHeadAttention broadcasts it
            per_head = True
            mask = ops.broadcast_to(mask, (b, h_, t_, ops.shape(key)[1]))
            if implementation not in (None, "generic"):
                raise ValueError(f"implementation={implementation!r} takes no per-head mask; "
                                 "the generic path computes one.")
        elif len(mask.shape) != 3:
            raise ValueError(f"`mask` must be (B, T, S) or per-head (B, H, T, S) (or "
                             f"broadcastable), got shape {tuple(mask.shape)}.")
        else:
            kernel_mask = mask
            mask = ops.broadcast_to(mask, (b, t_, ops.shape(key)[1]))
    factor = kernels.row_factor(mask, ops.shape(key)[1], alpha, log_scale, query.dtype)
    out, weights = kernels.attend(query, key, value, name, h, mask, kernel_mask, factor,
                                  dropout_fn=dropout_fn, want_weights=return_weights,
                                  chunk_size=chunk_size, implementation=implementation,
                                  per_head=per_head)
    return (out, weights) if return_weights else out


@keras.saving.register_keras_serializable(package="keras_reluvit")
class PointwiseAttention(keras.layers.MultiHeadAttention):
    """Multi-head attention with softmax or a pointwise activation.

    Attention weights are `a_ij = exp(s_h) * L^-alpha * h(q_i . k_j / sqrt(d))`
    (`s_h` only with `learned_scale`), or the usual softmax. The layer is a
    subclass of and a drop-in for `keras.layers.MultiHeadAttention`: same call
    signature, same `query`/`key`/`value`/`attention_output` EinsumDense
    weights of shapes `(D, H, Dh)` and `(H, Dh, D)`. With
    `activation="softmax"` it computes exactly what `MultiHeadAttention`
    computes (through the same code path).

    `L` is the number of keys each query may attend to: with an
    `attention_mask` (padding or causal) the count of unmasked keys in that
    query's row, not the padded length. A query with no key to attend to gets
    a zero output. Inputs of rank > 3 attend over `attention_axes` as in
    `MultiHeadAttention` (2-D attention over a grid, factorised attention);
    `L` then counts the keys over all attended axes.

    Args:
        num_heads: number of attention heads.
        key_dim: size of each head for query and key.
        value_dim: size of each head for value; defaults to `key_dim`.
        activation: `"softmax"` (the baseline; `seq_len_exponent` is then
            ignored), `"relu"`, `"relu2"`, `"gelu"`, `"softplus"`,
            `"identity"`, `"relu6"`, `"sigmoid"`, or any callable.
        seq_len_exponent: alpha >= 0 in `L^-alpha`. Default 1.0 (the paper's
            ReLU/L); 0 is the unscaled "prior work" variant.
        qk_norm: LayerNorm over the head dimension of the projected queries
            and keys: `True` (or `"scale"`) without bias (ViT-22B; Flax
            `normalize_qk`), `"affine"` with a bias too (timm's `q_norm` /
            `k_norm`), `False` for none.
        qk_norm_epsilon: epsilon of those LayerNorms (default 1e-6).
        gated: the paper's Figure 4 gate: the attention output is multiplied by
            `sigmoid(W_g x + b_g)` (per head) before the output projection.
            `use_gate` (the `MultiHeadAttention` name) is an alias.
        learned_scale: a trainable per-head log-scale `s_h` (initialised at 0)
            multiplying the weights by `exp(s_h)`: the paper's open question
            whether `L^-1` can be learned. Not allowed with softmax.
        dropout: dropout rate on the attention weights.
        use_bias: whether the projections have biases.
        output_shape: output size (int or tuple); defaults to the query's last
            dimension.
        chunk_size: None (dense), an int or `"auto"`: memory-light attention
            over blocks of keys (summed) and queries; see
            `pointwise_attention`.
        attention_axes: as `MultiHeadAttention` (default: every axis between
            batch and features).
        flash_attention: softmax: `MultiHeadAttention`'s switch. Pointwise
            activations: `None` / `False` only (`True` names a softmax
            kernel; ours are chosen by `KERAS_RELUVIT_KERNEL`).
        **kwargs: the other `keras.layers.MultiHeadAttention` arguments
            (`sliding_window`, initializers, regularizers, constraints,
            `seed`, `name`, `dtype`).

    Example:

    >>> import numpy as np
    >>> layer = PointwiseAttention(num_heads=6, key_dim=64, activation="relu")
    >>> x = np.random.normal(size=(2, 197, 384)).astype("float32")
    >>> y = layer(x, x)
    >>> tuple(y.shape)
    (2, 197, 384)
    >>> y, w = layer(x, x, return_attention_scores=True)
    >>> tuple(w.shape)
    (2, 6, 197, 197)
    """

    def __init__(
        self,
        num_heads,
        key_dim,
        value_dim=None,
        activation="relu",
        seq_len_exponent=1.0,
        qk_norm=False,
        gated=False,
        learned_scale=False,
        dropout=0.0,
        use_bias=True,
        qk_norm_epsilon=1e-6,
        output_shape=None,
        chunk_size=None,
        **kwargs,
    ):
        gated = bool(gated or kwargs.pop("use_gate", False))
        flash_attention = kwargs.pop("flash_attention", None)
        softmax = isinstance(activation, str) and activation == SOFTMAX
        # The base initialiser first (with MultiHeadAttention's own checks and
        # errors), so that an error of ours below leaves a layer whose repr
        # works inside the traceback.
        super().__init__(
            num_heads=num_heads,
            key_dim=key_dim,
            value_dim=value_dim,
            dropout=dropout,
            use_bias=use_bias,
            output_shape=output_shape,
            use_gate=gated,
            flash_attention=flash_attention if softmax else False,
            **kwargs,
        )
        self._chunk_size = check_chunk_size(chunk_size)
        self._activation_name, self._activation_fn, self._seq_len_exponent = check_attention_args(
            activation, seq_len_exponent, learned_scale=learned_scale, dropout=dropout)
        if flash_attention and self._activation_name != SOFTMAX:
            raise ValueError(
                "`flash_attention=True` selects a softmax kernel of "
                "MultiHeadAttention; it does not apply to pointwise attention, "
                "whose fused kernels (Pallas, Triton, the CPU kernels) are "
                "chosen by KERAS_RELUVIT_KERNEL / kr.set_kernel. Leave it unset "
                "or False."
            )
        self._activation = activation
        if self._activation_name != SOFTMAX:
            # MultiHeadAttention reads Keras' global flash switch; pointwise
            # attention never takes the softmax flash path. Softmax keeps
            # MultiHeadAttention's choice (None: the backend decides, e.g.
            # cuDNN's flash attention for 16-bit inputs on a JAX GPU).
            compat.disable_flash_attention(self)
        self._qk_norm = check_qk_norm(qk_norm)
        self._qk_norm_epsilon = float(qk_norm_epsilon)
        self._gated = gated
        self._learned_scale = bool(learned_scale)

    @property
    def activation(self):
        return self._activation

    @property
    def seq_len_exponent(self):
        return self._seq_len_exponent

    @property
    def qk_norm(self):
        return self._qk_norm

    @property
    def gated(self):
        return self._gated

    @property
    def learned_scale(self):
        return self._learned_scale

    @property
    def is_softmax(self):
        return self._activation_name == SOFTMAX

    def build(self, query_shape, value_shape, key_shape=None):
        super().build(query_shape, value_shape, key_shape)
        if self._qk_norm:
            norm_kwargs = dict(
                axis=-1,
                epsilon=self._qk_norm_epsilon,
                center=self._qk_norm == "affine",
                dtype=self.dtype_policy,
            )
            self._query_norm = keras.layers.LayerNormalization(
                name="query_norm", **norm_kwargs
            )
            self._key_norm = keras.layers.LayerNormalization(
                name="key_norm", **norm_kwargs
            )
            # Projected q / k: the input's axes, then (heads, key_dim).
            lead = (None,) * (len(query_shape) - 1)
            self._query_norm.build(lead + (self.num_heads, self.key_dim))
            self._key_norm.build(lead + (self.num_heads, self.key_dim))
        if self._learned_scale:
            self.log_scale = self.add_weight(
                name="log_scale",
                shape=(self.num_heads,),
                initializer="zeros",
                trainable=True,
            )

    def call(self, query, value, key=None, query_mask=None, value_mask=None, key_mask=None,
             attention_mask=None, return_attention_scores=False, training=None,
             use_causal_mask=False):
        if torch_fast.attention_eligible(
                self, query, value, key, (query_mask, value_mask, key_mask, attention_mask),
                return_attention_scores, training, use_causal_mask):
            q, k, v = torch_fast.project_qkv(self, query)
            if self.is_softmax:
                out = torch_fast.softmax_attention(q, k, v)
            else:
                out = pointwise_attention(
                    q, k, v, activation=self._activation_name or self._activation_fn,
                    seq_len_exponent=self._seq_len_exponent,
                    log_scale=self.log_scale if self._learned_scale else None,
                    chunk_size=self._chunk_size)
            return torch_fast.project_output(self, out)
        return super().call(query, value, key=key, query_mask=query_mask,
                            value_mask=value_mask, key_mask=key_mask,
                            attention_mask=attention_mask,
                            return_attention_scores=return_attention_scores,
                            training=training, use_causal_mask=use_causal_mask)

    def _compute_attention(
        self,
        query,
        key,
        value,
        attention_mask=None,
        training=None,
        return_attention_scores=False,
        use_causal_mask=False,
    ):
        # The one hook MultiHeadAttention.call offers after the projections:
        # masks (explicit, causal, Keras masks), the gate and the output
        # projection stay MultiHeadAttention's own code.
        if self._qk_norm:
            query = self._query_norm(query)
            key = self._key_norm(key)
        if self.is_softmax:
            return super()._compute_attention(
                query,
                key,
                value,
                attention_mask=attention_mask,
                training=training,
                return_attention_scores=return_attention_scores,
                use_causal_mask=use_causal_mask,
            )
        dropout_fn = None
        if self.dropout > 0.0:

            def dropout_fn(w):
                return compat.attention_dropout(self, w, training)

        if len(query.shape) != 4 or tuple(self.attention_axes) != (1,):
            return self._attention_nd(query, key, value, attention_mask, dropout_fn,
                                      return_attention_scores)
        out = pointwise_attention(
            query,
            key,
            value,
            # The name where there is one: the dispatch rule picks paths by name.
            activation=self._activation_name or self._activation_fn,
            seq_len_exponent=self._seq_len_exponent,
            mask=attention_mask,
            log_scale=self.log_scale if self._learned_scale else None,
            dropout_fn=dropout_fn,
            return_weights=return_attention_scores,
            chunk_size=self._chunk_size,
        )
        if return_attention_scores:
            return out
        return out, None

    def _attention_nd(self, query, key, value, mask, dropout_fn, return_scores):
        """Pointwise attention over any `attention_axes` of `(B, d1, ..., dn,
        H, Dh)` projections: the other axes join the batch, the attended ones
        are flattened into one sequence (in `attention_axes` order, as
        MultiHeadAttention's einsums order them), and `pointwise_attention`
        computes the `(B', T, H, Dh)` problem, so `L` counts the unmasked
        keys over all attended axes. The mask broadcasts as MultiHeadAttention
        broadcasts it: `(<batch dims>, <query axes>, <key axes>)`, leading
        batch dims optional, or per head `(<batch dims>, heads, <query
        axes>, <key axes>)`."""
        rank = len(query.shape)
        attn = tuple(self.attention_axes)
        free = tuple(a for a in range(1, rank - 2) if a not in attn)
        perm = (0, *free, *attn, rank - 2, rank - 1)

        q_shape, k_shape = ops.shape(query), ops.shape(key)
        q_attn = [q_shape[a] for a in attn]
        k_attn = [k_shape[a] for a in attn]
        batch = [q_shape[0], *(q_shape[a] for a in free)]
        t, s = math.prod(q_attn), math.prod(k_attn)  # the flattened sequence lengths

        def flat(x, n):
            shape = ops.shape(x)
            return ops.reshape(ops.transpose(x, perm), (-1, n, shape[rank - 2], shape[rank - 1]))

        if mask is not None:
            mask = ops.cast(mask, "bool")
            n_attn = len(attn)
            target = len(batch) + 2 * n_attn  # scores without the head axis
            while len(mask.shape) < target:
                mask = ops.expand_dims(mask, -2 * n_attn - 1)
            if len(mask.shape) > target + 1:
                raise ValueError(
                    f"`attention_mask` of shape {tuple(mask.shape)} has more axes than "
                    f"(<batch dims>, heads, <query attention dims>, <key attention dims>) = "
                    f"{tuple(batch + [self.num_heads] + q_attn + k_attn)}.")
            heads = [self.num_heads] if len(mask.shape) == target + 1 else []  # per-head
            mask = ops.broadcast_to(mask, (*batch, *heads, *q_attn, *k_attn))
            mask = ops.reshape(mask, (-1, *heads, t, s))
        out = pointwise_attention(
            flat(query, t), flat(key, s), flat(value, s),
            activation=self._activation_name or self._activation_fn,
            seq_len_exponent=self._seq_len_exponent, mask=mask,
            log_scale=self.log_scale if self._learned_scale else None,
            dropout_fn=dropout_fn, return_weights=return_scores,
            chunk_size=self._chunk_size)
        out, weights = out if return_scores else (out, None)
        dv = ops.shape(value)[rank - 1]
        out = ops.reshape(out, (*batch, *q_attn, self.num_heads, dv))
        inverse = [0] * rank
        for i, p in enumerate(perm):
            inverse[p] = i
        out = ops.transpose(out, inverse)
        if weights is not None:  # (B', H, T, S) -> (<batch dims>, H, <q axes>, <k axes>)
            weights = ops.reshape(weights, (*batch, self.num_heads, *q_attn, *k_attn))
        return out, weights

    def compute_output_spec(self, query, value, key=None, query_mask=None, value_mask=None,
                            key_mask=None, attention_mask=None, return_attention_scores=False,
                            training=None, use_causal_mask=False):
        """MultiHeadAttention's, with the scores' symbolic shape right for
        every input (MultiHeadAttention's assumes rank 3 and `T == S`):
        `(<batch dims>, heads, <query attention dims>, <key attention dims>)`."""
        out = super().compute_output_spec(query, value, key)
        if not return_attention_scores:
            return out
        rank = len(query.shape)
        axes = self.attention_axes
        axes = tuple(range(1, rank - 1)) if axes is None else tuple(
            a if a >= 0 else rank + a for a in axes)
        free = [query.shape[a] for a in range(1, rank - 1) if a not in axes]
        source = value if key is None else key
        shape = (query.shape[0], *free, self.num_heads, *(query.shape[a] for a in axes),
                 *(source.shape[a] for a in axes))
        return out, keras.KerasTensor(shape, dtype=self.compute_dtype)

    def _make_output_dense(self, query_shape, common_kwargs, name=None):
        # An initializer given DenseGeneral fans for the (D, H, Dh) q/k/v
        # kernels (input_axes=[0]) gets them for the (H, Dh, D) output kernel
        # too: fan_in = H * Dh, fan_out = D, as Flax computes them.
        init = common_kwargs.get("kernel_initializer")
        if getattr(init, "input_axes", None) == [0]:
            config = init.get_config()
            config.update(input_axes=[0, 1], output_axes=[2])
            common_kwargs = {
                **common_kwargs,
                "kernel_initializer": init.__class__.from_config(config),
            }
        return super()._make_output_dense(query_shape, common_kwargs, name)

    def get_config(self):
        config = super().get_config()
        for k in ("use_gate", "flash_attention"):
            config.pop(k, None)
        activation = self._activation
        if callable(activation):
            activation = keras.saving.serialize_keras_object(activation)
        config.update(
            activation=activation,
            seq_len_exponent=self._seq_len_exponent,
            qk_norm=self._qk_norm,
            qk_norm_epsilon=self._qk_norm_epsilon,
            gated=self._gated,
            learned_scale=self._learned_scale,
            chunk_size=self._chunk_size,
        )
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        if isinstance(config.get("activation"), dict):
            config["activation"] = keras.saving.deserialize_keras_object(
                config["activation"]
            )
        return super().from_config(config)
