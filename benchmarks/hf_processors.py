"""transformers' image processors as a user gets them (`AutoImageProcessor`:
its torchvision backend where torchvision is installed) beside its PIL
backend and our recipe read from the same `preprocessor_config.json`, on
scikit-image's photographs.

Needs transformers with torchvision: run in the peers venv (made once):

    bash -c 'source benchmarks/env-peers.sh && python -m benchmarks.hf_processors --out benchmarks/results'

The processors: ViT's (squash, bilinear), DeiT's (squash 256, crop 224,
bicubic), CLIP's (shortest edge, crop, bicubic), DINOv2's (BitImageProcessor:
shortest edge 256, crop 224, bicubic), each handed PIL images; and ViT's and
CLIP's with `do_rescale=False`, handed [0, 1] float arrays. Ours: the recipe
`kr.checkpoints.hf.preprocessing_from_processor` reads (what `from_preset`
gives a model), through `model.preprocessor`'s path (`kr.ImagePreprocessor`,
keras.ops) and the SavedModel's (`tf_preprocess`, TensorFlow ops). A table
per case: the largest difference and the share of values more than 2 levels
apart, over all photographs. transformers runs in a child process (torch and
TensorFlow do not share one).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

PHOTOS = ("astronaut", "chelsea", "coffee", "rocket", "camera", "hubble_deep_field")
IMAGENET = dict(image_mean=[0.485, 0.456, 0.406], image_std=[0.229, 0.224, 0.225])
CASES = {  # label -> (family, processor class, its arguments, floats handed)
    "ViT": ("vit", "ViTImageProcessor", {}, False),
    "DeiT": ("deit", "DeiTImageProcessor", {}, False),
    "CLIP": ("clip", "CLIPImageProcessor", {}, False),
    "DINOv2": ("dinov2", "BitImageProcessor", dict(size={"shortest_edge": 256},
                                                   crop_size={"height": 224, "width": 224},
                                                   **IMAGENET), False),
    "ViT, do_rescale=False": ("vit", "ViTImageProcessor", dict(do_rescale=False), True),
    "CLIP, do_rescale=False": ("clip", "CLIPImageProcessor", dict(do_rescale=False), True),
}


def photographs():
    from skimage import data

    out = {}
    for name in PHOTOS:
        img = getattr(data, name)()
        out[name] = (np.stack([img] * 3, -1) if img.ndim == 2 else img[..., :3]).astype("uint8")
    return out


def transformers_side(work):
    """The child: each case's processor saved to `work/LABEL/` and its
    outputs (AutoImageProcessor's, the PIL backend's) in `work/ref.npz`."""
    import transformers as T
    from PIL import Image

    ref, info, photos = {}, {"transformers": T.__version__}, photographs()
    for label, (family, cls, kwargs, floats) in CASES.items():
        directory = os.path.join(work, label)
        getattr(T, cls)(**kwargs).save_pretrained(directory)
        auto = T.AutoImageProcessor.from_pretrained(directory)
        pil = getattr(T, cls + "Pil")(**kwargs)
        info[label] = [type(auto).__name__, type(auto).__mro__[1].__name__]
        for name, img in photos.items():
            given = (img.astype("float32") / 255,) if floats else (Image.fromarray(img),)
            for key, processor in (("auto", auto), ("pil", pil)):
                px = processor(*given, return_tensors="np")["pixel_values"][0]
                ref[f"{label}/{name}/{key}"] = px.transpose(1, 2, 0)
    np.savez(os.path.join(work, "ref.npz"), **ref)
    with open(os.path.join(work, "info.json"), "w") as f:
        json.dump(info, f)


def ours(work):
    """{label: {pair: (max levels, share > 2 levels)}} over the photographs."""
    import keras

    import keras_reluvit as kr
    from keras_reluvit.checkpoints import hf
    from keras_reluvit.preprocessing import tf_preprocess

    ref, photos = np.load(os.path.join(work, "ref.npz")), photographs()
    out = {}
    for label, (family, _, _, floats) in CASES.items():
        recipe = hf.preprocessing_from_processor(os.path.join(work, label), family)
        std = np.asarray(recipe["std"])
        diffs = {k: [] for k in ("AutoImageProcessor vs PIL backend",
                                 "model.preprocessor vs AutoImageProcessor",
                                 "SavedModel's path vs AutoImageProcessor",
                                 "model.preprocessor vs PIL backend")}
        for name, img in photos.items():
            auto, pil = ref[f"{label}/{name}/auto"], ref[f"{label}/{name}/pil"]
            x = img.astype("float32") / 255 if floats else img
            size = auto.shape[:2]
            pre = np.asarray(keras.ops.convert_to_numpy(
                kr.ImagePreprocessor(size, **recipe)(x)))[0]
            graph = tf_preprocess(x[None] * (255 if floats else 1), size, recipe).numpy()[0]
            for key, a, b in (("AutoImageProcessor vs PIL backend", auto, pil),
                              ("model.preprocessor vs AutoImageProcessor", pre, auto),
                              ("SavedModel's path vs AutoImageProcessor", graph, auto),
                              ("model.preprocessor vs PIL backend", pre, pil)):
                diffs[key].append((np.abs(a - b) * std * 255).ravel())
        out[label] = {k: (float(np.concatenate(v).max()), float((np.concatenate(v) > 2).mean()))
                      for k, v in diffs.items()}
    return out


def table(info, results):
    pairs = list(next(iter(results.values())))
    lines = ["Command: bash -c 'source benchmarks/env-peers.sh && python -m "
             "benchmarks.hf_processors --out benchmarks/results'", "",
             f"transformers {info['transformers']}; scikit-image's photographs "
             f"({', '.join(PHOTOS)}); AutoImageProcessor gave: "
             + "; ".join(f"{k}: {v[0]} ({v[1]})" for k, v in info.items()
                         if k != "transformers") + ".", "",
             "Largest difference in levels (0-255) / share of values more than 2 levels "
             "apart:", "", "| processor | " + " | ".join(pairs) + " |",
             "|---|" + "---|" * len(pairs)]
    for label, r in results.items():
        lines.append(f"| {label} | " + " | ".join(f"{r[p][0]:.2f} / {100 * r[p][1]:.2f} %"
                                                  for p in pairs) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", help="directory for hf_processors.md / .json")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        return transformers_side(args.child)
    work = tempfile.mkdtemp()
    env = dict(os.environ, TRANSFORMERS_VERBOSITY="error", CUDA_VISIBLE_DEVICES="")
    subprocess.run([sys.executable, "-m", "benchmarks.hf_processors", "--child", work],
                   check=True, env=env)
    with open(os.path.join(work, "info.json")) as f:
        info = json.load(f)
    results = ours(work)
    text = table(info, results)
    print(text)
    if args.out:
        from benchmarks import common

        common.write(args.out, "hf_processors", text, dict(info=info, results=results))


if __name__ == "__main__":
    main()
