"""The Hugging Face side of tests/test_hf_checkpoints.py, run in a child
process (transformers imports torch and, on a TensorFlow test process, would
share it with TensorFlow; a child keeps each library in its own process).

    python hf_reference.py make OUT      # save_pretrained directories + reference outputs
    python hf_reference.py logits DIR X.npy OUT.npy   # ViTForImageClassification.from_pretrained(DIR)
    python hf_reference.py readme OUT    # the directories the README's examples name, tiny
    python hf_reference.py photos OUT JPEG...   # classifiers + image processors, on photographs
    python hf_reference.py float-resize IN.npz OUT.npz   # torch's resize of float images

`make` builds small models of every supported architecture with transformers
itself, perturbs every parameter (so zero-initialised tokens, unit LayerNorms
and LayerScale carry information), writes each with `save_pretrained` and
saves what transformers computes on one batch to `OUT/reference.npz`.
"""

import os
import sys

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers as T  # noqa: E402

SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, image_size=32,
             patch_size=8)


def images(size=32):
    return np.random.default_rng(size).uniform(-1, 1, (2, size, size, 3)).astype("float32")


# Models also run at other image sizes (transformers' DINOv2 resamples its
# position embedding at run time: bicubic, antialiased).
OTHER_SIZES = {"dinov2": (48, 16), "dinov2_registers": (24,)}


def pixels(x):
    return torch.from_numpy(np.ascontiguousarray(x.transpose(0, 3, 1, 2)))


def perturbed(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g))
    return model.eval()


def clip_config():
    vision = dict(SMALL, intermediate_size=64)
    text = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                vocab_size=99, max_position_embeddings=16)
    return T.CLIPConfig(text_config=text, vision_config=vision, projection_dim=16)


# name -> (model class, config, what transformers computes, save kwargs)
CASES = {
    "vit": (T.ViTForImageClassification, T.ViTConfig(**SMALL, intermediate_size=64, num_labels=5),
            lambda m, px: m(px).logits, {}),
    "vit_sharded": (T.ViTForImageClassification,
                    T.ViTConfig(**SMALL, intermediate_size=64, num_labels=5),
                    lambda m, px: m(px).logits, {"max_shard_size": "20KB"}),
    "vit_tanh_nobias": (T.ViTForImageClassification,
                        T.ViTConfig(**SMALL, intermediate_size=48, num_labels=3, qkv_bias=False,
                                    hidden_act="gelu_pytorch_tanh", layer_norm_eps=1e-6),
                        lambda m, px: m(px).logits, {}),
    "vit_model_pooler": (T.ViTModel, T.ViTConfig(**SMALL, intermediate_size=64),
                         lambda m, px: m(px).pooler_output, {}),
    "deit": (T.DeiTForImageClassification, T.DeiTConfig(**SMALL, intermediate_size=64, num_labels=5),
             lambda m, px: m(px).logits, {}),
    "deit_teacher": (T.DeiTForImageClassificationWithTeacher,
                     T.DeiTConfig(**SMALL, intermediate_size=64, num_labels=5),
                     lambda m, px: m.deit(px).last_hidden_state[:, 0], {}),
    "dinov2": (T.Dinov2ForImageClassification, T.Dinov2Config(**SMALL, mlp_ratio=2, num_labels=5),
               lambda m, px: m(px).logits, {}),
    "dinov2_model": (T.Dinov2Model, T.Dinov2Config(**SMALL, mlp_ratio=2),
                     lambda m, px: m(px).pooler_output, {}),
    "dinov2_registers": (T.Dinov2WithRegistersForImageClassification,
                         T.Dinov2WithRegistersConfig(**SMALL, mlp_ratio=2, num_register_tokens=2,
                                                     num_labels=5),
                         lambda m, px: m(px).logits, {}),
    "clip_vision": (T.CLIPVisionModelWithProjection,
                    T.CLIPVisionConfig(**SMALL, intermediate_size=64, projection_dim=16),
                    lambda m, px: m(px).image_embeds, {}),
    "clip": (T.CLIPModel, clip_config(),
             lambda m, px: m.visual_projection(m.vision_model(px).pooler_output), {}),
}


def make(out):
    x = images()
    ref = {"images": x}
    for i, (name, (cls, config, compute, save)) in enumerate(CASES.items()):
        torch.manual_seed(i)
        model = perturbed(cls(config), seed=100 + i)
        model.save_pretrained(os.path.join(out, name), **save)
        with torch.no_grad():
            ref[name] = compute(model, pixels(x)).double().numpy()
            for size in OTHER_SIZES.get(name, ()):
                ref[f"{name}@{size}"] = compute(model, pixels(images(size))).double().numpy()
                ref[f"images@{size}"] = images(size)
    np.savez(os.path.join(out, "reference.npz"), **ref)


def logits(directory, x_path, out_path):
    model = T.ViTForImageClassification.from_pretrained(directory).eval()
    with torch.no_grad():
        np.save(out_path, model(pixels(np.load(x_path))).logits.double().numpy())


def readme(out):
    """Tiny stand-ins, written by transformers, for the hub directories the
    README loads (its text names them; the test runs it unchanged)."""
    small = dict(SMALL, image_size=32)
    for name, model in {
        "google-vit-base-patch16-224": T.ViTForImageClassification(
            T.ViTConfig(**small, intermediate_size=64, num_labels=5)),
        "facebook-dinov2-small": T.Dinov2Model(T.Dinov2Config(**small, mlp_ratio=2)),
        "facebook-deit-small-patch16-224": T.DeiTForImageClassification(
            T.DeiTConfig(**small, intermediate_size=64, num_labels=5)),
        "openai-clip-vit-base-patch32": T.CLIPModel(clip_config()),
    }.items():
        model.save_pretrained(os.path.join(out, name))


