"""The Hugging Face target adapter against transformers itself: the feature captured at the end
of layer ``l`` equals ``hidden_states[l + 1]`` (so the last layer cannot be captured), ragged
verify and commit match a fresh forward, and configs it cannot serve are refused."""

from __future__ import annotations

import re

import pytest
import torch
from _tiny_models import make_tiny_causal_lm, save_tiny_model

from draftsmith.contract import ConfigError, PlanError, ShapeError, TargetModel
from draftsmith.runtime.targets.cpu_gemm import PackedLinear
from draftsmith.runtime.targets.hf import HFTarget, load_hf_target

ATOL = 1e-5


@pytest.fixture(scope="module", params=[("llama", "transformers"), ("qwen3", "transformers"),
                                        ("llama", "fused"), ("qwen2", "fused"),
                                        ("qwen3", "fused")], ids="-".join)
def model(request: pytest.FixtureRequest) -> torch.nn.Module:
    """A tiny model, served through transformers' modules or draftsmith's layer loop (which
    :func:`_target` reads from the model; the loop runs its reference ops on the CPU)."""
    architecture, layers = request.param
    model = make_tiny_causal_lm(architecture=architecture, seed=3)
    model.served_by = layers
    return model


def _target(model: torch.nn.Module, **kwargs) -> HFTarget:
    target = HFTarget(model, layers=getattr(model, "served_by", "auto"), **kwargs)
    assert target.layer_path == getattr(model, "served_by", "transformers")
    return target


def _cached_length(target: HFTarget, slot: int) -> int:
    """Tokens ``target`` holds in its cache for ``slot`` by its host-side count (0 when free)."""
    return target._lengths[slot]


def _reference(model: torch.nn.Module, ids: torch.Tensor, layers: list[int]):
    out = model(ids[None], output_hidden_states=True)
    feats = [out.hidden_states[i + 1][0] for i in layers]
    return out.logits[0].float(), torch.cat(feats, dim=-1) if feats else None


def test_is_a_target_model(model: torch.nn.Module) -> None:
    target = _target(model)
    assert isinstance(target, TargetModel)
    assert (target.vocab_size, target.hidden_size, target.num_layers) == (512, 64, 6)
    assert target.input_embedding() is model.get_input_embeddings().weight
    head = target.output_head()
    assert head.weight is model.get_output_embeddings().weight
    assert (head.vocab_start, head.vocab_size) == (0, 512)


def test_tied_head_is_the_embedding_table() -> None:
    target = HFTarget(make_tiny_causal_lm(tie_word_embeddings=True))
    assert target.output_head().weight.data_ptr() == target.input_embedding().data_ptr()


def test_prefill_features_equal_hidden_states_l_plus_1(model: torch.nn.Module) -> None:
    target = _target(model)
    layers = [0, 2, -1]
    target.set_capture_layers(layers)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 512, (n,), generator=g) for n in (7, 3, 11)]
    out = target.prefill([4, 0, 2], prompts)
    assert out.logits.logits.dtype == torch.float32 and out.logits.is_full
    assert out.features.shape == (21, 3 * 64) and out.features.dtype == model.dtype
    row = 0
    for prompt in prompts:
        logits, _ = _reference(model, prompt, [])
        hs = model(prompt[None], output_hidden_states=True).hidden_states
        want = torch.cat([hs[1][0], hs[3][0], hs[0][0]], dim=-1)
        n = prompt.numel()
        torch.testing.assert_close(out.logits.logits[row:row + n], logits, atol=ATOL, rtol=0)
        torch.testing.assert_close(out.features[row:row + n], want, atol=ATOL, rtol=0)
        row += n


def test_last_layer_and_out_of_range_ids_are_refused(model: torch.nn.Module) -> None:
    target = _target(model)
    with pytest.raises(PlanError, match="last of 6 layers"):
        target.set_capture_layers([0, 5])
    with pytest.raises(PlanError, match="outside -1 .. 4"):
        target.set_capture_layers([-2])
    with pytest.raises(PlanError):
        target.set_capture_layers([7])


