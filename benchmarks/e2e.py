"""End to end on one GPU: speculative decoding against the best plain decoding a user has.

For each dtype (bf16, fp32) and batch size ``B`` (default 1, 2, 4, ... 128; ``B`` requests in
flight, continuous batching over the prompt list), on SmolLM2-135M-Instruct with the shipped
DSpark drafter, K = 7 (or ``--k auto``), greedy, chat template, stop at EOS, over ``--prompts``
prompts (default: the largest batch, at least 128; gsm8k's first, then humaneval's and
mt-bench's; fewer than the largest batch is refused, so no reported batch runs mostly empty):

* ``spec``: draftsmith speculative decoding (rounds captured in CUDA graphs);
* ``plain``: draftsmith plain decoding (``K = 0``, the same graph-captured target path);
* ``plain-cublas`` (where ``target.gemm = auto`` takes the row-stable GEMM, fp32 on CUDA): the
  same with ``target.gemm = torch``, cuBLAS at every row count, faster from about 32 rows; the
  ``vs plain`` ratios of ``spec`` rows are against the faster of the two;
* ``hf-eager``: transformers ``generate`` (eager, dynamic cache; left-padded batches of ``B``);
* ``recipe``: transformers with a ``StaticCache`` and the one-token step (argmax and position
  update included) captured in one CUDA graph, replayed per token (written here; left-padded
  batches of ``B``);
* ``zlab``: z-lab's ``dflash_generate`` (batch 1 only, eager, the first ``--zlab-limit``
  prompts of each set) against draftsmith on the same z-lab-layout DFlash checkpoint, both
  against draftsmith's plain decoding of those prompts (``plain@zlab``):
  ``--dflash-checkpoint DIR`` (a trained one, run with its own block), else random weights with
  ``K = 7`` (both then accept next to nothing: the figure is the time per round).

Every decoding is warmed up (graphs captured, kernels compiled) by an untimed call of its
first ``max(B, 16)`` prompts at the full budget before it is timed; under ``--k auto``, until
the decoder the timed call takes (the ``K`` chosen for its rows) has run. Under ``--k auto``
the ``spec`` and ``plain`` rows carry the cost model's figures for the rounds the timed call
took (``docs/decoding.md``): ``pred``, the tokens/s it predicted when ``K`` was chosen (from
the bind-time profile corrected by the warm-up's rounds); ``rounds``, the tokens/s those rounds
took; ``p/m``, their ratio. Both leave admission (prefill) out, which the ``tok/s`` column
includes.

The ``spec`` rows end with a trace of the timed call: the median and slowest round, the slowest
admission and the garbage collector's passes, which tell a one-off stall from per-round cost. Beside each
tokens/s figure: the accepted length (tau, bonus included) and exactness against draftsmith's
plain decoding of the same prompts (token for token). Ratios are against the faster of
``plain`` and ``plain-cublas`` of the same dtype and batch in the same run. The slow baselines
(``hf-eager``, ``recipe``, ``zlab``) run on the first ``--slow-limit`` prompts of each set drawn; the
``plain@slow`` row is draftsmith plain on exactly those prompts, the fair denominator for them.

    python benchmarks/e2e.py --out $OUT                    # the GPU table (writes e2e.json/.txt)
    python benchmarks/e2e.py --plot e2e.json               # tokens/s, speed-up and the cost
                                                           # model's p/m against batch size
    python benchmarks/e2e.py --smoke                       # tiny sizes on the CPU

``--temperature T`` (default 0: greedy) and ``--top-p P`` (default 1) make ``spec`` and ``plain``
sample alike (selection ``sample``, fixed request seeds); ``exact`` is then ``-`` and the slow
baselines, greedy only, are skipped: ``--smoke --temperature 0.7 --top-p 0.95`` on the CPU.
"""

from __future__ import annotations

import argparse
import gc
import inspect
import json
import sys
import tempfile
import time
from pathlib import Path

import torch
from _timing import machine_tag

HERE = Path(__file__).resolve().parent
DATA = HERE.parent.parent / "shared" / "data"
SETS = ("gsm8k", "humaneval", "mt-bench")
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _prompts(data: Path, limit: int) -> list[tuple[str, str]]:
    """The first ``limit`` ``(set, prompt)`` pairs of each set (``round.py`` and ``tp_e2e.py``
    draw theirs so)."""
    from draftsmith.runtime.evaluate import read_prompt_file

    out = []
    for name in SETS:
        out += [(name, p) for p in read_prompt_file(data / f"{name}.jsonl", limit)]
    return out


def _draw_prompts(data: Path, count: int) -> list[tuple[str, str]]:
    """``count`` ``(set, prompt)`` pairs: gsm8k's first, then humaneval's, then mt-bench's.

    :raises SystemExit: when the sets together hold fewer than ``count``."""
    from draftsmith.runtime.evaluate import read_prompt_file

    out: list[tuple[str, str]] = []
    for name in SETS:
        if len(out) < count:
            out += [(name, p) for p in read_prompt_file(data / f"{name}.jsonl",
                                                        count - len(out))]
    if len(out) < count:
        raise SystemExit(f"e2e: {data} holds {len(out)} prompts in {', '.join(SETS)}; "
                         f"--prompts {count} asks for more")
    return out


