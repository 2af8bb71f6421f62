"""PyTorch fast paths for whole layers: fewer, larger kernels per block.

The PyTorch backend runs every op eagerly, one kernel each: Keras' `Dense`
is a matmul followed by a separate bias add, and `MultiHeadAttention`
projects q, k and v with three einsums (batched matmuls with copies) and
three bias adds. On PyTorch our layers instead call

- `linear(dense, x)` for the MLP's `Dense` layers: one
  `torch.nn.functional.linear` (an addmm, the bias fused; the `(in, out)`
  Keras kernel passed transposed, no copy);
- `project_qkv(layer, x)` and `project_output(layer, out)` for
  `PointwiseAttention` used as self-attention: q, k and v from *one* GEMM
  against the three kernels
  concatenated at call time (the weights keep MultiHeadAttention's
  `(D, H, Dh)` layout, so checkpoints, sharding rules and the other backends
  see nothing; the concatenation copies 3 D^2 floats per call), heads as
  views, qk-layernorm as in the layer; between them the layer calls
  `softmax_attention` (`F.scaled_dot_product_attention`: what
  `MultiHeadAttention` computes, scale `1/sqrt(Dh)`) or, for a pointwise
  activation, `pointwise_attention` (the one dispatch, `torch_fused` where
  eligible); the output projection is one GEMM.

`PointwiseAttention.call` and `MLPBlock.call` take these paths when
`enabled()`, the call is a plain one (self-attention, no mask of any kind,
no gate, no attention dropout while training, no scores returned) and every
projection layer involved is a plain float layer (`plain_dense`): a layer
that Keras has quantized (`quantize("int8" | "float8" | "int4")`), given LoRA
(`enable_lora`), or whose dtype policy is a quantized one computes something
these paths do not, so the call is Keras' own code, decided from the layers'
state on every call. Both are tested against Keras' code, outputs and
gradients (tests/test_attention.py, tests/test_finetune.py).
`kr.kernels.configure(torch_fast=False)` (or `KERAS_RELUVIT_TORCH_FAST=0`)
switches them off (for comparison).
"""


import keras

from keras_reluvit import _keras_compat as compat
from keras_reluvit.kernels.keras_ops import is_symbolic
from keras_reluvit.kernels.switches import setting


def enabled():
    return keras.backend.backend() == "torch" and setting("torch_fast")



def _weight(variable, dtype):
    w = variable.value
    return w if w.dtype == dtype else w.to(dtype)


def plain_dense(dense):
    """Whether `dense` (a `Dense` or `EinsumDense`) computes `x @ kernel +
    bias` from float variables that these paths can read: not quantized, no
    LoRA, no quantized dtype policy (each changes what `kernel` is)."""
    return (not getattr(dense, "lora_enabled", False)
            and getattr(dense, "quantization_mode", None) is None
            and getattr(dense.dtype_policy, "quantization_mode", None) is None
            and isinstance(compat.dense_kernel(dense), keras.Variable))


def dense_eligible(x, *denses):
    """The MLP's fast path: every one of `denses` plain and linear."""
    return (enabled() and not is_symbolic(x)
            and all(plain_dense(d) and d.activation in (None, keras.activations.linear)
                    for d in denses))


def linear(dense, x):
    import torch.nn.functional as F

    bias = None if dense.bias is None else _weight(dense.bias, x.dtype)
    return F.linear(x, _weight(dense.kernel, x.dtype).t(), bias)


def attention_eligible(layer, query, value, key, masks, return_scores, training,
                       use_causal_mask):
    return (enabled() and not is_symbolic(query) and value is query and key in (None, query)
            and len(query.shape) == 3 and tuple(layer.attention_axes or (1,)) == (1,)
            and not any(m is not None for m in masks) and not use_causal_mask
            and compat.keras_mask(query) is None
            and not return_scores and not compat.mha_use_gate(layer)
            and compat.mha_sliding_window(layer) is None
            and compat.mha_output_shape(layer) is None
            and layer.key_dim == layer.value_dim
            and not (training and layer.dropout > 0.0)
            and all(plain_dense(d) for d in (layer.query_dense, layer.key_dense,
                                             layer.value_dense, layer.output_dense)))


def project_qkv(layer, x):
    """`layer`'s queries, keys and values of `x` (self-attention) from one
    GEMM, as `(B, T, H, Dh)` views, qk-layernorm applied (see the module)."""
    import torch
    import torch.nn.functional as F

    b, t, d = x.shape
    h, dh = layer.num_heads, layer.key_dim
    denses = (layer.query_dense, layer.key_dense, layer.value_dense)
    kernel = torch.cat([_weight(p.kernel, x.dtype).reshape(d, h * dh) for p in denses], 1)
    bias = None
    if layer.use_bias:
        bias = torch.cat([_weight(p.bias, x.dtype).reshape(h * dh) for p in denses])
    qkv = F.linear(x, kernel.t(), bias).view(b, t, 3, h, dh)
    q, k, v = qkv.unbind(2)  # (B, T, H, Dh) views
    if layer._qk_norm:
        q, k = layer._query_norm(q), layer._key_norm(k)
    return q, k, v


def softmax_attention(q, k, v):
    """What `MultiHeadAttention` computes (scale `1/sqrt(Dh)`), through
    `F.scaled_dot_product_attention`; `(B, T, H, Dh)` in and out."""
    import torch.nn.functional as F

    return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                          v.transpose(1, 2)).transpose(1, 2)


def project_output(layer, out):
    """`layer`'s output projection of the `(B, T, H, Dh)` attention output,
    one GEMM."""
    import torch.nn.functional as F

    b, t, h, dh = out.shape
    proj = layer.output_dense
    bias = _weight(proj.bias, out.dtype) if layer.use_bias else None
    kernel = _weight(proj.kernel, out.dtype).reshape(h * dh, -1)
    return F.linear(out.reshape(b, t, h * dh), kernel.t(), bias)
