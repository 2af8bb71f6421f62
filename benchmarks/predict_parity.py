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


def timm_side(out, jpegs):
    import timm
    import torch
    from PIL import Image

    ref = {}
    for i, name in enumerate(ARCHS):
        torch.manual_seed(i)
        model = timm.create_model(name, pretrained=False).eval()
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.02 * torch.randn_like(p))
            head = model.get_classifier()
            head.weight.mul_(20.0)
        directory = os.path.join(out, name)
        timm.models.save_for_hf(model, directory, safe_serialization=True)
        cfg = timm.data.resolve_data_config({}, model=model)
        transform = timm.data.create_transform(**cfg)
        x = torch.stack([transform(Image.open(j).convert("RGB")) for j in jpegs])
        with torch.no_grad():
            ref[name] = torch.log_softmax(model(x).double(), -1).numpy()
        ref[name + "/cfg"] = json.dumps({k: v for k, v in cfg.items()})
    np.savez(os.path.join(out, "timm.npz"), **ref)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--timm-side", nargs="+")
    args = ap.parse_args()
    if args.timm_side:
        return timm_side(args.timm_side[0], args.timm_side[1:])
    import skimage.data
    from PIL import Image

    import keras_reluvit as kr
    from keras_reluvit import preprocessing as P

    tmp = tempfile.mkdtemp()
    jpegs = []
    for n in ("astronaut", "coffee", "chelsea", "rocket"):
        jpegs.append(os.path.join(tmp, n + ".jpg"))
        Image.fromarray(getattr(skimage.data, n)()).save(jpegs[-1], quality=90)
    # timm (and the torch it imports) in a child process of its own.
    subprocess.run([sys.executable, "-m", "benchmarks.predict_parity", "--timm-side", tmp,
                    *jpegs], check=True)
    ref = dict(np.load(os.path.join(tmp, "timm.npz")))
    import tensorflow as tf

    print(f"{'architecture':48s} {'ours vs timm':>14s} {'SavedModel vs timm':>20s}")
    for name in ARCHS:
        model = kr.ViT.from_preset(os.path.join(tmp, name))
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
        print(f"{name:48s} {gap:14.4f} {gap_served:20.4f}")


if __name__ == "__main__":
    main()