def _slow_subset(prompts: list[tuple[str, str]], per_set: int) -> list[tuple[str, str]]:
    """The first ``per_set`` prompts of each set present: what the slow baselines decode."""
    taken: dict[str, int] = {}
    out = []
    for name, text in prompts:
        if taken.get(name, 0) < per_set:
            taken[name] = taken.get(name, 0) + 1
            out.append((name, text))
    return out


def _k_arg(text: str) -> int | str:
    """``--k``: an integer, or ``auto``."""
    return text if text == "auto" else int(text)


SEED = 0
"""Request ``i`` samples with seed ``SEED + i``, so sampled runs repeat draw for draw."""


def _seeds(n: int) -> list[int]:
    return [SEED + i for i in range(n)]


def _selection(temperature: float, top_p: float) -> dict:
    """The ``selection`` table: greedy at ``T = 0``, else keyed sampling at ``T`` and ``top_p``."""
    if temperature == 0.0:
        return {"kind": "greedy"}
    return {"kind": "sample", "temperature": temperature, "top_p": top_p, "seed": SEED}


def _spec_config(dtype_name: str, batch: int, k: int | str, family: str = "dspark-gqa",
                 checkpoint: str | None = None, verify_schedule: str = "all",
                 temperature: float = 0.0, top_p: float = 1.0, drafter_dtype: str | None = None,
                 overlap: str = "auto"):
    from draftsmith.cli.common import SHIPPED_DRAFTER
    from draftsmith.runtime.config import SpecConfig

    return SpecConfig.from_dict({
        "drafter": {"family": family, "checkpoint": checkpoint or str(SHIPPED_DRAFTER),
                    "dtype": drafter_dtype},
        "num_draft_tokens": k,
        "selection": _selection(temperature, top_p),
        "target": {"model": "smollm2-135m", "dtype": _dtype_field(dtype_name),
                   "device": "cuda" if torch.cuda.is_available() else "cpu"},
        "runtime": {"max_batch": batch, "max_context": 2048, "verify_schedule": verify_schedule,
                    "overlap": overlap},
    })


def _dtype_field(dtype_name: str) -> str:
    """The config's spelling (``bfloat16``, ``float32``) of ``--dtypes``' ``bf16`` / ``fp32``."""
    return {"bf16": "bfloat16"}.get(dtype_name, "float32")


def _decoder(target, tokenizer, dtype_name: str, batch: int, k: int | str, family: str = "dspark-gqa",
             checkpoint: str | None = None, verify_schedule: str = "all",
             temperature: float = 0.0, top_p: float = 1.0, drafter_dtype: str | None = None,
             overlap: str = "auto"):
    """A decoder whose speculative path and plain (``K = 0``) baseline share one selection."""
    from draftsmith.runtime.api import load_decoder

    config = _spec_config(dtype_name, batch, k, family, checkpoint, verify_schedule,
                          temperature, top_p, drafter_dtype, overlap)
    return load_decoder(config, target=target, tokenizer=tokenizer)


