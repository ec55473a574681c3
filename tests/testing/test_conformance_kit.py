"""The conformance kit itself: its paging helpers lay out context as the runtime's paging does,
a correct drafter (the example plugin's ``example-mlp``) passes every check, and drafters that
break one promise each fail exactly the check that guards it."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from draftsmith.contract import (
    CheckpointError,
    ConfigError,
    DrafterFamily,
    LoadRequest,
    OutputHead,
    PlanError,
    TargetInfo,
    TPFusion,
)
from draftsmith.drafters.nn import gather_context
from draftsmith.testing import (
    ConformanceCase,
    ConformanceFailure,
    DrafterConformance,
    build_paged_batch,
    check_capabilities,
    check_checkpoint_round_trip,
    check_determinism,
    check_page_placement_invariance,
    check_request_independence,
    check_shapes_and_dtypes,
    check_tp_agreement,
    make_probe,
    page_geometry,
)

EXAMPLE_SRC = Path(__file__).parents[1] / "fixtures" / "draftsmith-example-plugin" / "src"
CASE = ConformanceCase()

pytest_plugins = ["pytester"]


@pytest.fixture(scope="module", autouse=True)
def example_importable() -> Iterator[None]:
    """The example plugin's source on sys.path (the TP ranks receive it with each task)."""
    sys.path.insert(0, str(EXAMPLE_SRC))
    yield
    sys.path.remove(str(EXAMPLE_SRC))
    for name in [n for n in sys.modules if n.startswith("draftsmith_example_plugin")]:
        del sys.modules[name]


def _options(**kw):
    from draftsmith_example_plugin.model import ExampleMLPOptions

    return ExampleMLPOptions(hidden_size=16, vocab_size=32, target_hidden_size=16,
                             intermediate_size=24, head_dim=8, **kw)


def _request(**kw) -> LoadRequest:
    return LoadRequest(options=_options(**kw), seed=11)


# ---- families: module-level loaders, so the TP ranks can unpickle them ----------------------


def load_good(request: LoadRequest):
    from draftsmith_example_plugin.model import load_example_mlp

    return load_example_mlp(request)


def _family(load, name: str = "example-mlp", capabilities=None) -> DrafterFamily:
    from draftsmith_example_plugin.model import ExampleMLPOptions, example_mlp_capabilities

    return DrafterFamily(name=name, summary="test", load=load, options_model=ExampleMLPOptions,
                         capabilities=capabilities or example_mlp_capabilities)


class _Wrapped:
    """Delegates the Drafter Protocol to a correct drafter; subclasses break one method."""

    def __init__(self, inner) -> None:
        self.inner = inner

    @property
    def capabilities(self):
        return self.inner.capabilities

    def project_context(self, features, positions):
        return self.inner.project_context(features, positions)

    def embed_block(self, token_ids, target_embedding):
        return self.inner.embed_block(token_ids, target_embedding)

    def forward_block(self, inputs, placement, cache):
        return self.inner.forward_block(inputs, placement, cache)

    def block_logits(self, hidden, head):
        return self.inner.block_logits(hidden, head)

    def markov_head(self):
        return self.inner.markov_head()

    def confidence(self, hidden, prev_tokens):
        return self.inner.confidence(hidden, prev_tokens)

    def save(self, directory):
        return self.inner.save(directory)


class _TwoHeadsDeclared(_Wrapped):
    @property
    def capabilities(self):
        caps = self.inner.capabilities
        return caps.model_copy(update={"context_entry": caps.context_entry.model_copy(
            update={"heads": 2})})


class _IdentityPageTable(_Wrapped):
    """Assumes request row r owns pages r * P .. r * P + P - 1 (ignores the page table)."""

    def forward_block(self, inputs, placement, cache):
        pages_per_row = placement.block_tables.shape[1]
        own = placement.cache_rows[:, None] * pages_per_row + torch.arange(pages_per_row)
        return self.inner.forward_block(inputs, replace(placement, block_tables=own), cache)


