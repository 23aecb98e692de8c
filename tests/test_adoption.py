"""What an adopter needs: licenses for the code (MIT) and for the text and figures (CC BY 4.0),
stated in the README and in every page's footer; a valid CITATION.cff; a changelog; one
version everywhere; a contributing guide."""

import json
import re
import tomllib

import jsonschema
import pytest
import yaml

from conftest import ROOT

SCHEMA = ROOT / "tests" / "data" / "cff-1.2.0.schema.json"  # the Citation File Format's own schema, 1.2.0


def version():
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def test_the_code_is_under_the_mit_license():
    text = (ROOT / "LICENSE").read_text()
    assert text.startswith("MIT License") and "Permission is hereby granted, free of charge" in text
    assert 'THE SOFTWARE IS PROVIDED "AS IS"' in text and re.search(r"Copyright \(c\) \d{4} \S", text)
    assert tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["license"] == {"text": "MIT"}


def test_the_text_and_figures_are_under_cc_by_4():
    text = (ROOT / "LICENSE-CONTENT.md").read_text()
    assert "Creative Commons Attribution 4.0 International" in text
    assert "https://creativecommons.org/licenses/by/4.0/legalcode" in text and "book/figures/" in text


def test_the_readme_states_both_licenses_and_how_to_cite():
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## License and citation"):]
    for needed in ("MIT License", "`LICENSE`", "CC BY 4.0", "`LICENSE-CONTENT.md`", "`CITATION.cff`", version()):
        assert needed in section, f"the README's license section does not name {needed}"


def test_citation_cff_is_valid_and_names_this_version():
    citation = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    citation = json.loads(json.dumps(citation, default=str))  # dates as the strings the schema expects
    jsonschema.validate(citation, json.loads(SCHEMA.read_text()))
    assert citation["version"] == version() and set(citation["license"]) == {"MIT", "CC-BY-4.0"}
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    assert citation["title"] == config["title"] and citation["repository-code"] == config["repository"]["url"]


def test_the_schema_check_rejects_a_broken_citation():
    """Guards the test above: the schema really constrains the file."""
    broken = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    del broken["authors"]
    with pytest.raises(jsonschema.ValidationError, match="'authors' is a required property"):
        jsonschema.validate(json.loads(json.dumps(broken, default=str)), json.loads(SCHEMA.read_text()))


def test_the_changelog_begins_with_this_version():
    changelog = (ROOT / "CHANGELOG.md").read_text()
    versions = re.findall(r"^## \[(\d+\.\d+\.\d+)\] - (\d{4}-\d{2}-\d{2})$", changelog, re.M)
    assert versions and versions[0][0] == version(), f"CHANGELOG.md begins with {versions[:1]}, not {version()}"
    assert [v for v, _ in versions] == sorted((v for v, _ in versions), key=lambda v: [-int(p) for p in v.split(".")])


def test_every_page_s_footer_names_the_version_and_the_licenses(built_site):
    html, code, log = built_site
    assert code == 0, log
    footer = yaml.safe_load((ROOT / "_config.yml").read_text())["html"]["extra_footer"]
    assert f"version {version()}" in footer
    pages = [p for p in sorted(html.glob("*.html")) + sorted((html / "book").glob("*.html"))
             if 'http-equiv="Refresh"' not in p.read_text()]  # index.html only redirects to the intro
    assert len(pages) > 10
    for page in pages:
        text = page.read_text()
        for needed in (f"version {version()}", "MIT License", "CC BY 4.0"):
            assert needed in text, f"{page.relative_to(html)}: the footer does not say {needed!r}"


@pytest.mark.parametrize("topic", ["## Add a chapter", "## Add an exercise with its check",
                                   "## Add a mistake with its hint", "## Refresh the stored outputs and the benchmarks"])
def test_the_contributing_guide_covers(topic):
    guide = (ROOT / "CONTRIBUTING.md").read_text()
    assert topic in guide
    section = guide[guide.index(topic):].split("\n## ")[0]
    assert len(section.split()) > 60, f"{topic}: too short to be a guide"
