"""The model: the Vision Transformer and its parts, nothing of training.

- `vit`: `ViT`, the Keras model (its forward pass, intermediates, presets,
  `export`, `enable_lora`); `config`: its arguments checked and resolved;
- `layers`: the encoder block, MLP, class token, MAP head; `attention`:
  `PointwiseAttention` (softmax or `L^-alpha * h(q.k / sqrt(d))`);
  `attention_kinds`: the named attention settings; `activations`: the
  pointwise functions `h`; `posemb`: position embeddings and their resampling;
- `variants`: big_vision's sizes (`"S/16"`, ...); `zoo`: the builders
  (`ViT_S16`, ...) and weight transfer; `remat`: rematerialisation policies;
  `lora`: LoRA on a ViT's projections; `keywords`: unknown arguments refused,
  naming ours.

Floors below: `kernels/` (attention kernels) and `preprocessing/` (the
model's own image preprocessing). The packages above (`checkpoints/`,
`export`, `training/`, `distribution/`) attach to the model's methods
through `extensions` (`ViT.from_preset`, `ViT.export`, the train function):
this package imports none of them (tests/once/test_imports.py).
"""