class _ReadsPastNumCtx(_Wrapped):
    def forward_block(self, inputs, placement, cache):
        return self.inner.forward_block(inputs, replace(placement, num_ctx=placement.num_ctx + 1),
                                        cache)


class _Noisy(_Wrapped):
    def forward_block(self, inputs, placement, cache):
        out = self.inner.forward_block(inputs, placement, cache)
        return out + 1e-3 * torch.randn(out.shape, dtype=out.dtype)


class _MixesRequests(_Wrapped):
    """Lets every request see the batch mean: invisible to page placement, not to batching."""

    def forward_block(self, inputs, placement, cache):
        out = self.inner.forward_block(inputs, placement, cache)
        return out + 0.1 * out.mean(0, keepdim=True)


class _WritesPool(_Wrapped):
    def forward_block(self, inputs, placement, cache):
        cache.pool[:, placement.dest_pages[:, 0], ..., 0, :] = 0
        return self.inner.forward_block(inputs, placement, cache)


class _WritesTokenIds(_Wrapped):
    def embed_block(self, token_ids, target_embedding):
        token_ids[:, 1:] = 0
        return self.inner.embed_block(token_ids, target_embedding)


class _Bf16Logits(_Wrapped):
    def block_logits(self, hidden, head):
        shard = self.inner.block_logits(hidden, head)
        return replace(shard, logits=shard.logits.bfloat16())


class _MarkovMissing(_Wrapped):
    def markov_head(self):
        return None


class _ConfidenceUndeclared(_Wrapped):
    @property
    def capabilities(self):
        return self.inner.capabilities.model_copy(update={"confidence_head": False})


class _OwnEmbeddingUndeclared(_Wrapped):
    def embed_block(self, token_ids, target_embedding):
        table = torch.ones_like(target_embedding)  # ignores the target's table
        return self.inner.embed_block(token_ids, table)


class _InconsistentCaps(_Wrapped):
    """A fresh, different capabilities object on every read."""

    calls = 0

    @property
    def capabilities(self):
        _InconsistentCaps.calls += 1
        return self.inner.capabilities.model_copy(update={"trained_block_size": 8 + self.calls})


def _wrapping(cls):
    def load(request: LoadRequest):
        return cls(load_good(request))

    return load


def load_seed_ignored(request: LoadRequest):
    return load_good(replace(request, seed=0))


def load_ignores_checkpoint(request: LoadRequest):
    return load_good(replace(request, checkpoint=None))


def load_unwrapped_errors(request: LoadRequest):
    try:
        return load_good(request)
    except CheckpointError as exc:
        raise RuntimeError(f"cannot read: {exc}") from None


def load_forgets_all_reduce(request: LoadRequest):
    """Each rank skips the MLP all-reduce: the ranks then disagree with TP = 1."""

    class NoReduce:
        def __init__(self, inner) -> None:
            self.rank, self.world_size, self._inner = inner.rank, inner.world_size, inner

        def all_reduce(self, tensor):
            return tensor

        def all_gather(self, tensor, dim=0):
            return self._inner.all_gather(tensor, dim)

    return load_good(replace(request, collectives=NoReduce(request.collectives)))


def load_no_tp(request: LoadRequest):
    if request.collectives.world_size > 1:
        raise PlanError("this family does not shard; use tp_size 1")
    return load_good(request)


class _FusionsDeclared(_Wrapped):
    @property
    def capabilities(self):
        return self.inner.capabilities.model_copy(
            update={"tp_fusions": frozenset({TPFusion.FC_SPLIT_HIDDEN_NORM})})


def load_fusions_but_no_tp(request: LoadRequest):
    return _FusionsDeclared(load_no_tp(request))


# ---- helpers ---------------------------------------------------------------------------------


def test_page_geometry_matches_the_private_pool_rule() -> None:
    # the private pool: ceil((max_ctx + W) / P_sz) pages per slot, G + 1 slots (the dummy last)
    assert page_geometry((7, 1, 13), 3, 3, 4) == (16, 5, 20)
    assert page_geometry((64,), 0, 8, 32) == (64, 3, 6)


