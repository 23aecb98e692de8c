"""A Sphinx extension (loaded by _config.yml) that writes each inline script once per page.

Sphinx 7.4 adds the inline scripts that extensions register once again when it
starts writing pages (registered with filename None, re-added with ""), so every
page carried sphinx-thebe's `const THEBE_JS_URL = ...` twice and the browser
reported "Identifier 'THEBE_JS_URL' has already been declared" on every page.
tests/test_site.py fails on any such JavaScript error.
"""


def _key(script):
    return getattr(script, "filename", script) or "", sorted(getattr(script, "attributes", {}).items())


def unique_scripts(app, pagename, templatename, context, doctree):
    seen, unique = [], []
    for script in context.get("script_files", []):
        if _key(script) not in seen:
            seen.append(_key(script))
            unique.append(script)
    context["script_files"] = unique


def setup(app):
    app.connect("html-page-context", unique_scripts)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
