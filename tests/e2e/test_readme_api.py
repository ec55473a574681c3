"""The README's Python snippet runs as written and gives the tokens ``draftsmith generate`` gives
for the same prompt: on the embedded SmolLM2 with the shipped drafter (skipped until ``make
demo`` has converted it), and, through the same path with a config file, on a tiny model
(always). Without loading anything, ``load_decoder()`` settles on exactly the config that
``draftsmith generate`` with no flags runs."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
from pathlib import Path

import pytest
from _tiny_models import save_tiny_model

from draftsmith.cli import main
from draftsmith.cli.common import SHIPPED_DRAFTER, build_config
from draftsmith.cli.generate import add_generate_arguments
from draftsmith.contract import LoadRequest, TargetInfo
from draftsmith.runtime.api import decoder_config
from draftsmith.runtime.bind import plan_only, target_info_from_config
from draftsmith.runtime.registry import load_registry
from draftsmith.runtime.targets.smollm2 import smollm2_available, smollm2_dir

README = Path(__file__).parents[2] / "README.md"


def readme_snippet() -> str:
    """The README's one Python block, verbatim."""
    (snippet,) = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
    return snippet


def _prompt_and_budget(snippet: str) -> tuple[str, int]:
    match = re.search(r'generate\(\["([^"]+)"\], max_new_tokens=(\d+)\)', snippet)
    assert match, "the snippet generates for one prompt with a max_new_tokens"
    return match.group(1), int(match.group(2))


def _run_snippet(snippet: str) -> tuple[dict, str]:
    """Execute ``snippet``; its namespace and what it printed."""
    namespace: dict = {}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(snippet, str(README), "exec"), namespace)  # noqa: S102 - the README's code
    return namespace, out.getvalue()


def _cli_tokens(capsys, *argv: str) -> list[int]:
    """The tokens ``draftsmith generate`` prints (without its plain-decoding comparison, which
    the snippet's own ``report.exact`` already covers)."""
    capsys.readouterr()
    assert main(["generate", "--json", "--no-compare", *argv]) == 0
    (result,) = json.loads(capsys.readouterr().out)["results"]
    return result["tokens"]


def test_the_snippet_is_short_and_loads_generates_and_reads_text_and_tokens() -> None:
    snippet = readme_snippet()
    code = [line for line in snippet.splitlines() if line.strip()]
    assert len(code) <= 10, snippet
    assert "load_decoder(" in snippet and ".generate(" in snippet
    assert ".text" in snippet and ".tokens" in snippet


def test_load_decoder_runs_what_generate_runs() -> None:
    """``load_decoder()`` binds the shipped bf16 drafter reading layers 1, 14 and 27, exactly as
    ``draftsmith generate`` with no flags does (the README's snippet used to bind a random fp32
    drafter reading layers 1 and 27)."""
    parser = argparse.ArgumentParser()
    add_generate_arguments(parser)
    config = decoder_config()
    assert config == build_config(parser.parse_args([]))
    assert config.drafter.checkpoint == SHIPPED_DRAFTER
    plan = plan_only(config, target_info_from_config(config.target, 1))
    assert plan.decision("capture_layers").value == ("1", "14", "27")
    assert plan.decision("drafter_dtype").value == "bfloat16"


@pytest.mark.skipif(not smollm2_available(),
                    reason=f"SmolLM2-135M-Instruct is not converted in {smollm2_dir()} yet "
                           "(run `make demo`)")
def test_the_snippet_gives_the_clis_tokens_on_the_embedded_target(capsys) -> None:
    snippet = readme_snippet()
    namespace, printed = _run_snippet(snippet)
    result = namespace["result"]
    assert result.text in printed and str(result.tokens) in printed
    prompt, budget = _prompt_and_budget(snippet)
    assert list(result.tokens) == _cli_tokens(capsys, "--prompt", prompt,
                                              "--max-new-tokens", str(budget))


def test_the_snippet_gives_the_clis_tokens_on_a_tiny_model(tmp_path: Path, capsys) -> None:
    """The same snippet with a config file (``load_decoder("spec.toml")``, as the README's
    comment says) against ``generate --config spec.toml``: a tiny target and a dspark-gqa
    checkpoint made for it."""
    tiny = save_tiny_model(tmp_path / "tiny", seed=4)
    family = load_registry().family("dspark-gqa")
    family.load(LoadRequest(options=family.options_model(), seed=5,
                            target=TargetInfo(vocab_size=512, hidden_size=64, num_layers=6))
                ).save(tmp_path / "ckpt")
    spec = tmp_path / "spec.toml"
    spec.write_text(f'num_draft_tokens = 3\n[drafter]\ncheckpoint = "ckpt"\n'
                    f'[target]\nmodel = "{tiny}"\ndevice = "cpu"\n')
    snippet = readme_snippet()
    assert snippet.count("load_decoder()") == 1
    namespace, printed = _run_snippet(snippet.replace("load_decoder()",
                                                      f"load_decoder({str(spec)!r})"))
    result = namespace["result"]
    assert result.text in printed and len(result.tokens) > 0
    assert namespace["report"].exact is True
    prompt, budget = _prompt_and_budget(snippet)
    assert list(result.tokens) == _cli_tokens(capsys, "--config", str(spec), "--prompt", prompt,
                                              "--max-new-tokens", str(budget))