def _cache_kwarg(model) -> str:
    params = inspect.signature(model.get_decoder().forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def _left_pad(batch: list[list[int]], pad: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(p) for p in batch)
    ids = torch.full((len(batch), width), pad, dtype=torch.int64)
    mask = torch.zeros(len(batch), width, dtype=torch.int64)
    for i, p in enumerate(batch):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    return ids.to(device), mask.to(device)


def _cut(row: list[int], stops: set[int], n: int) -> list[int]:
    row = row[:n]
    for i, t in enumerate(row):
        if t in stops:
            return row[: i + 1]
    return row


def hf_eager(model, ids: list[list[int]], batch: int, max_new: int, stops: set[int], pad: int
             ) -> tuple[list[list[int]], float]:
    """transformers ``generate``, greedy, eager, left-padded batches; (tokens, seconds)."""
    out, seconds = [], 0.0
    for lo in range(0, len(ids), batch):
        chunk = ids[lo : lo + batch]
        inp, mask = _left_pad(chunk, pad, model.device)
        _sync()
        t0 = time.perf_counter()
        gen = model.generate(input_ids=inp, attention_mask=mask, max_new_tokens=max_new,
                             do_sample=False, eos_token_id=sorted(stops), pad_token_id=pad)
        _sync()
        seconds += time.perf_counter() - t0
        out += [_cut(row[inp.shape[1]:], stops, max_new) for row in gen.tolist()]
    return out, seconds


class StaticGraphRecipe:
    """Plain greedy decoding as a user would write it with transformers alone: a ``StaticCache``,
    an eager prefill, and the one-token step (forward, argmax, position and mask update)
    captured once in a CUDA graph and replayed per token. Batches are left-padded; a 2-D mask
    buffer marks the real columns, the new column is switched on inside the graph."""

    def __init__(self, model, batch: int, max_len: int, pad: int) -> None:
        import transformers

        self.model, self.batch, self.max_len, self.pad = model, batch, max_len, pad
        self.kw = _cache_kwarg(model)
        self.cache = transformers.StaticCache(config=model.config, max_cache_len=max_len)
        dev = model.device
        self.token = torch.zeros(batch, 1, dtype=torch.int64, device=dev)
        self.position = torch.zeros(batch, 1, dtype=torch.int64, device=dev)
        self.column = torch.zeros(1, dtype=torch.int64, device=dev)
        self.mask = torch.zeros(batch, max_len, dtype=torch.int64, device=dev)
        self.graph = None

    def _step(self) -> None:
        self.mask.index_fill_(1, self.column, 1)
        out = self.model(input_ids=self.token, position_ids=self.position,
                         attention_mask=self.mask, use_cache=True, **{self.kw: self.cache})
        self.token.copy_(out.logits[:, -1:].argmax(-1))
        self.position.add_(1)
        self.column.add_(1)

    def _prefill(self, chunk: list[list[int]]) -> torch.Tensor:
        self.cache.reset()
        inp, mask = _left_pad(chunk, self.pad, self.model.device)
        rows, width = inp.shape
        if rows < self.batch:  # pad the batch with copies of the first row
            inp = torch.cat([inp, inp[:1].expand(self.batch - rows, -1)])
            mask = torch.cat([mask, mask[:1].expand(self.batch - rows, -1)])
        self.mask.zero_()
        self.mask[:, :width] = mask
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        out = self.model(input_ids=inp, attention_mask=self.mask[:, :width],
                         position_ids=positions, use_cache=True, **{self.kw: self.cache})
        self.token.copy_(out.logits[:, -1:].argmax(-1))
        self.position.copy_(positions[:, -1:] + 1)
        self.column.fill_(width)
        return self.token[:, 0].clone()

    def capture(self, example: list[int]) -> None:
        self._prefill([example] * self.batch)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                self._step()
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self._step()

    def generate(self, ids: list[list[int]], max_new: int, stops: set[int]
                 ) -> tuple[list[list[int]], float]:
        out, seconds = [], 0.0
        for lo in range(0, len(ids), self.batch):
            chunk = ids[lo : lo + self.batch]
            steps = min(max_new, self.max_len - max(len(p) for p in chunk)) - 1
            history = torch.empty(self.batch, steps + 1, dtype=torch.int64,
                                  device=self.model.device)
            _sync()
            t0 = time.perf_counter()
            history[:, 0] = self._prefill(chunk)
            for i in range(steps):  # no host read inside: every step is one replay
                self.graph.replay()
                history[:, i + 1] = self.token[:, 0]
            rows = history.tolist()
            _sync()
            seconds += time.perf_counter() - t0
            out += [_cut(row, stops, max_new) for row in rows[: len(chunk)]]
        return out, seconds


def _zlab_checkpoint(path: Path, target_model, layers: int = 5, block: int = 8):
    """A random z-lab ``DFlashDraftModel`` for the target, saved at ``path``."""
    import dflash.model as zlab
    import transformers

    cfg = target_model.config
    config = transformers.Qwen3Config(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size, num_hidden_layers=layers,
        num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads,
        head_dim=cfg.hidden_size // cfg.num_attention_heads,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        max_position_embeddings=4096, num_target_layers=cfg.num_hidden_layers,
        dflash_config={"target_layer_ids": zlab.build_target_layer_ids(cfg.num_hidden_layers,
                                                                       layers),
                       "mask_token_id": cfg.vocab_size - 1, "block_size": block},
    )
    torch.manual_seed(0)
    model = zlab.DFlashDraftModel(config).eval()
    model.save_pretrained(path)
    return model.to(target_model.device, target_model.dtype)


class Table:
    """Rows printed as they come and kept for the JSON report."""

    HEAD = (f"{'dtype':<6}{'B':>4}  {'decoding':<12}{'prompts':>8}{'tokens':>8}{'tok/s':>9}"
            f"{'vs plain':>10}{'tau':>7}{'exact':>9}{'pred':>9}{'rounds':>9}{'p/m':>7}  note")
    """``pred``: the cost model's tokens/s for the rounds the run took, predicted when ``K`` was
    chosen; ``rounds``: the tokens/s those rounds took (both leave admission out); ``p/m``:
    their ratio (``--k auto`` only)."""

    def __init__(self, out: Path | None) -> None:
        self.rows: list[dict] = []
        self.out = out
        self.lines = [self.HEAD]
        print(self.HEAD, flush=True)

    def add(self, **row) -> None:
        self.rows.append(row)
        ratio, tau = row.get("vs_plain"), row.get("tau")
        line = (f"{row['dtype']:<6}{row['batch']:>4}  {row['decoding']:<12}{row['prompts']:>8}"
                f"{row['tokens']:>8}{row['tokens_per_s']:>9.1f}"
                f"{(f'{ratio:.2f}x' if ratio else '-'):>10}"
                f"{(f'{tau:.2f}' if tau else '-'):>7}"
                f"{row.get('exact', '-'):>9}"
                f"{_figure(row.get('predicted_tokens_per_s'), '.1f'):>9}"
                f"{_figure(row.get('rounds_tokens_per_s'), '.1f'):>9}"
                f"{_figure(row.get('predicted_over_measured'), '.2f'):>7}"
                f"  {row.get('note', '')}")
        self.lines.append(line)
        print(line, flush=True)
        self.save()

    def save(self) -> None:
        if self.out is None:
            return
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "e2e.json").write_text(json.dumps({"machine": machine_tag(_DEVICE),
                                                       "rows": self.rows}, indent=1))
        (self.out / "e2e.txt").write_text("\n".join(self.lines) + "\n")


