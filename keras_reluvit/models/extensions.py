"""What the model's own methods hand to the packages above it.

`ViT.from_preset` / `save_to_preset` and the builders' `weights=` read and
write checkpoints (`keras_reluvit.checkpoints`), and `ViT.export` writes a
serving archive (`keras_reluvit.export`). Those packages sit above the
model and import it; the model imports none of them. Each registers here
when it is imported (`import keras_reluvit` imports them all), and the
model asks here by name.
"""

_PROVIDERS = {}  # name -> the module (or object) that carries it out
WHO = {"checkpoints": "keras_reluvit.checkpoints", "export": "keras_reluvit.export"}


def register(name, provider):
    """Registers `provider` (a module) for `name`: one of `WHO`."""
    if name not in WHO:
        raise ValueError(f"No model extension named {name!r}; known: {sorted(WHO)}.")
    _PROVIDERS[name] = provider


def provider(name):
    """The module registered for `name`; an error naming the package to import."""
    try:
        return _PROVIDERS[name]
    except KeyError:
        raise RuntimeError(f"{WHO[name]} is not imported: `import keras_reluvit` (or "
                           f"{WHO[name]}) first.") from None
