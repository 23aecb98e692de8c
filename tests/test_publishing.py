"""The publishing workflow cannot run here, so its text is checked: it runs exactly CI's
command, builds the book once and publishes that build, pins each action to its current
major version, grants the least permissions, keeps no credentials, and never cancels a
deploy that has started. Dependabot keeps the actions current."""

import re

import pytest
import yaml

from conftest import ROOT

WORKFLOW = ROOT / ".github" / "workflows" / "publish.yml"
# The current major version of each action, from the actions' own release notes (November 2026).
CURRENT = {"actions/checkout": 6, "actions/upload-artifact": 7, "actions/upload-pages-artifact": 5,
           "actions/deploy-pages": 5}


@pytest.fixture(scope="module")
def workflow():
    return yaml.safe_load(WORKFLOW.read_text())


def steps(workflow):
    return [step for job in workflow["jobs"].values() for step in job["steps"]]


def test_the_workflow_runs_ci_s_command_and_publishes_the_build_it_tested(workflow):
    build = workflow["jobs"]["test-and-build"]
    runs = [step.get("run", "") for step in build["steps"]]
    assert runs.count("bash .ci/run") == 1 and "make test" in (ROOT / ".ci" / "run").read_text()
    assert not any("make book" in run or "jupyter-book" in run for run in runs), "the book is built twice"
    folder = build["env"]["MHA_SITE_FOLDER"]
    pages = [s for s in build["steps"] if s.get("uses", "").startswith("actions/upload-pages-artifact")]
    assert len(pages) == 1 and pages[0]["with"]["path"] == f"{folder}/_build/html"
    assert "MHA_SITE_FOLDER" in (ROOT / "tests" / "conftest.py").read_text(), "the tests must build into it"
    assert re.search(r"^book:.*\n(\t.*\n)*\t.*jupyter-book build \. -W -n", (ROOT / "Makefile").read_text(), re.M)


def test_every_action_is_on_its_current_major_version(workflow):
    used = [step["uses"] for step in steps(workflow) if "uses" in step]
    assert {u.split("@")[0] for u in used} <= set(CURRENT), f"an action without a known current version: {used}"
    for use in used:
        name, version = use.split("@")
        assert version == f"v{CURRENT[name]}", f"{name}@{version}: the current major version is v{CURRENT[name]}"


def test_checkout_keeps_no_credentials(workflow):
    checkouts = [s for s in steps(workflow) if s.get("uses", "").startswith("actions/checkout")]
    assert checkouts and all(s.get("with", {}).get("persist-credentials") is False for s in checkouts)


def test_permissions_are_the_least_each_job_needs(workflow):
    assert workflow["permissions"] == {"contents": "read"}
    assert "permissions" not in workflow["jobs"]["test-and-build"]
    assert workflow["jobs"]["deploy"]["permissions"] == {"pages": "write", "id-token": "write"}


def test_a_deploy_that_has_started_is_never_cancelled(workflow):
    cancel = str(workflow["concurrency"]["cancel-in-progress"])
    assert cancel in ("False", "${{ github.event_name == 'pull_request' }}"), cancel
    deploy = workflow["jobs"]["deploy"]
    assert deploy["concurrency"]["cancel-in-progress"] is False
    assert deploy["needs"] == "test-and-build" and deploy["steps"][0]["uses"].startswith("actions/deploy-pages")
    assert "pull_request" in deploy["if"] and "default_branch" in deploy["if"], "only the default branch publishes"


def test_dependabot_proposes_new_versions_of_the_actions():
    config = yaml.safe_load((ROOT / ".github" / "dependabot.yml").read_text())
    ecosystems = {(u["package-ecosystem"], u["directory"]) for u in config["updates"]}
    assert config["version"] == 2 and ("github-actions", "/") in ecosystems
