"""What `pip install .` takes from setup.cfg, checked without installing (tests/test_install.py
installs for real, in make test-all): the four top-level names, and its dependency ranges
against the lock (constraints.txt), whose versions every install of the Makefile takes."""

import configparser

import setuptools
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

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



def locked_versions(text: str) -> dict[str, str]:
    """constraints.txt's `name==version` lines, by canonical name."""
    pins = [line.split("==") for line in text.splitlines()
            if line.strip() and not line.startswith("#")]
    return {canonicalize_name(name): version for name, version in pins}


def declared_requirements() -> list[Requirement]:
    """install_requires and every extra of setup.cfg."""
    options = setup_cfg()
    values = [options["options"]["install_requires"],
              *options["options.extras_require"].values()]
    return [Requirement(line) for value in values for line in value.splitlines()
            if line.strip() and not line.strip().startswith("#")]


def outside_the_lock(locked: dict[str, str], requirements: list[Requirement]) -> list[str]:
    """Each declared requirement the lock lacks or locks outside the declared range."""
    problems = []
    for requirement in requirements:
        version = locked.get(canonicalize_name(requirement.name))
        if version is None:
            problems.append(f"{requirement.name} is not in constraints.txt")
        elif not requirement.specifier.contains(version, prereleases=True):
            problems.append(f"{requirement.name}=={version} is outside {requirement}")
    return problems


def lock() -> dict[str, str]:
    return locked_versions((REPO_ROOT / "constraints.txt").read_text())


def test_every_locked_version_is_inside_its_range():
    """What the suite runs on is what setup.cfg says it supports; a lock that moves jax
    below the range (or a range that leaves the lock behind) is caught."""
    requirements = declared_requirements()
    assert outside_the_lock(lock(), requirements) == []
    broken = {**lock(), "jax": "0.10.2"}
    del broken["tokamax"]
    assert outside_the_lock(broken, requirements) == [
        "jax==0.10.2 is outside jax<0.13,>=0.11.2", "tokamax is not in constraints.txt"]


def test_the_lock_is_the_gpu_machines_stack():
    """The versions of the GPU machines (Python 3.12, CUDA 13, cuDNN 9.19), and the
    planner's XLA:GPU plugin of the same release as jax."""
    locked = lock()
    gpu_image = {"jax": "0.11.2", "jaxlib": "0.11.2", "flax": "0.12.10", "numpy": "2.5.2",
                 "torch": "2.11.0", "transformers": "5.17.0", "tokenizers": "0.23.2",
                 "sentencepiece": "0.2.2", "praxis": "1.4.0"}
    for name, version in gpu_image.items():
        assert locked[name] == version, name
    assert locked["jax-cuda13-pjrt"] == locked["jax-cuda13-plugin"] == locked["jaxlib"]
    assert "jax>=0.11.2,<0.13" in setup_cfg()["options"]["install_requires"]


def test_every_package_the_makefile_installs_is_locked():
    """requirements*.txt name packages without versions, each of them in the lock."""
    locked = lock()
    for path in sorted(REPO_ROOT.glob("requirements*.txt")):
        for line in path.read_text().splitlines():
            if not line.strip() or line.startswith(("#", "-")):
                continue
            requirement = Requirement(line)
            assert not requirement.specifier, (path.name, line)
            assert canonicalize_name(requirement.name) in locked, (path.name, line)
