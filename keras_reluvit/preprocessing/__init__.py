"""How a model's images are prepared: resize, crop and normalise, as its
checkpoint was trained and evaluated.

A ViT carries this recipe in its config (`ViT(preprocessing=...)`, saved
with `.keras` files and presets); every checkpoint reader fills it from its
source (timm's `pretrained_cfg`, transformers' `preprocessor_config.json`,
keras-hub's `image_converter.json`, big_vision's eval pipeline), and it is
applied wherever images enter: `model.preprocessor(images)` /
`keras_reluvit.preprocess(model, images)` in a notebook, the SavedModel's
`serving_default` and `serve_bytes`, the tf.data pipelines of
`keras_reluvit.data` and `keras-reluvit eval | predict`.

The recipe (`ViT(preprocessing={...})`; every key optional):

- `resize`: `"shorter"` — the shorter side to `floor(size / crop_pct)`
  (the longer side in proportion, truncated), then a centre crop of
  `size` (timm's `crop_mode="center"`, transformers' `shortest_edge` +
  centre crop, big_vision's `resize_small | central_crop`);
  `"squash"` — both sides to `floor(size / crop_pct)`, then the centre crop
  (transformers' `{"height", "width"}` sizes, timm's `crop_mode="squash"`);
  `"crop_resize"` — the largest centred region of the model's aspect
  ratio, resized to `size` (keras-hub's `crop_to_aspect_ratio=True`);
  `"border"` — the longer side (relative to the model's) to
  `floor(size / crop_pct)`, the other in proportion (both rounded), then
  centre-cropped or padded with the mean colour `round(255 mean)` (timm's
  `crop_mode="border"`: `ResizeKeepRatio(longest=1)` + `CenterCropOrPad`).
- `crop_pct`: the crop's fraction of the resized image, in (0, 1].
- `interpolation`: `"bicubic"`, `"bilinear"` or `"area"` (box averaging,
  big_vision's and our own evaluation); Pillow's other filters
  `"nearest"`, `"box"`, `"hamming"` and `"lanczos"` (timm's names; Pillow's
  own weights, computed as its `precompute_coeffs` does).
- `antialias`: widen the bilinear / bicubic filter when downsampling, as
  PIL (and so timm and transformers) always do.
- `round_uint8`: round to uint8 after each resampling pass, as Pillow does
  on 8-bit images (timm, transformers' PIL backend): halves up
  (`floor(x + 0.5)`, Pillow's fixed-point rounding), clipped to [0, 255].
- `pass_order`: which pass runs first when `round_uint8`: `"pillow"` —
  Pillow 13's rule: vertical first when the height shrinks by more pixels
  than twice the width does (`H - h > max(0, 2 (W - w))`), else horizontal
  first; `"horizontal"` — always horizontal first (Pillow 12 and older).
- `clip`: clip the resized pixels to [0, 255] (bicubic overshoots at
  sharp edges). True for every source but keras-hub's bicubic converter,
  which keeps the overshoot.
- `alpha`: what becomes of a transparent image's alpha channel: `"drop"`
  (PIL's `convert("RGB")`: timm, big_vision, keras-hub) or `"white"`
  (composited onto white as Pillow's `alpha_composite` does:
  transformers' `convert_to_rgb`, `do_convert_rgb=True`). Applied to
  `[H, W, 4]` images given to the preprocessor and to every decoded file
  (`load_image`, `serve_bytes`, the data pipelines).
- `input_scale`: the pixel values `model.preprocessor` takes for float
  images: `255` (0-255 pixels, the default) or `1` ([0, 1] floats:
  transformers' `do_rescale=False`, whose processor is handed images
  already in [0, 1]); floats above 1 are then refused. uint8 images are
  0-255 pixels either way.
- `crop_offset`: `"floor"` (`(H - h) // 2`: transformers, big_vision,
  keras) or `"round"` (`round((H - h) / 2)`, half to even: torchvision's
  `CenterCrop`, i.e. timm).
- `resize_rounding`: how the resized size is made whole: `"floor"`
  (timm: `floor(size / crop_pct)`, the longer side truncated, as
  torchvision's `Resize`) or `"round"` (big_vision's `resize_small`: both
  rounded, half to even).
- `mean`, `std`: per channel, in units of [0, 1] pixels: the model takes
  `(pixel / 255 - mean) / std`. `[-1, 1]` (big_vision, ours) is
  mean = std = 0.5.

The default is our own (and big_vision's) evaluation recipe: `"shorter"`,
`crop_pct` 0.875 (224 of 256), `"area"`, `crop_offset="floor"`,
`resize_rounding="round"`, [-1, 1].

Modules: `recipe` (the keys and their check), `geometry` (resize targets,
crop boxes, pass order), `pillow` (Pillow's weights, passes, rounding and
compositing), `color` (RGB and normalisation), `keras_ops` and `tf_ops`
(the recipe in `keras.ops` and in TensorFlow graphs), `layer`
(`ImagePreprocessor`), `images` (decoding files) and `labels`.
"""