def test_ragged_verify_and_commit_match_a_fresh_forward(model: torch.nn.Module) -> None:
    """Several steps with different commit lengths per request: every verify row's logits and
    features equal a fresh full forward of the committed sequence plus the verified tokens."""
    target = _target(model, max_slots=8)
    layers = [1, 2]
    target.set_capture_layers(layers)
    g = torch.Generator().manual_seed(1)
    slots = [5, 1, 6, 3]
    seqs = [torch.randint(0, 512, (n,), generator=g) for n in (4, 9, 6, 6)]
    target.prefill(slots, seqs)
    k1 = 4
    commits = [[1, 4, 2, 3], [4, 1, 1, 2], [2, 3, 4, 1], [3, 3, 3, 3], [1, 2, 1, 4]]
    for step, counts in enumerate(commits):
        tokens = torch.randint(0, 512, (len(slots), k1), generator=g)
        out = target.verify(slots, tokens)
        assert out.logits.logits.shape == (len(slots) * k1, 512)
        for b in range(len(slots)):
            full = torch.cat([seqs[b], tokens[b]])
            logits, feats = _reference(model, full, layers)
            rows = slice(b * k1, (b + 1) * k1)
            torch.testing.assert_close(
                out.logits.logits[rows], logits[-k1:], atol=ATOL, rtol=0,
                msg=lambda m, s=step, r=b: f"step {s} request {r}: {m}",
            )
            torch.testing.assert_close(out.features[rows], feats[-k1:], atol=ATOL, rtol=0)
            seqs[b] = torch.cat([seqs[b], tokens[b, : counts[b]]])
        target.commit(slots, [s.numel() for s in seqs])
        assert [_cached_length(target, s) for s in slots] == [s.numel() for s in seqs]


def test_batched_verify_equals_one_slot_at_a_time(model: torch.nn.Module) -> None:
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, 512, (n,), generator=g) for n in (3, 8, 5)]
    tokens = torch.randint(0, 512, (3, 3), generator=g)
    batched = _target(model)
    batched.prefill([0, 1, 2], prompts)
    together = batched.verify([0, 1, 2], tokens).logits.logits
    single = _target(model)
    for b, prompt in enumerate(prompts):
        single.prefill([b], [prompt])
        alone = single.verify([b], tokens[b:b + 1]).logits.logits
        torch.testing.assert_close(together[b * 3:(b + 1) * 3], alone, atol=ATOL, rtol=0)


def test_release_and_prefill_reset_a_slot(model: torch.nn.Module) -> None:
    target = _target(model)
    a, b = torch.arange(1, 6), torch.arange(10, 13)
    target.prefill([0], [a])
    target.release([0])
    assert _cached_length(target, 0) == 0
    with pytest.raises(ShapeError, match="call prefill first"):
        target.verify([0], torch.zeros(1, 2, dtype=torch.int64))
    target.prefill([0], [a])
    target.prefill([0], [b])  # a new prefill replaces the old sequence
    assert _cached_length(target, 0) == 3
    got = target.verify([0], torch.tensor([[7, 8]])).logits.logits
    want, _ = _reference(model, torch.cat([b, torch.tensor([7, 8])]), [])
    torch.testing.assert_close(got, want[-2:], atol=ATOL, rtol=0)


def test_bad_calls_raise_shape_errors(model: torch.nn.Module) -> None:
    target = _target(model, max_slots=2)
    with pytest.raises(ShapeError, match="empty"):
        target.prefill([0], [torch.zeros(0, dtype=torch.int64)])
    with pytest.raises(ShapeError, match="outside 0 .. 1"):
        target.prefill([2], [torch.arange(3)])
    with pytest.raises(ShapeError, match="repeat"):
        target.prefill([0, 0], [torch.arange(3), torch.arange(3)])
    with pytest.raises(ShapeError, match="int64"):
        target.prefill([0], [torch.arange(3, dtype=torch.int32)])
    target.prefill([0], [torch.arange(3)])
    with pytest.raises(ShapeError, match="commit length 9"):
        target.commit([0], [9])


def test_sliding_window_configs_are_refused() -> None:
    model = make_tiny_causal_lm(architecture="qwen3")
    model.config.layer_types = ["full_attention", "sliding_attention"] * 2
    with pytest.raises(ConfigError, match="sliding-window"):
        HFTarget(model)


