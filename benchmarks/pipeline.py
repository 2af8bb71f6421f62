"""Images/s of the training input pipeline alone (no model).

    python -m benchmarks.pipeline                                   # embedded data set, 224 px
    python -m benchmarks.pipeline --dataset imagenet2012 --data-dir ~/tensorflow_datasets
"""

import argparse

from keras_reluvit import bench
from keras_reluvit import data
from keras_reluvit import recipes


def parser():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", default="sklearn_digits")
    p.add_argument("--data-dir")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--steps", type=int, default=20)
    return p


def main(argv=None):
    args = parser().parse_args(argv)
    rows = []
    for label, aug in (("crop + flip", data.Augment()),
                       ("crop + flip + randaug(2,10)", data.Augment(randaug=(2, 10))),
                       ("crop + flip + randaug(2,10) + mixup 0.2", data.Augment(randaug=(2, 10), mixup=0.2)),
                       ("DeiT: rand-m9-mstd0.5-inc1 + erasing + timm mix + 3x repeats",
                        data.Augment(**recipes.get("deit_s16_300ep")["augment"])),
                       ("DeiT III: 3-Augment + jitter 0.3 + timm mix + 3x repeats",
                        data.Augment(**recipes.get("deit3_s16_400ep")["augment"]))):
        ips = bench.pipeline_throughput(args.dataset, args.batch_size, args.image_size,
                                        args.data_dir, args.steps, aug)
        rows.append(f"| {args.dataset} | {args.image_size} | {label} | {ips:,.0f} |")
    print("| dataset | px | augmentation | images/s |\n|---|---|---|---|\n" + "\n".join(rows))


if __name__ == "__main__":
    main()
