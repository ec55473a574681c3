"""A plugin builds a family on a built-in one (``derive_family``, docs/plugins.md section 7): the
example of the docs, installed as an entry-point plugin, is listed, passes the conformance kit
through its own test, loads the base's checkpoints under its name, and ``generate`` runs it on a
checkpoint or on random weights asked for, and refuses it otherwise."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from _fake_plugin import docs_example, install_acme
from _tiny_models import save_tiny_model

import draftsmith
from draftsmith.cli import main
from draftsmith.contract import (
    BlockConvention,
    LoadRequest,
    PluginError,
    TargetInfo,
)
from draftsmith.drafters.builtin.dflash import DFlashOptions
from draftsmith.drafters.derived import derive_family
from draftsmith.drafters.gqa import load_gqa_drafter
from draftsmith.runtime.registry import LOAD_PLUGINS_ENV, load_registry, make_plugin_manager

TARGET = TargetInfo(vocab_size=64, hidden_size=32, num_layers=8)


@pytest.fixture
def acme(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The docs' plugin installed on ``sys.path``, and the only installed plugin loaded."""
    site = tmp_path / "site"
    install_acme(site)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv(LOAD_PLUGINS_ENV, "acme")
    yield site
    for name in [n for n in sys.modules if n.startswith("acme_drafters")]:
        del sys.modules[name]


def test_the_example_is_about_thirty_lines() -> None:
    plugin, test = docs_example()
    assert len(plugin.splitlines()) + len(test.splitlines()) <= 45


def test_the_example_registers_a_family_of_its_distribution(acme: Path) -> None:
    registry = load_registry(make_plugin_manager())
    family = registry.family("acme-dspark")
    assert family.distribution == "acme-drafters"
    options = family.options_model()
    assert (options.num_layers, options.markov_rank) == (3, 8)
    assert {"dflash", "dspark-gqa", "dspark-mla", "acme-dspark"} == set(registry.families)
    caps = family.capabilities(LoadRequest(options=options, target=TARGET))
    assert caps.family == "acme-dspark" and caps.markov_rank == 8


def test_the_examples_own_conformance_test_passes(acme: Path, tmp_path: Path) -> None:
    """The docs' test module, run by pytest as the plugin's author would run it: all seven
    checks of the kit, the tensor-parallel one on two gloo ranks included."""
    _, test = docs_example()
    tests = tmp_path / "acme_tests"
    tests.mkdir()
    (tests / "test_acme.py").write_text(test)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "PYTHONPATH")}
    env.update(PYTHONPATH=os.pathsep.join([str(acme), str(Path(draftsmith.__file__).parents[1])]),
               TRITON_INTERPRET="1", **{LOAD_PLUGINS_ENV: "acme"})
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", str(tests)],
        capture_output=True, text=True, env=env, cwd=tests, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "7 passed" in proc.stdout and "skipped" not in proc.stdout, proc.stdout[-2000:]


def test_a_base_checkpoint_loads_under_the_derived_name(acme: Path, tmp_path: Path) -> None:
    registry = load_registry(make_plugin_manager())
    base, acme_family = registry.family("dspark-gqa"), registry.family("acme-dspark")
    drafter = base.load(LoadRequest(options=base.options_model(), target=TARGET, seed=2))
    drafter.save(tmp_path / "ckpt")
    request = LoadRequest(options=acme_family.options_model(),
                          checkpoint=tmp_path / "ckpt", target=TARGET)
    loaded = acme_family.load(request)
    assert loaded.capabilities == drafter.capabilities.model_copy(
        update={"family": "acme-dspark"})
    assert acme_family.capabilities(request) == loaded.capabilities


def test_a_derived_dflash_family_keeps_its_block_convention_through_a_checkpoint(
        tmp_path: Path) -> None:
    """The name never decides how a checkpoint reads: a family built on ``dflash`` saves and
    reloads the bonus-silent block (read under its own name by the GQA loader, the block came
    back shifted)."""
    family = derive_family("dflash", name="acme-dflash", summary="dflash, renamed")
    request = LoadRequest(options=DFlashOptions(), target=TARGET, seed=1)
    drafter = family.load(request)
    assert drafter.capabilities.block_convention is BlockConvention.BONUS_SILENT
    drafter.save(tmp_path / "ckpt")
    again = family.load(LoadRequest(options=DFlashOptions(), checkpoint=tmp_path / "ckpt",
                                    target=TARGET))
    assert again.capabilities == drafter.capabilities
    assert again.capabilities.family == "acme-dflash"


def test_the_gqa_loader_refuses_a_name_not_its_own() -> None:
    request = LoadRequest(options=DFlashOptions(), target=TARGET)
    with pytest.raises(PluginError, match=r"not 'acme-dflash'; .*\.derive_family\('dspark-gqa', "
                                          r"name='acme-dflash'"):
        load_gqa_drafter(request, "acme-dflash")


def test_a_derived_family_checks_checkpoints_before_loading_as_its_base_does() -> None:
    """The pre-load check of a checkpoint's tensor headers (``check_checkpoint``) comes with the
    base's loader: without it a derived family's bad checkpoint would be found only when the
    weights load, after the target."""
    for base in ("dflash", "dspark-gqa", "dspark-mla"):
        derived = derive_family(base, name=f"acme-{base}", summary="")
        builtin = next(f for f in load_registry().families.values() if f.name == base)
        assert derived.check_checkpoint is builtin.check_checkpoint is not None


def test_derive_family_refuses_what_cannot_work() -> None:
    with pytest.raises(PluginError, match="no built-in drafter family 'eagle'; built-in: dflash"):
        derive_family("eagle", name="x", summary="")
    with pytest.raises(PluginError, match="needs a name of its own"):
        derive_family("dflash", name="dflash", summary="")
    with pytest.raises(PluginError, match="does not extend dspark-gqa's DSparkGQAOptions"):
        derive_family("dspark-gqa", name="x", summary="", options_model=DFlashOptions)


def test_generate_runs_the_family_on_a_checkpoint_or_random_weights_asked_for(
        acme: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tiny = save_tiny_model(tmp_path / "tiny", seed=4)
    capsys.readouterr()
    base = ["generate", "--prompt", "hi", "--max-new-tokens", "4", "--no-compare", "--device",
            "cpu", "--target", str(tiny), "--drafter", "acme-dspark", "--num-draft-tokens", "2"]
    assert main(base) == 2
    err = capsys.readouterr().err
    assert err.strip() == textwrap.dedent(f"""\
        draftsmith: error: drafter family 'acme-dspark' has no checkpoint for target '{tiny}': \
pass --checkpoint DIR (drafter.checkpoint in a config file), or --random-drafter \
(random_drafter=True in load_decoder) to run random weights, which accept next to nothing""")
    assert main([*base, "--random-drafter"]) == 0
    out = capsys.readouterr().out
    assert "--- summary: acme-dspark, K = 2, greedy ---" in out
    family = load_registry(make_plugin_manager()).family("dspark-gqa")
    family.load(LoadRequest(options=family.options_model(), seed=3,
                            target=TargetInfo(vocab_size=512, hidden_size=64, num_layers=6))
                ).save(tmp_path / "ckpt")
    assert main([*base, "--checkpoint", str(tmp_path / "ckpt")]) == 0
    assert "--- summary: acme-dspark, K = 2, greedy ---" in capsys.readouterr().out
