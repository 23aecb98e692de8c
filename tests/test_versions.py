"""The versions the README names agree with the pins: the oldest Python that every pinned
package supports, torch's pin, and the Python of Binder and of CI."""

import re
from importlib import metadata

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from conftest import ROOT

README = (ROOT / "README.md").read_text()


def pins():
    """name -> version for every `name==version` line of requirements.txt."""
    found = {}
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if "==" in line:
            requirement = Requirement(line)
            found[requirement.name] = next(iter(requirement.specifier)).version
    return found


def oldest_python(packages):
    """The oldest 3.x that the Requires-Python of every installed package admits."""
    specifiers = [SpecifierSet(metadata.metadata(name).get("Requires-Python") or "") for name in packages]
    return next(f"3.{minor}" for minor in range(8, 20) if all(f"3.{minor}.0" in s for s in specifiers))


def readme_python():
    found = re.search(r"You need Python (3\.\d+) or newer \((3\.\d+) is what CI uses", README)
    assert found, "the README must say which Python it needs: 'You need Python 3.X or newer (3.Y is what CI uses'"
    return found[1], found[2]


def test_the_pins_are_what_is_installed():
    for name, version in pins().items():  # (torch's CPU wheel calls itself 2.13.0+cpu: == admits that)
        installed = metadata.version(name)
        assert SpecifierSet(f"=={version}").contains(installed), f"{name}: pinned {version}, installed {installed}"


def test_the_readme_names_the_oldest_python_that_the_pins_support():
    oldest, _ = readme_python()
    assert oldest == oldest_python(pins()), f"the README says {oldest}; the pins need {oldest_python(pins())}"
    requires = re.search(r'requires-python = ">=(3\.\d+)"', (ROOT / "pyproject.toml").read_text())[1]
    assert requires == oldest, f"pyproject.toml requires Python {requires}, the README says {oldest}"


def test_binder_and_ci_use_the_python_the_readme_names():
    _, ci = readme_python()
    assert (ROOT / "runtime.txt").read_text().strip() == f"python-{ci}"
    workflow = yaml.safe_load((ROOT / ".github" / "workflows" / "publish.yml").read_text())
    assert workflow["jobs"]["test-and-build"]["container"]["image"].startswith(f"python:{ci}-")


@pytest.mark.parametrize("name", ["torch"])
def test_the_readme_names_the_pinned_version(name):
    named = set(re.findall(rf"\b{name}==([\d.]+)", README))
    assert named == {pins()[name]}, f"the README names {name} {named}; requirements.txt pins {pins()[name]}"