def _figure(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _rates(rates) -> dict:
    """A row's cost-model fields from a report's ``RoundRates`` (none without one)."""
    if rates is None:
        return {}
    return dict(predicted_tokens_per_s=rates.predicted_tokens_per_s,
                rounds_tokens_per_s=rates.measured_tokens_per_s,
                predicted_over_measured=rates.ratio, cost_model=rates.source)


def _exact(got: list[list[int]], want: list[list[int]], sampled: bool = False) -> str:
    """``same/total`` token for token; ``-`` when sampled (equal in distribution only)."""
    if sampled:
        return "-"
    same = sum(a == b for a, b in zip(got, want, strict=True))
    return f"{same}/{len(want)}"


WARM_UP_PROMPTS = 16
"""Prompts a warm-up call decodes at least (all of them when the batch is larger)."""


def _warm_up(dec, ids: list[list[int]], batch: int, max_new_tokens: int,
             compare_plain: bool) -> None:
    """Untimed calls of the first ``max(batch, WARM_UP_PROMPTS)`` prompts at the timed call's
    budget until the decoder the timed call takes has run once. Under ``--k auto`` a warm-up's
    accepted lengths and round times correct the cost model, so the timed call may bind another
    ``K`` (another decoder): it is warmed too (at most three calls). The full budget lets the
    round times the model learns reach the contexts the timed call reaches; at least
    :data:`WARM_UP_PROMPTS` prompts keep one prompt's acceptance from standing for all."""
    ran = []  # the decoders themselves: an id alone could be reused once one is freed
    for _ in range(3):
        dec.generate_ids(ids[: max(batch, WARM_UP_PROMPTS)], max_new_tokens,
                         compare_plain=compare_plain)
        ran.append(dec.spec)
        timed = dec.spec_for(len(ids))
        if any(d is timed for d in ran):
            return


class _Trace:
    """Wall time of the timed call's slowest round and admission and of the garbage
    collector's passes during the speculative generation, to tell one-off stalls from the
    steady per-round cost (wraps one decoder's bound methods for the ``with``)."""

    def __init__(self, spec) -> None:
        self.spec, self.steps, self.admits, self.gc = spec, [], [], []
        self._gc_start, self.active = 0.0, False

    def _timed(self, fn, into):
        def run(*a, **kw):
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                into.append(time.perf_counter() - t0)
        return run

    def _generate(self, fn):
        def run(*a, **kw):
            self.active = True
            try:
                return fn(*a, **kw)
            finally:
                self.active = False
        return run

    def _on_gc(self, phase: str, info: dict) -> None:
        if not self.active:
            return
        if phase == "start":
            self._gc_start = time.perf_counter()
        else:
            self.gc.append((info.get("generation", -1), time.perf_counter() - self._gc_start))

    def __enter__(self):
        self.spec.generate = self._generate(self.spec.generate)
        self.spec._admit_all = self._timed(self.spec._admit_all, self.admits)
        gc.callbacks.append(self._on_gc)
        return self

    def __exit__(self, *exc) -> None:
        del self.spec.generate, self.spec._admit_all
        gc.callbacks.remove(self._on_gc)
        # the rounds' own records: with runtime.overlap a round's time runs from the commit
        # of the one before (the host's work overlaps the next round)
        self.steps = [r.seconds for r in self.spec.rounds]

    def summary(self) -> str:
        def top(xs):
            return f"{max(xs) * 1e3:.1f} ms" if xs else "-"
        full = [t for g, t in self.gc if g == 2]
        steps = sorted(self.steps)
        median = steps[len(steps) // 2] * 1e3 if steps else 0.0
        return (f"trace: {len(steps)} steps, median {median:.2f} ms, slowest {top(steps)}; "
                f"slowest admission {top(self.admits)}; gc {len(self.gc)} passes "
                f"{sum(t for _, t in self.gc) * 1e3:.0f} ms, of them {len(full)} full "
                f"{sum(full) * 1e3:.0f} ms")


def _sampling_note(args: argparse.Namespace, plan) -> str:
    """``T=0.7 top-p 0.95; ...``: the settings and the selection path the plan chose, or ``""``
    when greedy."""
    if args.temperature == 0.0:
        return ""
    words = f"T={args.temperature}" + (f" top-p {args.top_p}" if args.top_p < 1.0 else "")
    route, rule = plan.decision("target_selection"), plan.decision("acceptance_rule")
    return (f"{words} (exact: sampled output is compared by distribution in the test suite, not "
            f"here); selection {route.value} ({route.reason}); acceptance {rule.value}; ")


def _sampling_fields(args: argparse.Namespace) -> dict:
    return dict(temperature=args.temperature, top_p=args.top_p)


def _scheduled(target, tokenizer, dtype_name: str, batch: int, args: argparse.Namespace,
               schedule: str, ids: list[list[int]], spec_report, best_plain: float,
               plain_tokens: list[list[int]], table: Table) -> None:
    """The ``spec-<schedule>`` row: the same decoding under ``runtime.verify_schedule``, with
    its ratio to plain and to verifying every draft (``spec``, the issue's comparison)."""
    dec = _decoder(target, tokenizer, dtype_name, batch, args.k,
                   verify_schedule=schedule, temperature=args.temperature,
                   top_p=args.top_p)
    _warm_up(dec, ids, batch, args.max_new_tokens, compare_plain=False)
    with _Trace(dec.spec_for(len(ids))) as trace:
        report = dec.generate_ids(ids, args.max_new_tokens, compare_plain=False,
                                  seeds=_seeds(len(ids)))
    rate = report.spec_tokens_per_s
    plan = dec.spec.plan
    table.add(dtype=dtype_name, batch=batch, **_sampling_fields(args),
              decoding=f"spec-{schedule}",
              prompts=len(ids), tokens=report.num_tokens, tokens_per_s=rate,
              vs_plain=rate / best_plain,
              tau=report.mean_accepted_length,
              exact=_exact([list(r.tokens) for r in report.results], plain_tokens,
                           args.temperature > 0),
              **_rates(report.spec_rates),
              note=_sampling_note(args, plan)
              + f"{rate / spec_report.spec_tokens_per_s:.2f}x spec (verify all); "
                   f"cuda_graphs {plan.cuda_graphs}; scheduled rows: "
                   f"{plan.decision('scheduled_rows').reason}; sps: "
                   + (plan.decision("sps").reason if plan.verify_schedule != "top-budget"
                      else "-")
              + "; " + trace.summary())


def run_dtype(dtype_name: str, args: argparse.Namespace, table: Table) -> None:
    from draftsmith.runtime.config import TargetConfig
    from draftsmith.runtime.targets.smollm2 import load_target

    device = "cuda" if torch.cuda.is_available() else "cpu"
    spec = TargetConfig(model="smollm2-135m", dtype={"bf16": "bfloat16"}.get(dtype_name, "float32"),
                        device=device)
    target, tokenizer = load_target(spec, max_slots=max(args.batches) + 2)
    model = target.model
    # where target.gemm = auto picks the row-stable GEMM (fp32 on CUDA), plain decoding with
    # cuBLAS is timed too: at 32-64 rows cuBLAS is the faster, and the baseline is the faster
    cublas = None
    if target.gemm == "row-stable":
        cublas, _ = load_target(spec.model_copy(update={"gemm": "torch"}),
                                max_slots=max(args.batches) + 2)
    prompts = _draw_prompts(Path(args.data), args.prompts)
    slow = _slow_subset(prompts, args.slow_limit)
    for batch in args.batches:
        dec = _decoder(target, tokenizer, dtype_name, batch, args.k,
                       temperature=args.temperature, top_p=args.top_p)
        sampled = args.temperature > 0
        stops = set(dec.stop_token_ids)
        ids = [dec.encode(text) for _, text in prompts]
        slow_ids = [dec.encode(text) for _, text in slow]
        common = dict(dtype=dtype_name, batch=batch, **_sampling_fields(args))
        # warm-up (untimed): captures both decoders' rounds and compiles every kernel
        _warm_up(dec, ids, batch, args.max_new_tokens, compare_plain=True)
        with _Trace(dec.spec_for(len(ids))) as trace:
            report = dec.generate_ids(ids, args.max_new_tokens, compare_plain=True,
                                      seeds=_seeds(len(ids)))
        plain_rate = report.plain_tokens_per_s
        plain_tokens = [list(r.plain_tokens) for r in report.results]
        sampling = _sampling_note(args, dec.spec.plan)
        table.add(**common, decoding="plain", prompts=len(ids),
                  tokens=sum(len(t) for t in plain_tokens), tokens_per_s=plain_rate,
                  vs_plain=1.0, **_rates(report.plain_rates),
                  note=_sampling_note(args, dec.plain.plan) + report.baseline)
        best, best_name = plain_rate, "plain"
        if cublas is not None:
            alt = _decoder(cublas, tokenizer, dtype_name, batch, 0,
                           temperature=args.temperature, top_p=args.top_p)
            alt.generate_ids(ids[: max(batch, 2)], 16, compare_plain=False)  # warm-up
            got = alt.generate_ids(ids, args.max_new_tokens, compare_plain=False,
                                   seeds=_seeds(len(ids)))
            rate = got.spec_tokens_per_s
            table.add(**common, decoding="plain-cublas", prompts=len(ids), tokens=got.num_tokens,
                      tokens_per_s=rate, vs_plain=rate / plain_rate,
                      exact=_exact([list(r.tokens) for r in got.results], plain_tokens, sampled),
                      note="draftsmith plain decoding with target.gemm = torch (cuBLAS at every "
                           "row count), graph-captured; exact = same tokens as plain")
            if rate > best:
                best, best_name = rate, "plain-cublas"
        table.add(**common, decoding="spec", prompts=len(ids), tokens=report.num_tokens,
                  tokens_per_s=report.spec_tokens_per_s,
                  vs_plain=report.spec_tokens_per_s / best,
                  tau=report.mean_accepted_length,
                  exact=_exact([list(r.tokens) for r in report.results], plain_tokens, sampled),
                  **_rates(report.spec_rates),
                  note=sampling + f"vs {best_name} (the faster plain); "
                  f"shipped dspark-gqa, K = {report.num_draft_tokens}"
                  + (f" (auto: {report.draft_tokens_reason})" if args.k == "auto" else "")
                  + "; per set tau " + ", ".join(
                      f"{name} {_tau(report, prompts, name):.2f}"
                      for name in SETS if any(n == name for n, _ in prompts))
                  + "; " + trace.summary())
        for schedule in args.verify_schedule:
            if schedule != "all":
                _scheduled(target, tokenizer, dtype_name, batch, args, schedule, ids, report,
                           best, plain_tokens, table)
        if "zlab" in args.parts and batch == 1 and not sampled:  # z-lab's loop: batch 1, greedy
            zlab_ids = [dec.encode(text) for _, text in _slow_subset(prompts, args.zlab_limit)]
            run_zlab(target, tokenizer, model, dtype_name, zlab_ids, stops, args, table)
        if not args.slow_limit or sampled:  # the slow baselines decode greedily only
            continue
        # the slow baselines, on the first --slow-limit prompts of each set
        _sync()
        t0 = time.perf_counter()
        ref = dec.plain.generate(slow_ids, args.max_new_tokens, sorted(stops))
        _sync()
        slow_plain_s = time.perf_counter() - t0
        ref_tokens = [list(r.tokens) for r in ref]
        slow_rate = sum(map(len, ref_tokens)) / slow_plain_s
        table.add(**common, decoding="plain@slow", prompts=len(slow_ids),
                  tokens=sum(map(len, ref_tokens)), tokens_per_s=slow_rate, vs_plain=1.0,
                  note="draftsmith plain on the slow baselines' prompts")
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        if "recipe" in args.parts and device == "cuda":
            recipe = StaticGraphRecipe(model, batch, max(map(len, slow_ids)) +
                                       args.max_new_tokens + 1, pad)
            recipe.capture(slow_ids[0])
            recipe.generate(slow_ids[:batch], 8, stops)  # warm-up
            got, seconds = recipe.generate(slow_ids, args.max_new_tokens, stops)
            table.add(**common, decoding="recipe", prompts=len(slow_ids),
                      tokens=sum(map(len, got)), tokens_per_s=sum(map(len, got)) / seconds,
                      vs_plain=(sum(map(len, got)) / seconds) / slow_rate,
                      exact=_exact(got, ref_tokens),
                      note="StaticCache + one CUDA graph per token step; vs plain@slow")
            del recipe
        if "hf" in args.parts:
            hf_eager(model, slow_ids[:1], batch, 8, stops, pad)  # warm-up
            got, seconds = hf_eager(model, slow_ids, batch, args.max_new_tokens, stops, pad)
            table.add(**common, decoding="hf-eager", prompts=len(slow_ids),
                      tokens=sum(map(len, got)), tokens_per_s=sum(map(len, got)) / seconds,
                      vs_plain=(sum(map(len, got)) / seconds) / slow_rate,
                      exact=_exact(got, ref_tokens), note="transformers generate; vs plain@slow")


def _tau(report, prompts, name: str) -> float:
    lengths = [n for (set_name, _), r in zip(prompts, report.results, strict=True)
               if set_name == name for n in r.accepted_lengths]
    return sum(lengths) / max(len(lengths), 1)


def run_zlab(target, tokenizer, model, dtype_name, ids, stops, args, table) -> None:
    """Time per round: z-lab's eager loop against draftsmith on the same DFlash checkpoint."""
    import dflash.model as zlab

    if _DEVICE != "cuda":  # z-lab's round timer synchronizes CUDA; the CPU smoke needs none
        zlab._cuda_time = time.perf_counter
    with tempfile.TemporaryDirectory() as tmp:
        if args.dflash_checkpoint is not None:  # a trained z-lab layout drafter, its own block
            where = str(args.dflash_checkpoint)
            drafter = zlab.DFlashDraftModel.from_pretrained(where).to(
                model.device, model.dtype).eval()
            block, what = drafter.block_size, f"z-lab DFlash drafter {where}"
        else:
            block, where = (8 if args.k == "auto" else args.k + 1), tmp
            drafter, what = _zlab_checkpoint(Path(tmp), model, block=block), "random z-lab DFlash drafter"
        k = block - 1
        # both loops run the drafter in the target's dtype (z-lab's is cast to it above)
        dec = _decoder(target, tokenizer, dtype_name, 1, k, family="dflash",
                       checkpoint=where, drafter_dtype=_dtype_field(dtype_name))
        dec.generate_ids(ids[:2], 16, compare_plain=True)  # warm-up, plain decoding too
        report = dec.generate_ids(ids, args.max_new_tokens, compare_plain=True)
        plain_rate = report.plain_tokens_per_s  # graph-captured plain, the same prompts
        ours_rounds = len(report.accepted_lengths)
        zlab.dflash_generate(drafter, model, torch.tensor([ids[0]], device=model.device), 8,
                             stop_token_ids=sorted(stops), temperature=0.0, block_size=block)
        tokens, accepted, seconds = [], [], 0.0
        for p in ids:
            _sync()
            t0 = time.perf_counter()
            out = zlab.dflash_generate(drafter, model, torch.tensor([p], device=model.device),
                                       args.max_new_tokens, stop_token_ids=sorted(stops),
                                       temperature=0.0, block_size=block, return_stats=True)
            _sync()
            seconds += time.perf_counter() - t0
            accepted += list(out.acceptance_lengths)
            tokens.append(_cut(out.output_ids[0, len(p):].tolist(), stops, args.max_new_tokens))
    ours = [list(r.tokens) for r in report.results]
    ours_ms = report.spec_seconds / max(ours_rounds, 1) * 1e3
    zlab_ms = seconds / max(len(accepted), 1) * 1e3
    plain = [list(r.plain_tokens) for r in report.results]
    common = dict(dtype=dtype_name, batch=1, prompts=len(ids))
    table.add(**common, decoding="plain@zlab", tokens=sum(map(len, plain)),
              tokens_per_s=plain_rate, vs_plain=1.0,
              note="draftsmith plain decoding on the z-lab comparison's prompts")
    table.add(**common, decoding="ds-dflash", tokens=sum(map(len, ours)),
              tokens_per_s=report.spec_tokens_per_s, vs_plain=report.spec_tokens_per_s / plain_rate,
              tau=report.mean_accepted_length, exact=_exact(ours, plain),
              note=f"draftsmith, {what}, K = {k}: {ours_ms:.2f} ms/round; exact = same tokens "
                   "as plain")
    zlab_rate = sum(map(len, tokens)) / seconds
    table.add(**common, decoding="zlab", tokens=sum(map(len, tokens)),
              tokens_per_s=zlab_rate, vs_plain=zlab_rate / plain_rate,
              tau=sum(accepted) / max(len(accepted), 1), exact=_exact(tokens, ours),
              note=f"dflash_generate: {zlab_ms:.2f} ms/round, {zlab_ms / ours_ms:.2f}x "
                   "draftsmith's; exact = same tokens as draftsmith on that checkpoint")


PLOTTED = ("spec", "plain", "plain-cublas", "recipe", "hf-eager", "zlab", "ds-dflash")
"""Decodings drawn in the tokens/s panels (and, those with a ratio, in the others)."""


def _series(rows: list[dict], dtype: str, field: str) -> dict[str, list[tuple[int, float]]]:
    """``{label: [(batch, value), ...]}`` of ``field`` for each decoding and sampling setting
    of ``dtype`` (rows without the field left out), batches ascending."""
    out: dict[str, list[tuple[int, float]]] = {}
    for r in rows:
        name = r["decoding"]
        if r["dtype"] != dtype or r.get(field) is None or not (
                name in PLOTTED or name.startswith("spec-")):
            continue
        temperature, top_p = r.get("temperature", 0.0), r.get("top_p", 1.0)
        label = name if temperature == 0.0 else (
            f"{name} T={temperature}" + (f" top-p {top_p}" if top_p < 1.0 else ""))
        out.setdefault(label, []).append((r["batch"], r[field]))
    return {label: sorted(pts) for label, pts in out.items()}


def plot(json_path: Path, png: Path) -> None:
    """Against batch size, one column per dtype: tokens/s of every decoding; the ratio of the
    speculative rows to the faster plain; the cost model's predicted over measured tokens/s of
    the rounds (``--k auto``; the band is 15% either way)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = json.loads(json_path.read_text())["rows"]
    dtypes = sorted({r["dtype"] for r in rows})
    panels = (("tokens_per_s", "generated tokens / s", "log"),
              ("vs_plain", "speed-up over the faster plain", "linear"),
              ("predicted_over_measured", "cost model: predicted / measured", "linear"))
    fig, axes = plt.subplots(len(panels), len(dtypes), figsize=(6 * len(dtypes), 12), dpi=100,
                             squeeze=False)
    # one colour per label across every panel, so that a decoding reads the same in each dtype
    labels = sorted({label for dtype in dtypes for field, _, _ in panels
                     for label in _series(rows, dtype, field)})
    colour = {label: f"C{i % 10}" for i, label in enumerate(labels)}
    for col, dtype in enumerate(dtypes):
        for row, (field, ylabel, scale) in enumerate(panels):
            ax = axes[row][col]
            for label, pts in _series(rows, dtype, field).items():
                if field == "vs_plain" and not label.startswith("spec"):
                    continue  # the plain rows are 1.0 by definition
                ax.plot([b for b, _ in pts], [v for _, v in pts], marker="o", label=label,
                        color=colour[label])
            if field != "tokens_per_s":
                ax.axhline(1.0, color="grey", lw=0.8)
            if field == "predicted_over_measured":
                ax.axhspan(0.85, 1.15, color="green", alpha=0.1)
            ax.set_xscale("log", base=2)
            ax.set_yscale(scale)
            ax.set_xlabel("batch size (requests in flight)")
            ax.set_ylabel(ylabel)
            ax.set_title(f"SmolLM2-135M, {dtype}")
            ax.grid(alpha=0.3)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png)


MIN_PROMPTS = 128
"""Prompts a run decodes by default (at least the largest batch): every batch up to 128 then
starts full and runs most of its rounds full."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, with ``--smoke``'s sizes applied and the prompt count settled: at least
    the largest batch, so that no reported batch runs mostly empty."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="directory for e2e.json and e2e.txt")
    parser.add_argument("--dtypes", nargs="+", default=["bf16", "fp32"], choices=list(DTYPES))
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 2, 4, 8, 16, 32, 64, 128])
    parser.add_argument("--prompts", type=int, default=None,
                        help="prompts to decode at every batch, gsm8k's first, then humaneval's "
                             f"and mt-bench's (default: the largest batch, at least {MIN_PROMPTS};"
                             " fewer than the largest batch is refused)")
    parser.add_argument("--slow-limit", type=int, default=2,
                        help="prompts per set for the slow baselines (0: skip them)")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--k", type=_k_arg, default=7,
                        help="drafts per round, or 'auto' (chosen per batch from measured costs; "
                             "the DFlash comparison then uses 7)")
    parser.add_argument("--parts", default="recipe,hf,zlab",
                        help="slow baselines to run (recipe, hf, zlab)")
    parser.add_argument("--verify-schedule", nargs="+", default=["all"],
                        choices=["all", "prefix", "top-budget", "width"],
                        help="also run the decoding under each runtime.verify_schedule given "
                             "(rows spec-<schedule>, with their ratio to verifying every draft)")
    parser.add_argument("--temperature", type=float, default=0.0,
                        help="sampling temperature of spec and plain (0: greedy; > 0 skips the "
                             "greedy-only slow baselines)")
    parser.add_argument("--top-p", type=float, default=1.0,
                        help="nucleus mass when sampling (1: no filter; needs --temperature > 0)")
    parser.add_argument("--data", default=str(DATA))
    parser.add_argument("--dflash-checkpoint", type=Path, default=None, metavar="DIR",
                        help="a z-lab layout DFlash drafter for the zlab part (both loops run "
                             "it with its own block); default: random weights")
    parser.add_argument("--zlab-limit", type=int, default=1,
                        help="prompts per set for the zlab part (batch 1, greedy)")
    parser.add_argument("--plot", type=Path, help="plot an e2e.json and exit")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny run on the CPU (fp32, batches 1 and 2, 2 prompts, 8 tokens)")
    args = parser.parse_args(argv)
    if args.temperature == 0.0 and args.top_p < 1.0:
        parser.error("--top-p filters sampling only; give --temperature > 0 as well")
    if args.smoke:
        args.dtypes, args.batches, args.prompts, args.slow_limit = ["fp32"], [1, 2], 2, 1
        args.max_new_tokens, args.parts = 8, "hf,zlab"
    if min(args.batches) < 1:
        parser.error("--batches must be >= 1")
    largest = max(args.batches)
    if args.prompts is None:
        args.prompts = max(largest, MIN_PROMPTS)
    if args.prompts < largest:
        parser.error(f"--prompts {args.prompts} would leave batch {largest} mostly empty; give "
                     f"at least {largest} (the largest of --batches)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.plot is not None:
        png = args.plot.with_suffix(".png")
        plot(args.plot, png)
        print(f"wrote {png}")
        return 0
    print(f"# e2e on {machine_tag(_DEVICE)}, torch {torch.__version__}, "
          f"{time.strftime('%Y-%m-%dT%H%M%SZ', time.gmtime())}", flush=True)
    if args.temperature > 0 and args.slow_limit:
        print("# sampled: the slow baselines (plain@slow, recipe, hf, zlab) decode greedily "
              "only, skipped", flush=True)
    table = Table(args.out)
    for dtype_name in args.dtypes:
        run_dtype(dtype_name, args, table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
