"""The CI workflow `transient-init` writes installs the tool from where this installation came
from (issue 35): the tool is on no public index, so a bare `pip install transient-orchestrator`
would fail on the first push.

Each line is checked the way GitHub Actions and the shell read it: the workflow is parsed as
YAML, the step's command split as the shell does, and the requirement parsed as PEP 508 (what
pip reads).
"""

from __future__ import annotations

import shlex
from typing import Any

import pytest
import yaml
from packaging.requirements import Requirement

from orchestrator import init

WORKFLOW_PATH = ".github/workflows/validate-experiments.yml"
COMMIT = "4f3c2b1a" * 5


def _requirement(line: str) -> tuple[str, str]:
    """(the requirement pip gets, the comment) of `line`, read back from a whole workflow."""
    steps = yaml.safe_load(init.WORKFLOW.format(install=line))["jobs"]["validate"]["steps"]
    runs = [s["run"] for s in steps if "run" in s]
    assert runs[-1] == "transient-validate"
    argv = shlex.split(runs[0])
    assert argv[:2] == ["pip", "install"] and len(argv) == 3, argv
    comment = line.split("   # ", 1)[1]
    assert ("# " + comment).startswith(init.CHANGE_MARK + " "), line
    return argv[2], comment


def test_a_vcs_install_is_installed_again_at_its_commit() -> None:
    direct = {"url": "https://github.com/me/transient.git",
              "vcs_info": {"vcs": "git", "commit_id": COMMIT, "requested_revision": "main"}}
    req, comment = _requirement(init.install_line(direct, "0.1.0"))
    assert req == f"transient-orchestrator @ git+https://github.com/me/transient.git@{COMMIT}"
    parsed = Requirement(req)
    assert parsed.name == "transient-orchestrator" and parsed.url and COMMIT in parsed.url
    assert "cannot clone" in comment

    direct["subdirectory"] = "tool"
    req, _ = _requirement(init.install_line(direct, "0.1.0"))
    assert req.endswith(f"@{COMMIT}#subdirectory=tool"), req


def test_a_remote_archive_is_installed_from_its_url_with_its_hash() -> None:
    url = "https://files.example.org/transient_orchestrator-0.1.0-py3-none-any.whl"
    direct = {"url": url, "archive_info": {"hash": "sha256=" + "ab" * 32,
                                           "hashes": {"sha256": "cd" * 32}}}
    req, comment = _requirement(init.install_line(direct, "0.1.0"))
    assert req == f"transient-orchestrator @ {url}#sha256={'cd' * 32}"
    assert Requirement(req).url == f"{url}#sha256={'cd' * 32}"
    assert "archive moves" in comment
    # the older single "hash" field only
    req, _ = _requirement(init.install_line({"url": url, "archive_info": {
        "hash": "sha256=" + "ab" * 32}}, None))
    assert req.endswith("#sha256=" + "ab" * 32), req


@pytest.mark.parametrize("direct, kind", [
    ({"url": "file:///home/me/src/transient", "dir_info": {}}, "a local folder"),
    ({"url": "file:///home/me/src/transient", "dir_info": {"editable": True}},
     "an editable checkout"),
    ({"url": "file:///tmp/dist/transient_orchestrator-0.1.0-py3-none-any.whl",
      "archive_info": {"hashes": {"sha256": "ef" * 32}}}, "a local archive"),
    ({"url": "file:///home/me/src/transient",
      "vcs_info": {"vcs": "git", "commit_id": COMMIT}}, "a local clone"),
])
def test_a_local_install_gets_the_pinned_index_line_and_says_why(direct: dict[str, Any],
                                                                 kind: str) -> None:
    """A file:// URL names this machine's disk, which a CI runner cannot read."""
    req, comment = _requirement(init.install_line(direct, "0.1.0"))
    assert req == "transient-orchestrator==0.1.0"
    assert f"{kind} ({direct['url']}) that a CI runner cannot reach" in comment
    assert "git+URL@COMMIT" in comment


def test_no_direct_url_gets_the_pinned_index_line() -> None:
    req, comment = _requirement(init.install_line(None, "0.1.0"))
    assert req == "transient-orchestrator==0.1.0"
    assert "no index your CI reads serves transient-orchestrator==0.1.0" in comment
    assert "records no URL" in comment
    req, _ = _requirement(init.install_line(None, None))
    assert req == "transient-orchestrator"  # no version known: nothing to pin


def test_the_generated_workflow_carries_this_installations_line() -> None:
    line = init.install_line(*init.this_installation())
    workflow = init.files_for(["ssh"])[WORKFLOW_PATH]
    assert f"      - run: {line}\n" in workflow
    assert "pip install transient-orchestrator   #" not in workflow  # the old bare line
    _requirement(line)
