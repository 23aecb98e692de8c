"""The site that `make book` builds works with no network whenever MathJax can be installed.

book/_ext/offline_site.py decides, once per build: offline (MathJax served by the site)
when MathJax 3 is on the machine, else the CDN with one line saying so; MHA_OFFLINE_SITE=1
insists, 0 chooses the CDN. The browser test (tests/test_site.py) then loads every page
with the network blocked.
"""

import importlib.util
import logging
import os
import re
import subprocess
from types import SimpleNamespace

import pytest

from conftest import ROOT

spec = importlib.util.spec_from_file_location("offline_site", ROOT / "book" / "_ext" / "offline_site.py")
offline_site = importlib.util.module_from_spec(spec)
spec.loader.exec_module(offline_site)

MATHJAX = ROOT / ".cache" / "mathjax" / "node_modules" / "mathjax" / "es5"
CDN = re.compile(r"cdn\.jsdelivr\.net/npm/mathjax")


def decide(monkeypatch, tmp_path, env=None, mathjax=True, students=False):
    """Run the extension's decision on a stand-in config: (offline?, mathjax_path)."""
    folder = tmp_path / "es5"
    if mathjax:
        folder.mkdir(parents=True)
        (folder / "tex-mml-chtml.js").write_text("// MathJax")
    monkeypatch.setenv("MHA_MATHJAX_DIR", str(folder))
    if env is None:
        monkeypatch.delenv("MHA_OFFLINE_SITE", raising=False)
    else:
        monkeypatch.setenv("MHA_OFFLINE_SITE", env)
    config = SimpleNamespace(mha_offline_site=students, mha_offline_decided=False, mathjax_path="cdn")
    offline_site.use_local_mathjax(SimpleNamespace(confdir=str(ROOT)), config)
    return offline_site.enabled(config), config.mathjax_path


def test_offline_by_default_when_mathjax_is_installed(monkeypatch, tmp_path):
    assert decide(monkeypatch, tmp_path) == (True, offline_site.MATHJAX_PATH)


def test_without_mathjax_the_default_falls_back_to_the_cdn_and_says_so(monkeypatch, tmp_path, caplog):
    caplog.set_level(logging.INFO)
    assert decide(monkeypatch, tmp_path, mathjax=False) == (False, "cdn")
    said = [r.getMessage() for r in caplog.records if "MathJax 3 is not in" in r.getMessage()]
    assert len(said) == 1 and "CDN" in said[0] and "network" in said[0]


def test_offline_1_insists_and_0_chooses_the_cdn(monkeypatch, tmp_path):
    with pytest.raises(RuntimeError, match="tex-mml-chtml.js"):
        decide(monkeypatch, tmp_path / "a", env="1", mathjax=False)
    assert decide(monkeypatch, tmp_path / "b", env="0") == (False, "cdn")
    assert decide(monkeypatch, tmp_path / "c", env="1") == (True, offline_site.MATHJAX_PATH)


def test_the_students_site_is_always_offline(monkeypatch, tmp_path):
    assert decide(monkeypatch, tmp_path, env="0", students=True) == (True, offline_site.MATHJAX_PATH)


def test_a_wrong_value_is_refused_with_the_choices(monkeypatch, tmp_path):
    with pytest.raises(ValueError, match=r"1 \(offline\), 0 .* not 'yes'"):
        decide(monkeypatch, tmp_path, env="yes")


def test_make_book_installs_mathjax_unless_told_to_use_the_cdn():
    """The README's first command builds the offline site: `make book` fetches MathJax first."""
    def plan(*options):
        return subprocess.run(["make", "-n", "-o", ".venv/.installed", "book", *options], cwd=ROOT,
                              capture_output=True, text=True, timeout=60).stdout

    assert "mathjax" in plan().lower() and "MHA_OFFLINE_SITE= " in plan()
    assert "npm install" not in plan("OFFLINE=0") and "MHA_OFFLINE_SITE=0 " in plan("OFFLINE=0")


def test_the_built_site_serves_mathjax_itself(built_site):
    """The tests' build is the one `make book` makes: with MathJax installed, no page names the CDN."""
    html, code, log = built_site
    if not (MATHJAX / "tex-mml-chtml.js").is_file():
        if os.environ.get("CI"):
            pytest.fail("MathJax is not installed (CI is set: run `make test`, which installs it)")
        pytest.skip("MathJax is not installed here (`make test` installs it)")
    assert code == 0, log
    assert (html / "_static" / "mathjax" / "tex-mml-chtml.js").is_file()
    pages = sorted(html.rglob("*.html"))
    assert len(pages) > 10
    for page in pages:
        text = page.read_text()
        assert not CDN.search(text), f"{page.relative_to(html)} loads MathJax from its CDN"
    chapter = (html / "book" / "07_why_heads_differ.html").read_text()
    assert "_static/mathjax/tex-mml-chtml.js" in chapter
