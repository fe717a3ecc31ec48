"""What `pip install .` takes from setup.cfg, checked without installing (tests/test_install.py
installs for real, in make test-all): the four top-level names, and extras pinned to the
versions the tests check against."""

import configparser

import setuptools

from tests.support.paths import REPO_ROOT


def setup_cfg() -> configparser.ConfigParser:
    setup = configparser.ConfigParser()
    setup.read(REPO_ROOT / "setup.cfg")
    return setup


def test_the_distribution_installs_four_top_level_names():
    """experiments, layers and tasks (the names Pax users import) and paxloom; no module
    of its own (main.py runs paxloom.main from a clone)."""
    setup = setup_cfg()
    include = [name.strip() for name in setup["options.packages.find"]["include"].split(",")]
    packages = setuptools.find_packages(str(REPO_ROOT), include=include)
    assert {name.split(".")[0] for name in packages} == {"experiments", "layers", "paxloom",
                                                          "tasks"}
    assert "paxloom.tools" in packages and "paxloom.runner.training" in packages
    assert "py_modules" not in setup["options"]
    assert setup["options.entry_points"]["console_scripts"].split() == [
        "paxloom", "=", "paxloom.main:cli"]


def test_the_extras_pin_what_the_tests_check_against():
    """`pip install '.[hf]'` brings the transformers and torch that the Hugging Face round
    trips are tested with, and every extra pins what requirements-test.txt installs."""
    extras = {name: value.split() for name, value in
              setup_cfg()["options.extras_require"].items()}
    tested = {line.split("==")[0]: line for line in
              (REPO_ROOT / "requirements-test.txt").read_text().splitlines()
              if "==" in line and not line.startswith("#")}
    assert extras["hf"] == ["transformers==5.23.0", "torch==2.13.0"]
    for name, pins in extras.items():
        for pin in pins:
            package = pin.split("==")[0]
            if package in tested:
                assert pin == tested[package], (name, pin, tested[package])
