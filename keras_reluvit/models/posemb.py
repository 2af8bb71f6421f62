"""The position embedding of a ViT and its resampling (as timm's
`layers/pos_embed.py`): the learned or fixed 2-D sin-cos embedding layer,
and `resample_posemb`, which moves a learned embedding to another patch
grid (bilinear as big_vision, bicubic as timm, bicubic with antialiasing as
torch's `antialias=True`) for other resolutions and checkpoints.
"""

import math

import keras
import numpy as np
from keras import ops

POSEMB_RESAMPLING = ("bilinear", "bicubic", "bicubic_antialias")


def _cubic(x, a):
    """Keys' cubic convolution kernel."""
    x = abs(x)
    if x < 1:
        return ((a + 2) * x - (a + 3)) * x * x + 1
    if x < 2:
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
    return 0.0


def _bicubic_matrix(n_in, n_out):
    """`(n_out, n_in)` weights of PyTorch's `interpolate(mode="bicubic",
    align_corners=False)` along one axis: four taps of Keys' cubic with
    a = -0.75 around each source position, edge samples repeated."""
    scale = n_in / n_out
    m = np.zeros((n_out, n_in))
    for i in range(n_out):
        x = (i + 0.5) * scale - 0.5
        x0 = math.floor(x)
        for k in range(-1, 3):
            m[i, min(max(x0 + k, 0), n_in - 1)] += _cubic(x - (x0 + k), -0.75)
    return m


def _bicubic_antialias_matrix(n_in, n_out):
    """`(n_out, n_in)` weights of PyTorch's `interpolate(mode="bicubic",
    antialias=True, align_corners=False)` along one axis (PIL's separable
    filter: Keys' cubic with a = -0.5, widened by the scale when shrinking,
    each row normalised)."""
    def cubic(x):
        return _cubic(x, -0.5)

    scale = n_in / n_out
    support = 2.0 * scale if scale >= 1 else 2.0
    inv = 1.0 / scale if scale >= 1 else 1.0
    m = np.zeros((n_out, n_in))
    for i in range(n_out):
        center = scale * (i + 0.5)
        lo = max(int(center - support + 0.5), 0)
        hi = min(int(center + support + 0.5), n_in)
        w = np.array([cubic((j + lo - center + 0.5) * inv) for j in range(hi - lo)])
        m[i, lo:hi] = w / w.sum()
    return m


def resample_posemb(posemb, new_grid, old_grid=None, num_prefix_tokens=0,
                    method="bilinear"):
    """Resamples a `(1, prefix + h*w, D)` position embedding to `new_grid`.

    As big_vision's high-resolution fine-tuning: prefix (class token) rows are
    kept, the patch grid is resized. `old_grid` defaults to a square grid.
    `method`: `"bilinear"` (big_vision's), `"bicubic"` (PyTorch's
    `interpolate(mode="bicubic")`, as transformers' DINOv2 at run time) or
    `"bicubic_antialias"` (with `antialias=True`, as timm and transformers'
    DINOv2-with-registers); the bicubic ones computed here in float64, no
    torch needed.
    """
    if method not in POSEMB_RESAMPLING:
        raise ValueError(f"Unknown posemb resampling {method!r}; valid: "
                         f"{', '.join(POSEMB_RESAMPLING)}.")
    posemb = np.asarray(posemb, dtype="float32")
    prefix, grid = (
        posemb[:, :num_prefix_tokens],
        posemb[:, num_prefix_tokens:],
    )
    n = grid.shape[1]
    if old_grid is None:
        side = int(round(math.sqrt(n)))
        if side * side != n:
            raise ValueError(
                f"Cannot infer the grid of a position embedding with {n} "
                "patch positions; pass old_grid=(h, w)."
            )
        old_grid = (side, side)
    old_grid, new_grid = tuple(old_grid), tuple(new_grid)
    if old_grid[0] * old_grid[1] != n:
        raise ValueError(f"old_grid {old_grid} does not hold {n} positions.")
    if old_grid != new_grid and method != "bilinear":
        weights = _bicubic_matrix if method == "bicubic" else _bicubic_antialias_matrix
        rows = weights(old_grid[0], new_grid[0])
        cols = weights(old_grid[1], new_grid[1])
        grid = grid.reshape(*old_grid, -1).astype("float64")
        grid = np.einsum("ih,hwd,jw->ijd", rows, grid, cols).astype("float32")
        grid = grid.reshape(1, new_grid[0] * new_grid[1], -1)
    elif old_grid != new_grid:
        grid = grid.reshape(1, *old_grid, -1)
        grid = keras.ops.convert_to_numpy(
            keras.ops.image.resize(
                grid, new_grid, interpolation="bilinear", antialias=False
            )
        )
        grid = grid.reshape(1, new_grid[0] * new_grid[1], -1)
    return np.concatenate([prefix, grid], axis=1)