def test_build_paged_batch_writes_context_where_the_placement_says() -> None:
    drafter = load_good(_request())
    caps = drafter.capabilities
    probe = make_probe(caps, CASE)
    perm = torch.randperm(20, generator=torch.Generator().manual_seed(0))
    batch = build_paged_batch(
        drafter, probe.features, probe.bonus, committed=CASE.committed,
        num_draft_tokens=CASE.num_draft_tokens, page_size=CASE.page_size, slots=[2, 0, 1],
        page_permutation=perm, fill_seed=5,
    )
    p = batch.placement
    lengths = torch.tensor(CASE.context_lengths)
    n_b = torch.tensor(CASE.committed)
    assert p.cache_rows.tolist() == p.slots.tolist() == [2, 0, 1]
    assert torch.equal(p.block_tables, perm.view(4, 5)[p.slots])
    assert torch.equal(p.query_positions[:, 0], p.new_ctx_len)
    assert torch.equal(p.num_ctx, lengths) and torch.equal(p.new_ctx_len, lengths)
    assert torch.equal(p.ctx_positions[:, 0], lengths - n_b)
    assert torch.equal(p.write_mask.sum(1), n_b)
    for b in range(3):  # every destination lies in the request's own pages
        assert set(p.dest_pages[b].tolist()) <= set(p.block_tables[b].tolist())
        assert torch.equal(p.dest_pages[b], p.block_tables[b][p.dest_cols[b] // CASE.page_size])
    assert torch.equal(batch.inputs.token_ids[:, 0], probe.bonus)
    assert (batch.inputs.token_ids[:, 1:] == caps.mask_token_id).all()
    # reading back through the shared gather gives exactly what project_context returned
    for layer in range(caps.context_entry.num_layers):
        entries, valid = gather_context(batch.cache, p, layer)
        for b, n in enumerate(CASE.context_lengths):
            assert valid[b].sum() == n
            assert torch.equal(entries[b, :n], batch.entries[b][:, layer])
    assert torch.equal(torch.cat(batch.entries), drafter.project_context(
        torch.cat(probe.features), torch.cat([torch.arange(n) for n in CASE.context_lengths])))
    # pages that hold no context hold noise (so stray reads change outputs)
    owned = set(p.block_tables.flatten().tolist())
    spare = [q for q in range(20) if q not in owned]
    assert spare and batch.cache.pool[:, spare].abs().sum() > 0


def test_build_paged_batch_places_like_the_runtime_paging_reference() -> None:
    """The kit's placement equals the runtime's (its eager reference) for the same state."""
    from draftsmith.kernels.paging import prepare_placement_reference

    drafter = load_good(_request())
    caps = drafter.capabilities
    probe = make_probe(caps, CASE)
    perm = torch.randperm(20, generator=torch.Generator().manual_seed(1))
    slots = [1, 2, 0]
    batch = build_paged_batch(
        drafter, probe.features, probe.bonus, committed=CASE.committed, num_draft_tokens=3,
        page_size=4, slots=slots, page_permutation=perm,
    )
    k1, width = 4, caps.block_width(3)
    max_ctx, _, _ = page_geometry(CASE.context_lengths, 3, width, 4)
    n_b = torch.tensor(CASE.committed)
    ctx_len = torch.zeros(4, dtype=torch.int64)  # 3 slots + the dummy
    ctx_len[slots] = torch.tensor(CASE.context_lengths) - n_b  # c_b before the step
    accepted = torch.randint(0, caps.vocab_size, (3, k1), generator=torch.Generator())
    accepted[torch.arange(3), n_b - 1] = probe.bonus
    slots_t = torch.tensor(slots)
    runtime = prepare_placement_reference(
        ctx_len, slots_t, accepted, n_b, perm.view(4, 5), max_ctx, width, 4, 3,
    )
    for name in ("slots", "cache_rows", "bonus", "query_positions", "ctx_positions",
                 "write_mask", "dest_cols", "dest_pages", "dest_offsets", "num_ctx",
                 "new_ctx_len", "block_tables"):
        assert torch.equal(getattr(batch.placement, name), getattr(runtime, name)), name
    assert (batch.placement.rows_start, batch.placement.page_size) == (None, 4)


def test_build_paged_batch_rejects_bad_layouts() -> None:
    drafter = load_good(_request())
    probe = make_probe(drafter.capabilities, CASE)
    kw = dict(committed=CASE.committed, num_draft_tokens=3, page_size=4)
    with pytest.raises(ConfigError, match="permutation"):
        build_paged_batch(drafter, probe.features, probe.bonus, **kw,
                          page_permutation=torch.zeros(20, dtype=torch.int64))
    with pytest.raises(ConfigError, match="distinct slots"):
        build_paged_batch(drafter, probe.features, probe.bonus, **kw, slots=[0, 0, 1])
    with pytest.raises(ConfigError, match="committed"):
        ConformanceCase(context_lengths=(2,), committed=(3,))


# ---- the example passes, through the pytest class --------------------------------------------


class TestExampleThroughTheSuite(DrafterConformance):
    """The whole suite on the example family (from source; tests/runtime/test_plugins_external.py runs
    it on the installed distribution)."""

    def make_family(self) -> DrafterFamily:
        return _family(load_good)

    def make_request(self, family: DrafterFamily) -> LoadRequest:
        return replace(_request(), target=TargetInfo(vocab_size=32, hidden_size=16, num_layers=4))


# ---- each broken drafter fails the check that guards its promise -----------------------------


@pytest.mark.parametrize(
    ("wrapper", "match"),
    [
        (_TwoHeadsDeclared, r"project_context returned shape .* declare"),
        (_MarkovMissing, "declare a vanilla Markov head"),
        (_ConfidenceUndeclared, "no confidence head but confidence"),
        (_OwnEmbeddingUndeclared, "ignores target_embedding"),
        (_InconsistentCaps, "capabilities changed between two reads"),
    ],
)
def test_capability_mismatch_fails(wrapper, match: str) -> None:
    family = _family(_wrapping(wrapper))
    with pytest.raises(ConformanceFailure, match=match):
        check_capabilities(family, family.load(_request()), CASE)


def test_wrong_target_layers_fail() -> None:
    family = _family(load_good)
    request = replace(_request(), target=None)
    drafter = family.load(request)
    too_shallow = replace(request, target=TargetInfo(vocab_size=32, hidden_size=16, num_layers=3))
    with pytest.raises(ConformanceFailure, match="target_layer_ids"):
        check_capabilities(family, drafter, CASE, too_shallow)


def test_declared_capabilities_must_be_the_loaded_drafters() -> None:
    """What draftsmith plan plans from (the family's capabilities(request)) must be what the
    drafter load(request) builds declares; a family with a load must declare them."""
    from draftsmith_example_plugin.model import example_mlp_capabilities

    def wrong(request):
        return example_mlp_capabilities(request).model_copy(update={"trained_block_size": 3})

    family = _family(load_good, capabilities=wrong)
    with pytest.raises(ConformanceFailure, match=r"capabilities\(request\) differs from the "
                                                 r"loaded drafter's in trained_block_size \(3 "
                                                 r"declared, 8 loaded\)"):
        check_capabilities(family, family.load(_request()), CASE, _request())
    family = replace(_family(load_good), capabilities=None)
    with pytest.raises(ConformanceFailure, match="has no capabilities"):
        check_capabilities(family, family.load(_request()), CASE)


def test_misnamed_family_fails() -> None:
    family = _family(load_good, name="other-name")
    with pytest.raises(ConformanceFailure, match="registered as 'other-name'"):
        check_capabilities(family, family.load(_request()), CASE)


@pytest.mark.parametrize(
    ("wrapper", "match"),
    [
        (_Bf16Logits, "dtype float32"),
        (_WritesPool, "wrote into the context pool"),
        (_WritesTokenIds, "wrote into the block's token ids"),
    ],
)
def test_shape_dtype_and_purity_violations_fail(wrapper, match: str) -> None:
    with pytest.raises(ConformanceFailure, match=match):
        check_shapes_and_dtypes(_wrapping(wrapper)(_request()), CASE)


@pytest.mark.parametrize("wrapper", [_IdentityPageTable, _ReadsPastNumCtx])
def test_output_that_depends_on_page_placement_fails(wrapper) -> None:
    drafter = _wrapping(wrapper)(_request())
    check_shapes_and_dtypes(drafter, CASE)  # nothing else is wrong with it
    with pytest.raises(ConformanceFailure, match="depends on page placement"):
        check_page_placement_invariance(drafter, CASE)


def test_requests_that_see_each_other_fail() -> None:
    drafter = _wrapping(_MixesRequests)(_request())
    check_page_placement_invariance(drafter, CASE)  # the leak is invisible to page placement
    with pytest.raises(ConformanceFailure, match="request 0 alone vs in the batch: forward_block"):
        check_request_independence(drafter, CASE)


def test_nondeterminism_fails() -> None:
    with pytest.raises(ConformanceFailure, match="the same drafter called twice"):
        check_determinism(_family(_wrapping(_Noisy)), _request(), CASE)


def test_ignored_seed_fails() -> None:
    with pytest.raises(ConformanceFailure, match="must draw from LoadRequest.seed"):
        check_determinism(_family(load_seed_ignored), _request(), CASE)


def test_checkpoint_that_does_not_load_back_fails(tmp_path: Path) -> None:
    with pytest.raises(ConformanceFailure, match="save then load: .* differs"):
        check_checkpoint_round_trip(_family(load_ignores_checkpoint), _request(), CASE, tmp_path)


def test_corrupt_checkpoint_without_checkpoint_error_fails(tmp_path: Path) -> None:
    with pytest.raises(ConformanceFailure, match="must raise CheckpointError"):
        check_checkpoint_round_trip(_family(load_unwrapped_errors), _request(), CASE, tmp_path)


def test_tp_shards_that_disagree_fail(draftsmith_rank_pool, tmp_path: Path) -> None:
    with pytest.raises(ConformanceFailure, match="TP = 2: .*disagrees with TP = 1"):
        check_tp_agreement(_family(load_forgets_all_reduce), _request(), CASE,
                           draftsmith_rank_pool, tmp_path)


def test_family_without_tp_is_reported_not_failed(draftsmith_rank_pool, tmp_path: Path) -> None:
    reason = check_tp_agreement(_family(load_no_tp), _request(), CASE, draftsmith_rank_pool,
                                tmp_path)
    assert reason is not None and "declares no TP support" in reason and "PlanError" in reason


def test_declared_fusions_without_tp_fail(draftsmith_rank_pool, tmp_path: Path) -> None:
    with pytest.raises(ConformanceFailure, match="list TP fusions"):
        check_tp_agreement(_family(load_fusions_but_no_tp), _request(), CASE,
                           draftsmith_rank_pool, tmp_path)


def test_tp_shards_of_the_example_agree(draftsmith_rank_pool, tmp_path: Path) -> None:
    """Positive control of the failing TP test above: same pool, same sizes, correct drafter."""
    assert check_tp_agreement(_family(load_good), _request(), CASE, draftsmith_rank_pool,
                              tmp_path) is None


def test_full_head_is_what_the_probe_uses() -> None:
    drafter = load_good(_request())
    probe = make_probe(drafter.capabilities, CASE)
    head = OutputHead(weight=probe.head_weight, vocab_start=0, vocab_size=32)
    assert drafter.block_logits(torch.zeros(1, 16), head).is_full


# ---- the pytest class reports failures per check ---------------------------------------------


def test_suite_class_fails_only_the_broken_check(pytester: pytest.Pytester) -> None:
    pytester.syspathinsert(EXAMPLE_SRC)
    pytester.syspathinsert(Path(__file__).parent)
    pytester.makepyfile(
        test_broken="""
        from draftsmith.contract import DrafterFamily, LoadRequest
        from draftsmith.testing import DrafterConformance
        from draftsmith_example_plugin.model import ExampleMLPOptions
        from test_conformance_kit import _family, _wrapping, _IdentityPageTable, _request

        class TestPlacementDependent(DrafterConformance):
            def make_family(self):
                return _family(_wrapping(_IdentityPageTable))

            def make_request(self, family):
                return _request()

        class TestNoFamily(DrafterConformance):
            pass
        """
    )
    result = pytester.runpytest_inprocess("-k", "not tp_agreement", "-p", "no:cacheprovider")
    # a class without a family errors in its fixture (never skips); the broken one fails once
    result.assert_outcomes(passed=5, failed=1, errors=6, deselected=2)
    result.stdout.fnmatch_lines([
        "FAILED *TestPlacementDependent::test_page_placement_invariance*",
        "ERROR *TestNoFamily::test_capabilities*",
    ])
    assert "depends on page placement" in result.stdout.str()
    assert "set family_name" in result.stdout.str()


def test_fixtures_follow_the_command_line_option(pytester: pytest.Pytester) -> None:
    """Without a test class, ``--draftsmith-family`` picks the family the fixtures provide."""
    pytester.makepyfile(
        test_option="""
        def test_family(drafter_family, conformance_request, conformance_case):
            assert drafter_family.name == "dspark-gqa"
            assert isinstance(conformance_request.options, drafter_family.options_model)
            assert conformance_case.num_draft_tokens == 3
        """
    )
    pytester.runpytest_inprocess("--draftsmith-family", "dspark-gqa", "-p", "no:cacheprovider"
                                 ).assert_outcomes(passed=1)
    missing = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    missing.assert_outcomes(errors=1)
    assert "no drafter family to check" in missing.stdout.str()


def test_lazy_names_match_the_modules_exports() -> None:
    """``draftsmith.testing`` lists its lazily loaded names by hand (importing the kit eagerly
    would slow every pytest session): each must resolve, and every public function or class
    that ``conformance`` defines must be among them."""
    import draftsmith.testing as kit
    from draftsmith.testing import conformance, suite

    assert set(kit._HOMES) == set(conformance.__all__) | {"DrafterConformance"}
    assert "DrafterConformance" in suite.__all__
    defined = {
        name for name, value in vars(conformance).items()
        if not name.startswith("_") and getattr(value, "__module__", None) == conformance.__name__
    }
    assert defined <= set(conformance.__all__), sorted(defined - set(conformance.__all__))
    for name in kit._HOMES:
        assert getattr(kit, name) is not None


PLUGINS_DOC = Path(__file__).parents[2] / "docs" / "plugins.md"


def _kit_section() -> str:
    text = PLUGINS_DOC.read_text(encoding="utf-8")
    return text[text.index("## 6. The conformance kit"):text.index("## 7. ")]


def test_every_exported_name_of_the_kit_is_documented() -> None:
    """datasette's ``test_docs`` for the kit: each name ``draftsmith.testing`` exports is named in
    docs/plugins.md section 6 (or removed)."""
    import draftsmith.testing as kit

    section = _kit_section()
    missing = [name for name in kit.__all__ if not re.search(rf"`[^`]*\b{name}\b", section)]
    assert not missing, f"docs/plugins.md section 6 does not document {missing}"


def test_the_docs_example_gets_a_family_and_the_logits_of_a_block() -> None:
    """The example of section 6 ("Tests of your own"), run verbatim."""
    blocks = re.findall(r"```python\n(.*?)```", _kit_section(), re.S)
    (example,) = [b for b in blocks if "run_probe(" in b]
    namespace: dict = {}
    exec(compile(example, str(PLUGINS_DOC), "exec"), namespace)  # noqa: S102 - the docs' code
    logits, drafter = namespace["logits"], namespace["drafter"]
    assert logits.dtype == torch.float32 and torch.isfinite(logits).all()
    assert drafter.capabilities.family == "dspark-gqa"
