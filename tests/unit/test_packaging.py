"""The distribution maps the import package ``specctl`` onto the ``controller/`` folder.

setuptools cannot discover packages under a name their folder does not have, so
``pyproject.toml`` lists them; a folder of code missing from that list would be left out
of the wheel and the vLLM image that installs it.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import specctl

ROOT = Path(__file__).resolve().parents[2]


def test_every_folder_of_code_is_a_listed_package() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert config["package-dir"] == {"specctl": "controller"}
    folders = {
        ".".join(("specctl", *p.parent.relative_to(ROOT / "controller").parts))
        for p in (ROOT / "controller").rglob("*.py")
        if "__pycache__" not in p.parts
    }
    # the folders that hold only data are packages for their files alone
    data = set(config["package-data"]) - {"*"}
    assert sorted(folders) == sorted(p for p in config["packages"] if p not in data)
    for package in data:
        assert package in config["packages"], package
        assert (ROOT / "controller" / Path(*package.split(".")[1:])).is_dir(), package
    for folder in folders:
        init = ROOT / "controller" / Path(*folder.split(".")[1:]) / "__init__.py"
        assert init.is_file(), f"{init.relative_to(ROOT)} is missing"


def test_the_import_package_is_the_controller_folder() -> None:
    assert Path(specctl.__file__).resolve().parent == ROOT / "controller"
