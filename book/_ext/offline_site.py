"""A Sphinx extension (loaded by _config.yml) that makes a site work with no network.

On by default whenever the machine has MathJax 3 (`make book` installs it from npm,
as `make test` does): a reader's site then typesets every formula offline. Where
MathJax cannot be installed, the build says so in one line and the pages load
MathJax from its CDN. MHA_OFFLINE_SITE chooses instead of the default:
`1` (`make book OFFLINE=1`) insists, and fails without MathJax; `0`
(`make book OFFLINE=0`) uses the CDN. The students' website is always offline
(tools/publishing/student_copy.py sets `mha_offline_site: true`). When on:

- MathJax 3 is served by the site itself: the files it needs are copied from the
  npm package that `make browser` installs (or from MHA_MATHJAX_DIR) into
  `_static/mathjax/`, and `mathjax_path` points there;
- sphinx-thebe's scripts are left out of every page: thebe runs code through a
  remote kernel that it loads from a CDN, which a site sent as a zip cannot reach.

tests/test_site.py loads the students' website with every request outside it
refused, and checks that the formulas are typeset.
"""

import os
import shutil
from pathlib import Path

from docutils import nodes
from sphinx.util import logging

logger = logging.getLogger(__name__)

MATHJAX_FILES = ["tex-mml-chtml.js", "output/chtml", "input", "ui", "a11y", "adaptors"]  # about 4 MB of 24
MATHJAX_PATH = "mathjax/tex-mml-chtml.js"  # relative to _static


def choice(config):
    """'on', 'off' or 'auto' (offline when MathJax is there), from the config and MHA_OFFLINE_SITE."""
    if config.mha_offline_site:
        return "on"
    wanted = os.environ.get("MHA_OFFLINE_SITE", "").strip()
    if wanted not in ("", "0", "1"):
        raise ValueError(f"MHA_OFFLINE_SITE must be 1 (offline), 0 (MathJax from its CDN) or unset "
                         f"(offline when MathJax is installed), not {wanted!r}")
    return {"1": "on", "0": "off", "": "auto"}[wanted]


def enabled(config):
    """Whether this build serves MathJax itself (decided once, in use_local_mathjax)."""
    return bool(config.mha_offline_decided)


def mathjax_folder(confdir):
    """Where the es5 folder of the mathjax@3 npm package should be."""
    return Path(os.environ.get("MHA_MATHJAX_DIR") or Path(confdir) / ".cache/mathjax/node_modules/mathjax/es5")


def mathjax_source(confdir):
    """The es5 folder of the mathjax@3 npm package."""
    folder = mathjax_folder(confdir)
    if not (folder / "tex-mml-chtml.js").is_file():
        raise RuntimeError(f"the offline site serves MathJax itself, but {folder} holds no tex-mml-chtml.js: "
                           f"run `make browser` (npm install mathjax@3), or set MHA_MATHJAX_DIR to its es5 folder")
    return folder


def use_local_mathjax(app, config):
    wanted = choice(config)
    if wanted == "auto" and not (mathjax_folder(app.confdir) / "tex-mml-chtml.js").is_file():
        logger.info(f"MathJax 3 is not in {mathjax_folder(app.confdir)}: the pages load it from its CDN, "
                    f"so formulas need the network (`make book` installs it where npm can be had)")
        wanted = "off"
    config.mha_offline_decided = wanted != "off"
    if enabled(config):
        mathjax_source(app.confdir)  # fail early, before the build, when MathJax is missing
        config.mathjax_path = MATHJAX_PATH


def is_thebe(script):
    text = " ".join(str(v) for v in (getattr(script, "filename", script), *getattr(script, "attributes", {}).values()))
    return "thebe" in text.lower()


def drop_thebe(app, pagename, templatename, context, doctree):
    if enabled(app.config):
        context["script_files"] = [s for s in context.get("script_files", []) if not is_thebe(s)]
        context["css_files"] = [s for s in context.get("css_files", []) if not is_thebe(s)]


def drop_thebe_config(app, doctree, docname):
    """sphinx-thebe appends its configuration to every page as raw HTML: remove it."""
    if enabled(app.config):
        for node in list(doctree.findall(nodes.raw)):
            if "thebe" in node.astext().lower() or "kernelName" in node.astext():
                node.parent.remove(node)


def copy_mathjax(app, exception):
    if exception is None and enabled(app.config) and app.builder.format == "html":
        source, target = mathjax_source(app.confdir), Path(app.outdir) / "_static" / "mathjax"
        for name in MATHJAX_FILES:
            if (source / name).is_dir():
                shutil.copytree(source / name, target / name, dirs_exist_ok=True)
            else:
                target.mkdir(parents=True, exist_ok=True)
                shutil.copy(source / name, target / name)


def setup(app):
    app.add_config_value("mha_offline_site", False, "html")
    app.add_config_value("mha_offline_decided", False, "html")  # set by use_local_mathjax, never by hand
    app.connect("config-inited", use_local_mathjax)
    app.connect("html-page-context", drop_thebe, priority=900)  # after sphinx-thebe has added its scripts
    app.connect("doctree-resolved", drop_thebe_config, priority=900)  # after sphinx-thebe's own handler
    app.connect("build-finished", copy_mathjax)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