def test_a_mistral_style_window_alone_is_refused() -> None:
    """Mistral configs carry only ``sliding_window``: the ragged verify mask would ignore it."""
    model = make_tiny_causal_lm(architecture="llama")
    model.config.sliding_window = 8  # no layer_types, no use_sliding_window flag
    with pytest.raises(ConfigError, match="sliding-window"):
        HFTarget(model)
    model.config.sliding_window = model.config.max_position_embeddings  # a window that never cuts
    HFTarget(model)


@pytest.mark.parametrize("key,value", [("logit_scale", 0.0625), ("logits_scaling", 2.0),
                                       ("final_logit_softcapping", 30.0)])
def test_configs_that_rescale_the_logits_are_refused(key: str, value: float) -> None:
    model = make_tiny_causal_lm(architecture="llama")
    setattr(model.config, key, value)
    with pytest.raises(ConfigError, match=key):
        HFTarget(model)


def test_load_hf_target_round_trip(tmp_path) -> None:
    directory = save_tiny_model(tmp_path / "tiny", seed=5)
    target, tokenizer = load_hf_target(str(directory))
    assert target.vocab_size == 512 and tokenizer.eos_token_id == 258
    reference = make_tiny_causal_lm(seed=5)
    ids = torch.arange(20, 30)
    got = target.prefill([0], [ids]).logits.logits
    torch.testing.assert_close(got, reference(ids[None]).logits[0], atol=ATOL, rtol=0)