from keras_reluvit.preprocessing.color import normalise
from keras_reluvit.preprocessing.color import to_rgb
from keras_reluvit.preprocessing.geometry import border_fill
from keras_reluvit.preprocessing.geometry import plan
from keras_reluvit.preprocessing.geometry import resized_side
from keras_reluvit.preprocessing.geometry import vertical_first
from keras_reluvit.preprocessing.images import decode_image
from keras_reluvit.preprocessing.images import load_image
from keras_reluvit.preprocessing.labels import decode_predictions
from keras_reluvit.preprocessing.labels import imagenet1k_labels
from keras_reluvit.preprocessing.labels import probabilities
from keras_reluvit.preprocessing.layer import ImagePreprocessor
from keras_reluvit.preprocessing.layer import preprocess
from keras_reluvit.preprocessing.pillow import composite_on_white
from keras_reluvit.preprocessing.pillow import pillow_weights
from keras_reluvit.preprocessing.pillow import round_half_up
from keras_reluvit.preprocessing.recipe import ALPHA_RULES
from keras_reluvit.preprocessing.recipe import CROP_OFFSETS
from keras_reluvit.preprocessing.recipe import DEFAULT
from keras_reluvit.preprocessing.recipe import IMAGENET_MEAN
from keras_reluvit.preprocessing.recipe import IMAGENET_STD
from keras_reluvit.preprocessing.recipe import INTERPOLATIONS
from keras_reluvit.preprocessing.recipe import OPENAI_CLIP_MEAN
from keras_reluvit.preprocessing.recipe import OPENAI_CLIP_STD
from keras_reluvit.preprocessing.recipe import PASS_ORDERS
from keras_reluvit.preprocessing.recipe import PILLOW_FILTERS
from keras_reluvit.preprocessing.recipe import RESIZE_MODES
from keras_reluvit.preprocessing.recipe import check_preprocessing
from keras_reluvit.preprocessing.tf_ops import pillow_resize
from keras_reluvit.preprocessing.tf_ops import tf_preprocess
from keras_reluvit.preprocessing.tf_ops import tf_to_rgb

__all__ = ["ALPHA_RULES", "CROP_OFFSETS", "DEFAULT", "IMAGENET_MEAN", "IMAGENET_STD",
           "INTERPOLATIONS", "ImagePreprocessor", "OPENAI_CLIP_MEAN", "OPENAI_CLIP_STD",
           "PASS_ORDERS", "PILLOW_FILTERS", "RESIZE_MODES", "border_fill", "check_preprocessing",
           "pillow_resize",
           "composite_on_white", "decode_image", "decode_predictions", "imagenet1k_labels",
           "load_image", "normalise", "pillow_weights", "plan", "preprocess", "probabilities",
           "resized_side", "round_half_up", "tf_preprocess", "tf_to_rgb", "to_rgb",
           "vertical_first"]