def sincos2d_posemb(grid_h, grid_w, width, temperature=10000.0):
    """MoCo v3 / big_vision 2-D sin-cos embedding, `(grid_h * grid_w, width)`.

    Channel order is `[sin x, cos x, sin y, cos y]`; `width % 4 == 0`.
    """
    if width % 4:
        raise ValueError(
            f"posemb='sincos2d' needs a width divisible by 4, got {width}."
        )
    y, x = np.mgrid[:grid_h, :grid_w]
    quarter = width // 4
    omega = np.arange(quarter) / max(quarter - 1, 1)
    omega = 1.0 / (temperature**omega)
    y = np.einsum("m,d->md", y.flatten(), omega)
    x = np.einsum("m,d->md", x.flatten(), omega)
    pe = np.concatenate([np.sin(x), np.cos(x), np.sin(y), np.cos(y)], axis=1)
    return pe.astype("float32")


@keras.saving.register_keras_serializable(package="keras_reluvit")
class PositionEmbedding(keras.layers.Layer):
    """Adds a position embedding to `(B, prefix + gh * gw, D)` tokens.

    Args:
        grid_size: `(gh, gw)` patch grid.
        kind: `"learn"` (a `(1, prefix + gh*gw, D)` weight, normal(1/sqrt(D)))
            or `"sincos2d"` (fixed; the prefix tokens get zeros).
        num_prefix_tokens: tokens before the patches (1 with a class token).
            A learned embedding then covers them too, as in the original ViT,
            timm and keras-hub, so their checkpoints map one to one.
    """

    def __init__(self, grid_size, kind="learn", num_prefix_tokens=0, **kwargs):
        super().__init__(**kwargs)
        if kind not in ("learn", "sincos2d"):
            raise ValueError(
                f"Unknown posemb {kind!r}; valid: 'learn', 'sincos2d'."
            )
        self.grid_size = tuple(int(g) for g in grid_size)
        self.kind = kind
        self.num_prefix_tokens = int(num_prefix_tokens)

    def build(self, input_shape):
        width = input_shape[-1]
        n = self.num_prefix_tokens + self.grid_size[0] * self.grid_size[1]
        if self.kind == "learn":
            self.embedding = self.add_weight(
                name="embedding",
                shape=(1, n, width),
                initializer=keras.initializers.RandomNormal(
                    stddev=1.0 / math.sqrt(width)
                ),
            )
        else:
            pe = sincos2d_posemb(*self.grid_size, width)
            pe = np.concatenate(
                [np.zeros((self.num_prefix_tokens, width), "float32"), pe]
            )
            self._fixed = pe[None]

    def call(self, x):
        if self.kind == "learn":
            pe = self.embedding
        else:
            pe = ops.convert_to_tensor(self._fixed)
        return x + ops.cast(pe, x.dtype)

    def get_config(self):
        return {
            **super().get_config(),
            "grid_size": self.grid_size,
            "kind": self.kind,
            "num_prefix_tokens": self.num_prefix_tokens,
        }