def test_load_hf_target_bad_directories(tmp_path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_hf_target(str(tmp_path / "missing"))
    with pytest.raises(ConfigError, match="no config.json"):
        load_hf_target(str(tmp_path))


@pytest.mark.gpu
def test_bf16_cuda_ragged_verify_matches_a_fresh_forward() -> None:
    """Invariant 2 in bf16 on a GPU: captured features and logits within bf16 tolerance."""
    model = make_tiny_causal_lm(seed=6, dtype=torch.bfloat16).cuda()
    target = HFTarget(model)
    target.set_capture_layers([0, 3])
    g = torch.Generator().manual_seed(4)
    seqs = [torch.randint(0, 512, (n,), generator=g) for n in (5, 13, 8)]
    target.prefill([0, 1, 2], seqs)
    for counts in ([1, 3, 2], [3, 1, 3]):
        tokens = torch.randint(0, 512, (3, 3), generator=g)
        out = target.verify([0, 1, 2], tokens.cuda())
        assert out.features.dtype == torch.bfloat16 and out.logits.logits.dtype == torch.float32
        for b in range(3):
            full = torch.cat([seqs[b], tokens[b]]).cuda()
            ref = model(full[None], output_hidden_states=True)
            want = torch.cat([ref.hidden_states[1][0, -3:], ref.hidden_states[4][0, -3:]], -1)
            rows = slice(3 * b, 3 * b + 3)
            torch.testing.assert_close(out.features[rows].float(), want.float(), atol=1e-2,
                                       rtol=1e-2)
            torch.testing.assert_close(out.logits.logits[rows], ref.logits[0, -3:].float(),
                                       atol=0.1, rtol=0.05)
            seqs[b] = torch.cat([seqs[b], tokens[b, : counts[b]]])
        target.commit([0, 1, 2], [s.numel() for s in seqs])


def test_cache_reaches_decoders_that_call_it_past_key_values() -> None:
    """transformers before 5.2x names the decoder's cache argument ``past_key_values``; an
    unknown keyword would be swallowed by ``**kwargs`` and verify would run without a cache."""
    model = make_tiny_causal_lm(seed=8)
    reference = HFTarget(model)
    decoder = model.get_decoder()
    current = decoder.forward

    class OldDecoder(torch.nn.Module):
        """The same decoder behind the older argument name."""

        def __init__(self) -> None:
            super().__init__()
            self.inner = decoder
            self.layers = decoder.layers

        def forward(self, input_ids=None, attention_mask=None, position_ids=None,
                    past_key_values=None, use_cache=None, **kwargs):
            assert "cache" not in kwargs, "the old API must receive past_key_values"
            return current(input_ids=input_ids, attention_mask=attention_mask,
                           position_ids=position_ids, use_cache=use_cache,
                           **{reference._cache_kwarg: past_key_values})

    old = HFTarget(model)
    old._decoder = OldDecoder()
    assert old._cache_kwarg == "past_key_values"
    assert reference._cache_kwarg in ("cache", "past_key_values")
    prompt = torch.arange(3, 12)
    tokens = torch.tensor([[5, 6, 7]])
    for target in (reference, old):
        target.prefill([0], [prompt])
    got = old.verify([0], tokens).logits.logits
    want = reference.verify([0], tokens).logits.logits
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    assert _cached_length(old, 0) == _cached_length(reference, 0) == 12


def test_forward_rows_at_ragged_positions_matches_a_fresh_forward(model: torch.nn.Module) -> None:
    """The runtime's forward: rows are slots 0..G-1, each at its own position (a device
    tensor), keys and values written in place; logits and features equal a fresh forward of each
    row's sequence, and a row's later columns do not leak into an earlier query."""
    target = _target(model, max_slots=4)
    layers = [0, 3]
    target.set_capture_layers(layers)
    target.reserve(3, 64)
    g = torch.Generator().manual_seed(7)
    seqs = [torch.randint(0, 512, (n,), generator=g) for n in (9, 4, 13)]
    target.prefill([0, 1, 2], seqs)
    starts = torch.tensor([s.numel() for s in seqs])
    tokens = torch.randint(0, 512, (3, 4), generator=g)
    out = target.forward_rows(tokens, starts, 32)
    for b in range(3):
        logits, feats = _reference(model, torch.cat([seqs[b], tokens[b]]), layers)
        rows = slice(4 * b, 4 * b + 4)
        torch.testing.assert_close(out.logits.logits[rows], logits[-4:], atol=ATOL, rtol=0)
        torch.testing.assert_close(out.features[rows], feats[-4:], atol=ATOL, rtol=0)
    # commit one token of row 1 only: its next forward overwrites the rejected columns
    starts2 = starts + torch.tensor([4, 1, 2])
    nxt = torch.randint(0, 512, (3, 2), generator=g)
    out = target.forward_rows(nxt, starts2, 32)
    kept = [torch.cat([seqs[0], tokens[0]]), torch.cat([seqs[1], tokens[1, :1]]),
            torch.cat([seqs[2], tokens[2, :2]])]
    for b in range(3):
        logits, _ = _reference(model, torch.cat([kept[b], nxt[b]]), [])
        torch.testing.assert_close(out.logits.logits[2 * b : 2 * b + 2], logits[-2:],
                                   atol=ATOL, rtol=0)
    with pytest.raises(ShapeError, match="static cache"):
        target.forward_rows(nxt, starts2, 128)  # wider than the cache holds


def test_forward_rows_of_packed_tokens_equals_the_block(model: torch.nn.Module,
                                                        monkeypatch) -> None:
    """``compute_rows``: a packed verify of each row's first tokens (ragged: 4, 1 and 2 of a
    [3, 5] block, then two tokens after them that no row's prefix reaches) gives those tokens'
    logits and features as the whole block computes them, writes their keys and values as the
    block does, and the next forward over the kept tokens sees the same cache. The fused loop's
    projections (6 layers of 4) run on the 9 packed rows, not the block's 15."""
    from draftsmith.runtime.targets import hf_layers

    gemm_rows: list[int] = []

    def counting(real):
        def counted(x, *args, **kwargs):
            gemm_rows.append(x.shape[0])
            return real(x, *args, **kwargs)
        return counted

    # the torch path's GEMM, and the few-row path's products where it runs
    for name in ("linear", "decode_linear"):
        monkeypatch.setattr(hf_layers, name, counting(getattr(hf_layers, name)))
    layers = [0, 3]
    g = torch.Generator().manual_seed(11)
    seqs = [torch.randint(0, 512, (n,), generator=g) for n in (9, 4, 13)]
    starts = torch.tensor([s.numel() for s in seqs])
    tokens = torch.randint(0, 512, (3, 5), generator=g)
    kept = [0, 1, 2, 3, 5, 10, 11]  # b * 5 + j of the rows' admitted prefixes
    pick = torch.tensor(kept + [4, 8])  # padding tokens past those prefixes
    outs, caches = [], []
    for rows in (None, pick):
        target = _target(model, max_slots=4)
        target.set_capture_layers(layers)
        target.reserve(3, 64)
        target.prefill([0, 1, 2], seqs)
        gemm_rows.clear()
        outs.append(target.forward_rows(tokens, starts, 32, compute_rows=rows))
        # 6 layers of 4 products, and the head's when the few-row path carries it
        assert model.served_by != "fused" or (
            set(gemm_rows) == {15 if rows is None else 9} and len(gemm_rows) in (24, 25))
        caches.append(target)
    block, packed = outs
    assert packed.logits.logits.shape[0] == packed.features.shape[0] == pick.numel()
    torch.testing.assert_close(packed.logits.logits[:7], block.logits.logits[kept], atol=ATOL,
                               rtol=0)
    torch.testing.assert_close(packed.features[:7], block.features[kept], atol=ATOL, rtol=0)
    for layer in range(6):
        for b, n in enumerate((4, 1, 2)):
            cols = slice(int(starts[b]), int(starts[b]) + n)
            for kv in ("keys", "values"):
                torch.testing.assert_close(getattr(caches[1]._kv, kv)[layer][b, :, cols],
                                           getattr(caches[0]._kv, kv)[layer][b, :, cols],
                                           atol=ATOL, rtol=0)
    nxt = torch.randint(0, 512, (3, 2), generator=g)
    after = starts + torch.tensor([4, 1, 2])
    a, b = (t.forward_rows(nxt, after, 32).logits.logits for t in caches)
    torch.testing.assert_close(b, a, atol=ATOL, rtol=0)
    with pytest.raises(ShapeError, match="not both"):
        caches[1].forward_rows(nxt, after, 32, logit_rows=torch.tensor([0]),
                               compute_rows=torch.tensor([0]))
    with pytest.raises(ShapeError, match="compute_rows"):
        caches[1].forward_rows(nxt, after, 32, compute_rows=torch.tensor([0.0]))


def test_load_hf_target_never_unpickles(tmp_path) -> None:
    """A directory whose weights are only a pickle is refused by the loader itself (the API
    path), not only by the command's pre-check: unpickling can run code."""
    model = make_tiny_causal_lm(seed=2)
    model.save_pretrained(tmp_path)
    for weights in tmp_path.glob("*.safetensors"):
        weights.unlink()
    torch.save(model.state_dict(), tmp_path / "pytorch_model.bin")
    with pytest.raises(ConfigError, match="cannot load a causal LM"):
        load_hf_target(str(tmp_path))


def test_prefill_widths_pad_at_most_half_and_fit_the_cache() -> None:
    from draftsmith.runtime.buckets import PREFILL_TOKENS, PREFILL_WIDTHS, prefill_width

    assert PREFILL_WIDTHS[0] == 16 and PREFILL_WIDTHS[-1] == PREFILL_TOKENS
    for n in range(1, PREFILL_TOKENS + 1, 7):
        w = prefill_width(n, 10**6)
        assert w in PREFILL_WIDTHS and n <= w and (w <= 16 or w <= 1.5 * n)
    assert prefill_width(114, 120) == 120  # capped by the cache room
    assert prefill_width(114, 100) == 114  # never below the prompt


def test_prefill_runs_ladder_widths(model: torch.nn.Module, monkeypatch) -> None:
    """A batch of prompts is right-padded to a ladder width (so shapes repeat across prompts),
    and its rows still equal a fresh forward of each prompt (checked above)."""
    target = _target(model)
    target.reserve(4, 256)
    widths = []
    real = target._forward_slots

    def spy(slots, tokens, starts):
        widths.append(int(tokens.shape[1]))
        return real(slots, tokens, starts)

    monkeypatch.setattr(target, "_forward_slots", spy)
    out = target.prefill([1], [torch.arange(1, 38)])
    assert widths == [48] and out.logits.logits.shape[0] == 37
    target.warm_prefill(100)  # on the CPU: nothing to warm
    assert widths == [48]


@pytest.mark.gpu
def test_warm_prefill_runs_each_width_once_and_keeps_the_cache() -> None:
    target = HFTarget(make_tiny_causal_lm(architecture="llama", seed=3).cuda())
    target.reserve(2, 256)
    version = target.cache_version
    target.warm_prefill(100)
    assert target._warm_widths == {16, 24, 32, 48, 64, 96, 128}
    target.warm_prefill(1000)  # beyond the cache: only the widths that fit
    assert max(target._warm_widths) == 256 and target.cache_version == version


def test_forward_rows_into_a_slot_with_last_logits_equals_prefill(model: torch.nn.Module) -> None:
    """A one-prompt admission: forward_rows of the padded prompt into slot 3 at position 0,
    logits of its last token only, gives prefill's last logits and features, and the slot's
    cache then verifies like a prefilled one."""
    target = _target(model)
    target.set_capture_layers([1])
    target.reserve(4, 64)
    prompt = torch.arange(3, 40)
    want = target.prefill([2], [prompt])
    padded = torch.zeros(1, 48, dtype=torch.int64)
    padded[0, :37] = prompt
    out = target.forward_rows(padded, torch.zeros(1, dtype=torch.int64), 48,
                              slots=torch.tensor([3]), logit_rows=torch.tensor([36]))
    assert out.logits.logits.shape == (1, 512) and out.features.shape[0] == 48
    torch.testing.assert_close(out.logits.logits, want.logits.logits[-1:], atol=ATOL, rtol=0)
    torch.testing.assert_close(out.features[:37], want.features, atol=ATOL, rtol=0)
    block = torch.tensor([[5, 6, 7]])
    starts = torch.tensor([37])
    a = target.forward_rows(block, starts, 40, slots=torch.tensor([3]))
    b = target.forward_rows(block, starts, 40, slots=torch.tensor([2]))
    torch.testing.assert_close(a.logits.logits, b.logits.logits, atol=ATOL, rtol=0)


def test_gemm_choice_is_checked_and_packed_on_the_cpu(model: torch.nn.Module) -> None:
    assert _target(model).gemm == "packed"  # test_cpu_gemm.py checks what it does
    assert not any(type(m).__name__ == "RowStableLinear" for m in model.modules())
    with pytest.raises(ConfigError, match="row-stable.*GPU.*'auto' or 'torch'"):
        _target(model, gemm="row-stable")
    with pytest.raises(ConfigError, match="target.gemm must be"):
        _target(model, gemm="cutlass")


def test_a_cpu_target_that_cannot_pack_says_why_it_runs_torch_gemm(
        model: torch.nn.Module, monkeypatch: pytest.MonkeyPatch) -> None:
    """``auto`` falls back to torch's GEMM where the packed product cannot run, and the plan's
    ``target_gemm`` gives the blocker, not a generic line."""
    from draftsmith.runtime import bind as bind_module
    from draftsmith.runtime.targets import hf_gemm

    assert _target(model).gemm_reason == ""
    monkeypatch.setattr(hf_gemm, "packed_blocker", lambda dtype, device: "no oneDNN in this build")
    target = _target(model)
    assert target.gemm == "torch"
    assert "no oneDNN in this build" in target.gemm_reason
    info = bind_module._target_info(target)
    assert info.gemm == "torch" and info.gemm_reason == target.gemm_reason
    assert _target(model, gemm="torch").gemm_reason == ""  # asked for: nothing fell back


def test_target_layers_refuses_what_the_loop_cannot_run() -> None:
    model = make_tiny_causal_lm(seed=4)
    with pytest.raises(ConfigError, match="target.layers must be"):
        HFTarget(model, layers="eager")
    model.config.hidden_act = "gelu"
    with pytest.raises(ConfigError, match="cannot run this model: hidden_act 'gelu'"):
        HFTarget(model, layers="fused")
    kept = HFTarget(model)
    assert kept.layer_path == "transformers" and "hidden_act" in kept.layer_path_reason
    assert kept.gemm == "packed" and isinstance(kept.model.lm_head, PackedLinear)


@pytest.mark.gpu
def test_fp32_cuda_target_runs_the_row_stable_gemm() -> None:
    from draftsmith.runtime.targets.hf_gemm import RowStableLinear

    model = make_tiny_causal_lm(seed=4).to("cuda")
    keys = list(model.state_dict())
    target = HFTarget(model)
    assert target.gemm == "row-stable"
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert linears and all(type(m) is RowStableLinear for m in linears)
    assert list(model.state_dict()) == keys
    torch_target = HFTarget(make_tiny_causal_lm(seed=4).to("cuda"), gemm="torch")
    assert torch_target.gemm == "torch"
    g = torch.Generator().manual_seed(2)
    prompt, tokens = (torch.randint(0, 512, (n,), generator=g).to("cuda") for n in (9, 8))
    got = target.prefill([0], [prompt]).logits.logits
    want = torch_target.prefill([0], [prompt]).logits.logits
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    block = target.verify([0], tokens[None]).logits.logits
    torch.testing.assert_close(block, torch_target.verify([0], tokens[None]).logits.logits,
                               atol=1e-4, rtol=1e-4)
    steps = []
    target.release([0])
    target.prefill([0], [prompt])
    for i in range(8):
        steps.append(target.verify([0], tokens[None, i : i + 1]).logits.logits)
        target.commit([0], [prompt.numel() + i + 1])
    torch.testing.assert_close(block, torch.cat(steps), atol=1e-5, rtol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("architecture", ["llama", "qwen2", "qwen3"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_the_fused_layer_loop_on_a_gpu(architecture, dtype) -> None:
    """On a GPU ``auto`` takes the layer loop (its kernels): logits and features match
    transformers' modules to rounding, a block verifies as its tokens decode one at a time (fp32),
    and a decoding step issues well under half the kernels."""
    model = make_tiny_causal_lm(architecture=architecture, seed=5, dtype=dtype).cuda()
    fused = HFTarget(model)
    reference = HFTarget(make_tiny_causal_lm(architecture=architecture, seed=5,
                                             dtype=dtype).cuda(), layers="transformers")
    assert fused.layer_path == "fused" and "layer loop" in fused.layer_path_reason
    for target in (fused, reference):
        target.set_capture_layers([0, 3])
    g = torch.Generator().manual_seed(2)
    prompt, tokens = (torch.randint(0, 512, (n,), generator=g).cuda() for n in (11, 6))
    tol = dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else dict(atol=0.1, rtol=0.05)
    for call in (lambda t: t.prefill([0], [prompt]), lambda t: t.verify([0], tokens[None])):
        got, want = call(fused), call(reference)
        torch.testing.assert_close(got.logits.logits, want.logits.logits, **tol)
        torch.testing.assert_close(got.features.float(), want.features.float(), **tol)
    block = fused.verify([0], tokens[None]).logits.logits  # positions 17 .. 22
    fused.commit([0], [17])
    steps = [fused.verify([0], tokens[None, i : i + 1]).logits.logits for i in range(6)]
    if dtype == torch.float32:
        torch.testing.assert_close(block, torch.cat(steps), atol=1e-5, rtol=1e-5)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fused.verify([0], tokens[None, :1])
        torch.cuda.synchronize()
    fused_kernels = sum(e.count for e in prof.key_averages() if e.device_type.name == "CUDA")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        reference.verify([0], tokens[None, :1])
        torch.cuda.synchronize()
    reference_kernels = sum(e.count for e in prof.key_averages()
                            if e.device_type.name == "CUDA")
    assert fused_kernels * 2 < reference_kernels, (fused_kernels, reference_kernels)


@pytest.mark.parametrize(("option", "value"), [("pdl", "on"), ("few_rows", "fast")])
def test_load_hf_target_refuses_an_unknown_option_before_it_reads_the_directory(
        tmp_path, option: str, value: str) -> None:
    # the directory does not exist: a refusal naming the option came before any load
    with pytest.raises(ConfigError, match=f"target.{option} must be one of"):
        load_hf_target(str(tmp_path / "absent"), **{option: value})


@pytest.mark.parametrize(("version", "refused"), [("4.57.1", True), ("5.3.0.dev0", True),
                                                  ("5.17.0", False), ("5.25.0", False)])
def test_transformers_older_than_517_is_refused_with_the_upgrade(monkeypatch, version,
                                                                refused) -> None:
    import transformers

    from draftsmith.runtime.targets.hf_model import require_transformers

    monkeypatch.setattr(transformers, "__version__", version)
    if refused:
        with pytest.raises(ConfigError, match=rf"needs transformers 5.17 or later, found "
                                              rf"{re.escape(version)}: pip install -U"):
            require_transformers()
    else:
        assert require_transformers() is transformers
