"""Predict like the source, against timm itself: timm hub directories
(`save_for_hf`) of real architectures with their tags' `pretrained_cfg`,
loaded with `kr.ViT.from_preset`, on JPEG photographs (scikit-image's
samples): timm's own pipeline (PIL decode, `resolve_data_config` +
`create_transform`, the timm model) against ours (TensorFlow's accurate-DCT
decode, `model.preprocessor`, the loaded ViT) and against the SavedModel's
`serve_bytes` signature. The weights are timm's initialisation, perturbed,
with the classifier scaled up 20x so that small input differences show in
the probabilities (no pretrained weights can be downloaded here).

Needs timm + torchvision: run in the peers venv (~6 GB, made once):

    bash -c 'source benchmarks/env-peers.sh && KERAS_BACKEND=jax python -m benchmarks.predict_parity'

Prints a table: per architecture, the largest |log-probability| gap over
the photographs (classes timm gives >= 1e-6), ours vs timm and the
SavedModel vs timm.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

ARCHS = [
    "vit_small_patch16_224.augreg_in21k_ft_in1k",
    "deit_small_patch16_224.fb_in1k",
    "vit_base_patch16_clip_224.openai_ft_in1k",
    "vit_base_patch16_clip_quickgelu_224.openai",
]
# Other pixel rules on real timm models: label -> (architecture, create_model
# kwargs, pretrained_cfg changes). A rectangular model saved with its
# model_args, timm's squash / border crop modes, Pillow's lanczos.
VARIANTS = {
    "vit_s16 img_size=(224, 160)": ("vit_small_patch16_224.augreg_in21k_ft_in1k",
                                    {"img_size": (224, 160)}, {"input_size": (3, 224, 160)}),
    "deit_s16 squash, lanczos": ("deit_small_patch16_224.fb_in1k", {},
                                 {"crop_mode": "squash", "interpolation": "lanczos"}),
    "vit_s16 border": ("vit_small_patch16_224.augreg_in21k_ft_in1k", {}, {"crop_mode": "border"}),
}


def cases():
    """label -> (architecture, create_model kwargs, pretrained_cfg changes)."""
    return {**{name: (name, {}, {}) for name in ARCHS}, **VARIANTS}


def timm_side(out, jpegs):
    import timm
    import torch
    from PIL import Image

    ref = {}
    for i, (name, (arch, kwargs, overlay)) in enumerate(cases().items()):
        torch.manual_seed(i)
        model = timm.create_model(arch, pretrained=False, pretrained_cfg_overlay=overlay,
                                  **kwargs).eval()
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.02 * torch.randn_like(p))
            head = model.get_classifier()
            head.weight.mul_(20.0)
        directory = os.path.join(out, name)
        timm.models.save_for_hf(model, directory, safe_serialization=True,
                                model_args=kwargs or None)
        cfg = timm.data.resolve_data_config({}, model=model)
        transform = timm.data.create_transform(**cfg)
        x = torch.stack([transform(Image.open(j).convert("RGB")) for j in jpegs])
        with torch.no_grad():
            ref[name] = torch.log_softmax(model(x).double(), -1).numpy()
            size = kwargs.get("img_size", (224, 224))
            t = np.random.default_rng(0).uniform(-2, 2, (2, 3, *size)).astype("float32")
            ref[name + "/x"] = t.transpose(0, 2, 3, 1)
            ref[name + "/logits"] = model(torch.from_numpy(t)).double().numpy()
        ref[name + "/cfg"] = json.dumps({k: v for k, v in cfg.items()})
    np.savez(os.path.join(out, "timm.npz"), **ref)


def parser():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--timm-side", nargs="+", help=argparse.SUPPRESS)  # the child process
    return ap


def main():
    args = parser().parse_args()
    if args.timm_side:
        return timm_side(args.timm_side[0], args.timm_side[1:])
    import skimage.data
    from PIL import Image

    import keras_reluvit as kr
    from keras_reluvit import preprocessing as P

    tmp = tempfile.mkdtemp()
    jpegs = []
    photos = {n: getattr(skimage.data, n)() for n in ("astronaut", "coffee", "chelsea", "rocket")}
    # portrait and tall, narrow: where Pillow 13 resamples vertically first
    photos["portrait"] = np.ascontiguousarray(np.rot90(photos["coffee"]))
    photos["narrow"] = np.ascontiguousarray(photos["astronaut"][:, 180:330])
    for n, image in photos.items():
        jpegs.append(os.path.join(tmp, n + ".jpg"))
        Image.fromarray(image).save(jpegs[-1], quality=90)
    # timm (and the torch it imports) in a child process of its own.
    subprocess.run([sys.executable, "-m", "benchmarks.predict_parity", "--timm-side", tmp,
                    *jpegs], check=True)
    ref = dict(np.load(os.path.join(tmp, "timm.npz")))
    import tensorflow as tf

    print("Photographs: max |log-probability| gap (classes timm gives >= 1e-6).")
    print("Logits on one tensor: max |gap| / max |logit|, the hub directory and its bare")
    print("model.safetensors (architecture= given, except the plain CLIP tower: norm_pre says it).")
    print(f"{'architecture':46s} {'ours':>8s} {'SavedModel':>11s} {'logits hub':>11s} "
          f"{'logits bare':>12s}")
    for name, (arch, _, _) in cases().items():
        model = kr.ViT.from_preset(os.path.join(tmp, name))
        scale = np.abs(ref[name + "/logits"]).max()
        hub = np.abs(np.asarray(model(ref[name + "/x"])) - ref[name + "/logits"]).max() / scale
        named = None if name.startswith("vit_base_patch16_clip_224") else arch
        bare = kr.load_checkpoint(os.path.join(tmp, name, "model.safetensors"), architecture=named,
                                  image_size=model.image_size)
        bare = np.abs(np.asarray(bare(ref[name + "/x"])) - ref[name + "/logits"]).max() / scale
        x = model.preprocessor([kr.load_image(j) for j in jpegs])
        ours = np.log(P.probabilities(model.predict(x, verbose=0)))
        path = os.path.join(tmp, name + ".serving")
        kr.export.saved_model(model, path)
        served = tf.saved_model.load(path).signatures["serve_bytes"](
            image_bytes=tf.constant([open(j, "rb").read() for j in jpegs]))
        served = np.log(np.maximum(served["probabilities"].numpy().astype("float64"), 1e-300))
        seen = ref[name] > np.log(1e-6)  # float32 probabilities below that underflow
        gap = np.abs(ours - ref[name])[seen].max()
        gap_served = np.abs(served - ref[name])[seen].max()
        print(f"{name:46s} {gap:8.4f} {gap_served:11.4f} {hub:11.1e} {bare:12.1e}")


if __name__ == "__main__":
    main()
