"""Bad input files, flags and runtime options fail with a one-line :class:`DraftsmithError`.

Covers unreadable or undecodable config and prompt files, ``target.device`` syntax, the bounds
of the runtime options and the memory check of :meth:`DecoderBuffers.allocate`.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

from draftsmith.cli import main
from draftsmith.contract import (
    ConfigError,
    ContextCacheKind,
    ContextEntrySpec,
    DraftsmithError,
    PlanError,
)
from draftsmith.runtime import buffers as buffers_module
from draftsmith.runtime.buffers import DecoderBuffers
from draftsmith.runtime.config import SpecConfig, TargetConfig, read_config_file, resolve_device
from draftsmith.runtime.evaluate import read_prompt_file

NOT_UTF8 = b"\xff\xfe\x00\x81 not text\n"


def _one_error_line(capsys: pytest.CaptureFixture[str], code: int) -> str:
    captured = capsys.readouterr()
    assert code == 2, captured
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in captured.err, captured.err
    return lines[0]


# ---- config files -----------------------------------------------------------------------


@pytest.mark.parametrize("name", ["binary.toml", "binary.json"])
def test_an_undecodable_config_file_is_a_config_error(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    path.write_bytes(NOT_UTF8)
    with pytest.raises(ConfigError, match=rf"{name}' is not UTF-8 text"):
        read_config_file(path)


def test_an_unreadable_config_file_is_a_config_error(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "locked.toml"
    path.write_text("num_draft_tokens = 3\n")

    def refuse(self: Path, *args: object, **kwargs: object) -> str:
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "read_text", refuse)
    with pytest.raises(ConfigError, match="cannot read config file .*locked.toml.*Permission"):
        read_config_file(path)


def test_a_directory_is_not_a_config_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="is a directory"):
        read_config_file(tmp_path)


@pytest.mark.parametrize("argv", [["config", "validate", "{}"], ["plan", "--config", "{}"]])
def test_cli_reports_an_undecodable_config_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    path = tmp_path / "binary.toml"
    path.write_bytes(NOT_UTF8)
    code = main([a.format(path) for a in argv])
    assert "binary.toml' is not UTF-8 text" in _one_error_line(capsys, code)


# ---- prompt files -----------------------------------------------------------------------


def test_an_undecodable_prompt_file_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b'{"prompt": "fine"}\n' + NOT_UTF8)
    with pytest.raises(ConfigError, match="bad.jsonl' is not UTF-8 text"):
        read_prompt_file(path)


def test_an_unreadable_prompt_file_is_a_config_error(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "locked.jsonl"
    path.write_text('{"prompt": "a"}\n')

    def refuse(self: Path, *args: object, **kwargs: object) -> object:
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "open", refuse)
    with pytest.raises(ConfigError, match="cannot read prompt file .*locked.jsonl"):
        read_prompt_file(path)


def test_a_malformed_prompt_line_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "a"}\n{"prompt": \n')
    with pytest.raises(ConfigError, match=r"p.jsonl:2: not valid JSON"):
        read_prompt_file(path)


@pytest.mark.parametrize("limit", [0, -1])
def test_read_prompt_file_rejects_a_limit_below_one(tmp_path: Path, limit: int) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "a"}\n{"prompt": "b"}\n')
    with pytest.raises(ConfigError, match=f"--limit must be >= 1, got {limit}"):
        read_prompt_file(path, limit)
    assert read_prompt_file(path, 1) == ["a"]


# ---- generate / eval flags, checked before a model loads --------------------------------


@pytest.fixture
def no_model(monkeypatch: pytest.MonkeyPatch) -> None:
    from draftsmith.cli import common

    def refuse(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("the flags must be checked before any model loads")

    monkeypatch.setattr(common, "load_decoder", refuse)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["generate", "--prompts", "{p}", "--limit", "0"], "--limit must be >= 1, got 0"),
        (["generate", "--prompts", "{p}", "--limit", "-3"], "--limit must be >= 1, got -3"),
        (["generate", "--prompts", "{bad}"], "bad.jsonl' is not UTF-8 text"),
        (["eval", "--data", "{p}", "--max-new-tokens", "0"], "--max-new-tokens must be >= 1"),
        (["eval", "--data", "{p}", "--max-new-tokens", "-1"], "--max-new-tokens must be >= 1"),
        (["eval", "--data", "{bad}"], "bad.jsonl' is not UTF-8 text"),
    ],
)
def test_generate_and_eval_reject_bad_flags_before_loading(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], no_model: None,
        argv: list[str], message: str) -> None:
    prompts, bad = tmp_path / "p.jsonl", tmp_path / "bad.jsonl"
    prompts.write_text('{"prompt": "a"}\n')
    bad.write_bytes(NOT_UTF8)
    code = main([a.format(p=prompts, bad=bad) for a in argv])
    assert message in _one_error_line(capsys, code)


# ---- target.device ----------------------------------------------------------------------


@pytest.mark.parametrize("device", ["tpu", "cuda:x", "CPU", "cuda:-1", ""])
def test_target_device_is_validated(device: str) -> None:
    with pytest.raises(ConfigError, match=r"target\.device: .* is not a device; use auto, cpu"):
        SpecConfig.from_dict({"target": {"device": device}})


@pytest.mark.parametrize("device", ["auto", "cpu", "cuda", "cuda:0", "cuda:3"])
def test_target_device_accepts_auto_cpu_and_cuda(device: str) -> None:
    # a config written for a GPU host validates anywhere; CUDA is checked when the target loads
    assert SpecConfig.from_dict({"target": {"device": device}}).target.device == device


def test_device_validation_and_resolution_share_one_rule() -> None:
    with pytest.raises(ValidationError, match="not a device"):
        TargetConfig(device="tpu")
    with pytest.raises(ConfigError, match="not a device"):
        resolve_device("tpu")
    from draftsmith.runtime.targets import smollm2
    assert smollm2.resolve_device is resolve_device


# ---- runtime option bounds --------------------------------------------------------------


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
def test_force_accepted_must_be_finite(value: float) -> None:
    with pytest.raises(ConfigError, match="runtime.force_accepted"):
        SpecConfig.from_dict({"runtime": {"force_accepted": value}})


def test_force_accepted_from_toml_inf(tmp_path: Path) -> None:
    path = tmp_path / "inf.toml"
    path.write_text("[runtime]\nforce_accepted = inf\n")
    with pytest.raises(ConfigError, match="runtime.force_accepted: .*finite"):
        SpecConfig.load(path)


def test_page_size_may_not_exceed_max_context() -> None:
    with pytest.raises(ConfigError, match="page_size 1000000 exceeds max_context 96; lower "
                                          "page_size to at most 96"):
        SpecConfig.from_dict({"runtime": {"page_size": 1_000_000, "max_context": 96}})
    ok = SpecConfig.from_dict({"runtime": {"page_size": 96, "max_context": 96}})
    assert ok.runtime.page_size == 96


# ---- buffer allocation ------------------------------------------------------------------

ENTRY = ContextEntrySpec(kind=ContextCacheKind.PAGED_GQA_KV, num_layers=2, planes=2, heads=1,
                         width=3)


def _allocate(slot_capacity: int, **overrides: object) -> DecoderBuffers:
    kwargs: dict[str, object] = dict(
        slot_capacity=slot_capacity, num_draft_tokens=3, block_width=4, vocab_size=16,
        max_ctx=96, page_size=8, entry=ENTRY, pool_dtype=torch.float32, with_draft_probs=True)
    kwargs.update(overrides)
    # the plan's page count for these sizes, as bind passes it
    kwargs["pages_per_slot"] = buffers_module.pages_per_slot(
        kwargs["max_ctx"], kwargs["block_width"], kwargs["page_size"])  # type: ignore[arg-type]
    return DecoderBuffers.allocate(**kwargs)  # type: ignore[arg-type]


def test_absurd_buffers_raise_a_plan_error_before_allocating() -> None:
    with pytest.raises(PlanError, match=r"runtime\.max_batch 10000000 .*runtime\.max_context"):
        _allocate(10_000_000, max_ctx=4096, entry=ContextEntrySpec(
            kind=ContextCacheKind.PAGED_GQA_KV, num_layers=32, planes=2, heads=8, width=128))


def test_buffers_beyond_the_memory_reported_raise_a_plan_error(
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert _allocate(4).slot_capacity == 4  # a normal size fits
    monkeypatch.setattr(buffers_module, "available_bytes", lambda _device: 1024)
    with pytest.raises(PlanError, match=r"but only 0\.0 GiB are of RAM on cpu; lower "
                                        r"runtime\.max_batch or runtime\.max_context") as info:
        _allocate(4)
    assert isinstance(info.value, DraftsmithError) and len(str(info.value).splitlines()) == 1


def test_memory_that_cannot_be_told_is_not_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(buffers_module, "available_bytes", lambda _device: None)
    assert _allocate(2).cache.pool.shape[1] == 3 * 13


def test_available_bytes_reports_host_ram() -> None:
    ram = buffers_module.available_bytes(torch.device("cpu"))
    assert ram is None or ram > 2**20
