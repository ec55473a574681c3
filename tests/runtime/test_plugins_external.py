"""A plugin in its own installable package adds a drafter family with no edit to draftsmith.

``tests/fixtures/draftsmith-example-plugin`` is installed with pip into a temporary directory
(real ``.dist-info`` entry-point metadata, found through ``importlib.metadata``); draftsmith then
discovers ``example-mlp`` through the ``draftsmith`` entry-point group, ``draftsmith plugins`` lists
it with its distribution, ``DRAFTSMITH_LOAD_PLUGINS`` restricts loading, and the installed family
passes the conformance kit, both in-process and through the package's own pytest suite.
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

import draftsmith
from draftsmith.runtime.registry import LOAD_PLUGINS_ENV, load_registry, make_plugin_manager
from draftsmith.testing import ConformanceCase, run_conformance

FIXTURE = Path(__file__).parents[1] / "fixtures" / "draftsmith-example-plugin"
DIST = "draftsmith-example-plugin"
FAMILY = "example-mlp"


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """``(site, source)``: the package pip-installed into ``site``, built from a copy ``source``
    (so no build/ or egg-info lands in the checkout)."""
    source = tmp_path_factory.mktemp("source") / DIST
    shutil.copytree(FIXTURE, source,
                    ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    site = tmp_path_factory.mktemp("site")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation",
         "--no-index", "--quiet", "--target", str(site), str(source)],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    return site, source


@pytest.fixture
def site(installed: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The install directory on ``sys.path``, its plugin the only installed one loaded;
    imports undone after."""
    monkeypatch.setenv(LOAD_PLUGINS_ENV, "example")
    monkeypatch.syspath_prepend(str(installed[0]))
    yield installed[0]
    for name in [n for n in sys.modules if n.startswith("draftsmith_example_plugin")]:
        del sys.modules[name]


def _subprocess_env(site: Path) -> dict[str, str]:
    """The plugin's install directory, then the draftsmith under test (not another copy that
    happens to be installed), and nothing else of the caller's path; of the installed plugins,
    this one only."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "PYTHONPATH")}
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(Path(draftsmith.__file__).parents[1])])
    env[LOAD_PLUGINS_ENV] = "example"
    return env


def test_not_discoverable_before_install() -> None:
    """Control: nothing in draftsmith names the family; without the install (draftsmith and its
    built-ins only) it is absent."""
    assert FAMILY not in load_registry(make_plugin_manager(load_entrypoints=False)).families


def test_install_writes_real_entry_point_metadata(site: Path) -> None:
    dist = importlib.metadata.distribution(DIST)
    (ep,) = [e for e in dist.entry_points if e.group == "draftsmith"]
    assert (ep.name, ep.value) == ("example", "draftsmith_example_plugin.plugin")
    assert Path(str(dist.locate_file(""))).resolve() == site.resolve()


def test_registry_discovers_the_installed_family(site: Path) -> None:
    registry = load_registry(make_plugin_manager())
    family = registry.family(FAMILY)
    assert family.distribution == DIST
    assert family.load is not None
    assert Path(sys.modules[family.load.__module__].__file__).is_relative_to(site)
    assert {"dflash", "dspark-gqa", "dspark-mla"} <= set(registry.families)


@pytest.mark.parametrize(
    ("value", "loaded"),
    [("", False), ("example", True), (" example , other ", True), ("other", False)],
)
def test_load_plugins_env_restricts_installed_plugins(
    site: Path, monkeypatch: pytest.MonkeyPatch, value: str, loaded: bool
) -> None:
    monkeypatch.setenv(LOAD_PLUGINS_ENV, value)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        families = load_registry(make_plugin_manager()).families
    # a name no installed plugin has loads nothing, and says so
    assert [str(w.message) for w in caught] == (
        ["DRAFTSMITH_LOAD_PLUGINS names 'other', which no installed plugin has; installed: "
         "example"] if "other" in value else [])
    assert (FAMILY in families) is loaded
    assert {"dflash", "dspark-gqa", "dspark-mla"} <= set(families)  # built-ins always load


def test_cli_lists_the_family_and_its_distribution(installed: tuple[Path, Path]) -> None:
    site = installed[0]
    proc = subprocess.run([sys.executable, "-m", "draftsmith.cli", "plugins"],
                          capture_output=True, text=True, env=_subprocess_env(site), timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    (line,) = [ln for ln in lines if ln.split() and ln.split()[0] == FAMILY]
    assert f"({DIST})" in line
    assert "dflash" in proc.stdout


def test_installed_family_passes_the_conformance_kit(
    site: Path, draftsmith_rank_pool, tmp_path: Path
) -> None:
    from draftsmith.contract import LoadRequest, TargetInfo

    family = load_registry(make_plugin_manager()).family(FAMILY)
    options = family.options_model(hidden_size=24, vocab_size=48, target_hidden_size=24)
    request = LoadRequest(options=options, seed=2,
                          target=TargetInfo(vocab_size=48, hidden_size=24, num_layers=6))
    report = run_conformance(family, request, directory=tmp_path, rank_pool=draftsmith_rank_pool,
                             case=ConformanceCase(context_lengths=(5, 2), committed=(1, 2)))
    assert report.skipped == {}
    assert report.passed == ["capabilities", "shapes_and_dtypes", "determinism",
                             "checkpoint_round_trip", "page_placement_invariance",
                             "request_independence", "tp_agreement"]


def test_plugin_package_runs_the_kit_on_itself(installed: tuple[Path, Path]) -> None:
    """The package's own tests (a DrafterConformance subclass plus a conftest) pass under pytest
    with draftsmith's pytest11 plugin; the TP checks are left to the in-process test above."""
    site, source = installed
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "not tp_agreement"],
        cwd=source, capture_output=True, text=True, env=_subprocess_env(site), timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "12 passed, 2 deselected" in proc.stdout


def test_docs_show_the_example_plugin_code() -> None:
    """docs/plugins.md quotes the example's plugin module verbatim and its block forward."""
    docs = (Path(__file__).parents[2] / "docs" / "plugins.md").read_text(encoding="utf-8")
    package = FIXTURE / "src" / "draftsmith_example_plugin"
    assert (package / "plugin.py").read_text(encoding="utf-8").strip() in docs
    model = (package / "model.py").read_text(encoding="utf-8")
    blocks = docs.split("```python\n")[1:]
    (forward,) = [b.split("```")[0] for b in blocks if "gather_context(cache" in b]
    for line in forward.splitlines():
        code = line.split("  #")[0].strip()
        assert code in model, f"docs/plugins.md shows a line model.py lacks: {code!r}"
    for line in (FIXTURE / "pyproject.toml").read_text(encoding="utf-8").splitlines():
        if line.startswith(("example =", "[project.entry-points.draftsmith]")):
            assert line in docs
