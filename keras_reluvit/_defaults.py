"""The defaults several parts share, each written once (`keras_reluvit.
training.settings` names them for users): the lowest floor, importing
nothing, so that the data package and `keras-reluvit --help` read them."""

RECIPE = "digits"  # the main job's recipe (the embedded data set)
VAL_FRACTION = 0.1  # a folder without val/: this seeded share of each class is held out
LORA_RANK = 8
KEEP_CHECKPOINTS = 2  # the newest backups a run keeps
TRAINABLE = ("all", "head", "lora")  # what a fine-tune trains: every weight, the head, LoRA
TRAINABLE_DEFAULT = "all"
# A compact copy (keras-reluvit prepare --out): each image's shorter side at most this, and
# the quality of the JPEGs it encodes.
COPY_SHORT_SIDE = 256
COPY_JPEG_QUALITY = 90
