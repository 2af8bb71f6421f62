"""Every shell command in the READMEs (README.md, docs/*.md,
benchmarks/README.md, examples/README.md) is a command that exists, with
arguments its parser accepts (what the commands *do* is tested by the
tests named next to each kind below)."""

import importlib
import importlib.util
import os
import re
import shlex

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Commands that need something this machine cannot have, and why.
NOT_RUNNABLE = {
    "curl": "talks to a running TF Serving (the SavedModel it serves is tested in test_export.py)",
    "pip": "installs packages (the pinned set is what scripts/env.sh installs)",
    "jupyter": "interactive (the notebook is executed by test_examples.py)",
}


# The README, the docs pages and the two READMEs it links for the long
# tables and write-ups.
DOCS = tuple(sorted("docs/" + f for f in os.listdir(os.path.join(ROOT, "docs")) if f.endswith(".md")))
READMES = ("README.md",) + DOCS + ("benchmarks/README.md", "examples/README.md")


def readme_commands():
    text = "\n".join(open(os.path.join(ROOT, name)).read() for name in READMES)
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            line = line.strip()
            if not line or line.startswith("#") or line.startswith("}") or line.startswith('"'):
                continue
            for part in line.split("&&"):
                try:
                    words = shlex.split(part, comments=True)
                except ValueError:  # a quoted argument over several lines (curl -d '{...}')
                    words = part.split()[:1]
                while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):
                    words = words[1:]  # KERAS_BACKEND=jax ...
                if words and words[-1] == "&":  # started in the background
                    words = words[:-1]
                if words:
                    commands.append(words)
    return commands


def test_readme_has_the_tour_commands():
    flat = [" ".join(c) for c in readme_commands()]
    for expected in ("bash scripts/main.sh", "bash scripts/test.sh", "keras-reluvit train",
                     "keras-reluvit export", "python examples/train_imagenet.py",
                     "python examples/alpha_sweep.py", "python -m benchmarks.attention",
                     "python -m benchmarks.vit", "jupyter lab examples/quickstart.ipynb"):
        assert any(c.startswith(expected) for c in flat), expected


def _load_example(path):
    spec = importlib.util.spec_from_file_location(os.path.basename(path)[:-3], path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("words", readme_commands(), ids=lambda w: " ".join(w)[:60])
def test_readme_command_parses(words):
    program, args = words[0], words[1:]
    if program in NOT_RUNNABLE:
        if program == "jupyter":
            assert os.path.exists(os.path.join(ROOT, args[-1]))
        return
    if program in ("bash", "source"):
        assert os.path.exists(os.path.join(ROOT, args[0])), args[0]
        return
    if program == "keras-reluvit":  # test_training / test_export run these
        from keras_reluvit import cli

        cli.parser().parse_args(args)
        return
    if program == "export":  # an environment variable (TF_CONFIG: test_engines.py)
        assert re.fullmatch(r"[A-Z_]+=.*", args[0]), words
        return
    if program == "torchrun":  # torch's own parser, then ours (test_engines.py runs these)
        from torch.distributed.run import get_args_parser

        from keras_reluvit import cli

        launcher = get_args_parser().parse_args(args)
        assert launcher.module and launcher.training_script == "keras_reluvit_cli", words
        cli.parser().parse_args(launcher.training_script_args)
        return
    assert program == "python", f"README command {' '.join(words)!r} is not covered by this test"
    if args[0] == "-m":  # benchmarks: their own parser
        module = importlib.import_module(args[1])
        module.parser().parse_args(args[2:])
        return
    path = os.path.join(ROOT, args[0])
    assert os.path.exists(path), args[0]
    module = _load_example(path)
    if hasattr(module, "parse_args"):
        module.parse_args(args[1:])
    else:
        assert args[1:] == [], f"{args[0]} takes no arguments"


def test_readme_is_a_landing_page_linking_every_docs_page():
    """README.md stays short (the rest lives in docs/); every docs page is
    linked from it, and every relative link of the README and the docs
    names a file that exists."""
    text = open(os.path.join(ROOT, "README.md")).read()
    assert len(text.splitlines()) <= 250, len(text.splitlines())
    assert len(DOCS) >= 8, DOCS
    for page in DOCS:
        assert f"]({page})" in text, f"README.md does not link {page}"


def markdown_files():
    """Every Markdown file of the repository (git's list: what ships)."""
    import subprocess

    out = subprocess.run(["git", "ls-files", "*.md"], cwd=ROOT, capture_output=True, text=True)
    names = out.stdout.split() if out.returncode == 0 else []
    if not names:  # not a git checkout (an sdist): walk the tree
        for folder, dirs, files in os.walk(ROOT):
            dirs[:] = [d for d in dirs if not d.startswith(".") and d not in ("build", "runs")]
            names += [os.path.relpath(os.path.join(folder, f), ROOT) for f in files
                      if f.endswith(".md")]
    return sorted(names)


def test_every_relative_link_of_every_markdown_file_resolves():
    """Links and images (`[x](path)`, `![x](path)`) of every Markdown file
    name files that exist, relative to the file that links them (as GitHub
    renders them)."""
    names = markdown_files()
    assert {"README.md", "examples/README.md", "benchmarks/README.md"} <= set(names), names
    broken = []
    for name in names:
        folder = os.path.dirname(os.path.join(ROOT, name))
        for target in re.findall(r"\]\(([^)#:\s]+)(?:#[^)]*)?\)", open(os.path.join(ROOT, name)).read()):
            if not os.path.exists(os.path.join(folder, target)):
                broken.append(f"{name}: {target}")
    assert not broken, broken


def test_main_job_numbers_come_from_its_results_file():
    """The main job's accuracy and time in the README and docs/training.md
    are the ones `benchmarks/main_job.py` last recorded."""
    import json

    with open(os.path.join(ROOT, "benchmarks", "results", "main_job.json")) as f:
        result = json.load(f)
    accuracy = f"{100 * result['accuracy']:.1f} %"
    for name in ("README.md", "docs/training.md"):
        text = open(os.path.join(ROOT, name)).read()
        assert accuracy in text, (name, accuracy)
        assert f"{result['wall_seconds']:.0f} s" in text, (name, result["wall_seconds"])
        assert "main_job.json" in text, name


def test_torchrun_commands_set_the_torch_backend():
    """Every torchrun command in the docs, the CHANGELOG and the CLI's help
    sets KERAS_BACKEND=torch: without it each process trains alone."""
    from keras_reluvit import cli

    texts = {name: open(os.path.join(ROOT, name)).read() for name in markdown_files()}
    texts["keras_reluvit/cli/__init__.py"] = cli.__doc__
    missing = []
    for name, text in texts.items():
        flat = re.sub(r"\\\n\s*", " ", text)
        for m in re.finditer(r"torchrun --", flat):
            if "KERAS_BACKEND=torch" not in flat[max(0, m.start() - 30):m.start()]:
                missing.append(f"{name}: {flat[m.start():m.start() + 60]!r}")
    assert not missing, missing