# name -> (model, image processor) as the hub has them at 224 px: ViT squashes
# to 224 (bilinear), DeiT squashes to 256 and crops 224 (bicubic, ImageNet
# mean/std), CLIP resizes the shortest edge to 224 and crops (bicubic, OpenAI
# mean/std). Tiny widths, the real input geometry.
NAMES = ["tench", "goldfish", "great white shark", "cock", "hen", "ostrich", "junco"]


def photo_cases():
    labels = dict(id2label=dict(enumerate(NAMES)), label2id={n: i for i, n in enumerate(NAMES)})
    at224 = dict(SMALL, image_size=224, patch_size=16)
    return {
        "vit": (T.ViTForImageClassification(T.ViTConfig(**at224, intermediate_size=64,
                                                         **labels)),
                T.ViTImageProcessorPil()),
        "deit": (T.DeiTForImageClassification(T.DeiTConfig(**at224, intermediate_size=64,
                                                           **labels)),
                 T.DeiTImageProcessorPil()),
        "clip": (T.CLIPVisionModelWithProjection(T.CLIPVisionConfig(
                     **at224, intermediate_size=64, projection_dim=7)),
                 T.CLIPImageProcessorPil()),
        # DINOv2 as the hub has it: configured at 518 px, its processor gives
        # 224 (shortest edge 256, crop 224, bicubic, do_convert_rgb), the
        # position embedding resampled at run time.
        "dinov2": (T.Dinov2ForImageClassification(T.Dinov2Config(
                       **dict(at224, image_size=518, patch_size=14), mlp_ratio=2, **labels)),
                   T.BitImageProcessorPil(size={"shortest_edge": 256},
                                          crop_size={"height": 224, "width": 224},
                                          image_mean=[0.485, 0.456, 0.406],
                                          image_std=[0.229, 0.224, 0.225])),
    }


def photos(out, *files):
    """Each case written with `save_pretrained` (model and image processor)
    and what transformers computes from the image files, opened with PIL as
    its docs show: softmax of the logits (CLIP: of the projection). Files
    after `--convert-rgb` (grayscale, RGBA) go only to the processors that
    convert images to RGB (`do_convert_rgb`), under `NAME/convert_rgb`."""
    from PIL import Image

    cut = files.index("--convert-rgb") if "--convert-rgb" in files else len(files)
    groups = {"": files[:cut], "/convert_rgb": files[cut + 1:]}
    ref = {}
    torch.manual_seed(0)  # the models' initial weights: the same reference every run
    for i, (name, (model, processor)) in enumerate(photo_cases().items()):
        model = perturbed(model, seed=200 + i)
        model.save_pretrained(os.path.join(out, name))
        processor.save_pretrained(os.path.join(out, name))
        for suffix, group in groups.items():
            if not group or (suffix and not getattr(processor, "do_convert_rgb", False)):
                continue
            for j, path in enumerate(group):  # one by one: the files differ in size
                px = processor(images=[Image.open(path)], return_tensors="pt")["pixel_values"]
                with torch.no_grad():
                    o = model(px)
                    z = (o.image_embeds if name == "clip" else o.logits).double()
                ref[f"{name}{suffix}/{j}"] = torch.softmax(z, -1).numpy()[0]
                ref[f"{name}{suffix}/{j}/pixels"] = px.numpy().transpose(0, 2, 3, 1)[0]
    np.savez(os.path.join(out, "photos.npz"), **ref)


def float_resize(in_path, out_path):
    """What transformers' default (torchvision) backend does with the [0, 1]
    float images a `do_rescale=False` processor is handed, in torch's own
    ops: `interpolate(mode, antialias=True)` of the float image (no
    rounding, no clipping), to `size` (squash) or the shortest edge to
    `size` (the other `int(size * long / short)`), centre crop `crop` with
    offsets (H - h) // 2, normalise. IN holds `image/K` ([H, W, 3] floats)
    and `spec/K` = (size, crop or 0, shortest edge 0/1, bicubic 0/1, mean x3,
    std x3); OUT holds `pixels/K` ([h, w, 3])."""
    data = np.load(in_path)
    out = {}
    for key in [k for k in data if k.startswith("image/")]:
        name = key.split("/", 1)[1]
        size, crop, shortest, bicubic, *ms = data[f"spec/{name}"].tolist()
        x = torch.from_numpy(data[key].astype("float32")).permute(2, 0, 1)[None]
        h, w = x.shape[-2:]
        if shortest:
            short, long = min(h, w), max(h, w)
            other = int(size * long / short)
            nh, nw = (int(size), other) if h <= w else (other, int(size))
        else:
            nh = nw = int(size)
        y = torch.nn.functional.interpolate(x, (nh, nw), mode="bicubic" if bicubic else "bilinear",
                                            antialias=True, align_corners=False)
        if crop:
            top, left = (nh - int(crop)) // 2, (nw - int(crop)) // 2
            y = y[..., top:top + int(crop), left:left + int(crop)]
        mean, std = torch.tensor(ms[:3]).view(3, 1, 1), torch.tensor(ms[3:]).view(3, 1, 1)
        out[f"pixels/{name}"] = ((y[0] - mean) / std).permute(1, 2, 0).double().numpy()
    np.savez(out_path, **out)


if __name__ == "__main__":
    {"make": make, "logits": logits, "readme": readme, "photos": photos,
     "float-resize": float_resize}[sys.argv[1]](
        *sys.argv[2:])
