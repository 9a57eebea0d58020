"""The one packaging rule pyproject.toml cannot say: the presets in configs/ ship inside the package, as
cooper/configs/, so that an installed wheel runs `cooper train` (the tiny preset) and `--config NAME` as a checkout
does. configs/ stays at the repository root, where the docs, compose and Kubernetes files name it; cooper.cli finds
the presets in the package first and in the checkout beside it second (an editable install)."""

from setuptools import find_packages, setup

setup(
    packages=[*find_packages(include=["cooper*"]), "cooper.configs"],
    package_dir={"cooper.configs": "configs"},
)
