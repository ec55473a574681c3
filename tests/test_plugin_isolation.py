"""The suite passes with a third-party draftsmith plugin installed beside draftsmith.

A plugin is installed (real ``.dist-info`` entry-point metadata: the docs' ``acme-dspark``, a
family name that sorts before every built-in) and the tests whose assertions name the built-in
families and strategies run in a fresh pytest process that sees it, with
``DRAFTSMITH_LOAD_PLUGINS`` unset, as on a developer's machine: ``tests/conftest.py`` must keep
installed plugins out of them.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from _fake_plugin import DISTRIBUTION, FAMILY, install_acme

import draftsmith
from draftsmith.runtime.registry import LOAD_PLUGINS_ENV

TESTS = Path(__file__).parent

PLUGIN_SENSITIVE = [
    "tests/runtime/test_config.py::test_bad_values_name_the_field",
    "tests/cli/test_cli.py::test_plugins_lists_builtins",
    "tests/cli/test_cli.py::test_config_validate_rejects_with_one_line[unknown-family]",
    "tests/runtime/test_plugin_failures.py::test_an_unknown_name_in_load_plugins_is_warned",
    "tests/runtime/test_plugins_external.py::test_not_discoverable_before_install",
    "tests/runtime/test_plugins.py",
]
"""Tests that list or count what is registered: each failed, or would, with a plugin installed."""


def _env(site: Path) -> dict[str, str]:
    """The plugin's install directory on the path, and no plugin filter."""
    env = {k: v for k, v in os.environ.items()
           if k not in (LOAD_PLUGINS_ENV, "PYTEST_ADDOPTS", "PYTHONPATH")}
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(Path(draftsmith.__file__).parents[1])])
    return env


def test_the_suite_ignores_an_installed_plugin(tmp_path: Path) -> None:
    site = install_acme(tmp_path / "site")
    env = _env(site)
    # control: the plugin really is installed and loads where nothing filters it
    listed = subprocess.run([sys.executable, "-m", "draftsmith", "plugins"], env=env,
                            capture_output=True, text=True, timeout=300)
    assert listed.returncode == 0, listed.stderr
    assert f"  {FAMILY}" in listed.stdout and f"({DISTRIBUTION})" in listed.stdout
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *PLUGIN_SENSITIVE],
        cwd=TESTS.parent, env=env, capture_output=True, text=True, timeout=900,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert " passed" in run.stdout and "failed" not in run.stdout
