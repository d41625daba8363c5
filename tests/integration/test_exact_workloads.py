"""The library against an independent reference, call by call, on the workloads LLM servers run.

Every test runs the workload once with both attached (the reference outside, the library inside;
why one run and not two: see ``reference_ledger.py``) and asserts that the library's sequence of
``layer_exit`` events, as (path, peak_increase_bytes, retained_bytes), equals the reference's
sequence of closed calls, for every call of every layer. On a mismatch the message shows where the
two sequences of paths diverge (calls one side saw and the other did not) and the first calls whose
figures differ.

The hand-built cases (cache growth, ``torch.tensor(list)``, ``out=``, state swap, transients) also
check both against figures derived by arithmetic, which is what validates the reference itself.
Models are tiny and built from configs (no download): 2 layers, hidden 64, vocab 1000. Even the
128-token generate cases take a few seconds each, so none is marked slow.
"""
from __future__ import annotations

import asyncio

import difflib
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import pytest
import torch
from torch import nn

import memprof_otel as mp

from .support.models import TINY_VOCAB, tiny_gpt2
from .support.reference_ledger import ReferenceLedger

KiB = 1024
MiB = 1024 * 1024
F32 = 4
VOCAB = TINY_VOCAB  # the vocabulary of models.tiny_gpt2, and of the other models here
PROMPT_LEN = 8

Triple = tuple[str, int, int]


# ---- running and comparing -------------------------------------------------------------------
def _instrument(model: nn.Module) -> Any:
    return mp.instrument(model, every_n_forwards=1, overhead_budget=1.0, max_events=10_000_000, max_event_bytes="4GiB")


def library_calls(h: Any) -> list[Triple]:
    return [(e["layer"], int(e["peak_increase_bytes"]), int(e["retained_bytes"]))
            for e in h.events() if e.get("type") == "layer_exit"]


def run_both(model: nn.Module, workload: Callable[[], Any]) -> tuple[list[Triple], list[Triple], ReferenceLedger]:
    """Run ``workload`` once with the library instrumenting ``model`` and the reference around it."""
    h = _instrument(model)
    try:
        with ReferenceLedger(model) as ref:
            workload()
        lib = library_calls(h)
    finally:
        h.uninstrument()
    assert not ref.unclosed, f"reference: module calls never exited: {ref.unclosed}"
    return lib, [tuple(c) for c in ref.calls], ref


def run_library(model: nn.Module, workload: Callable[[], Any]) -> list[Triple]:
    """The library alone (no reference attached): to show the reference does not change it."""
    h = _instrument(model)
    try:
        workload()
        return library_calls(h)
    finally:
        h.uninstrument()


def run_reference(model: nn.Module, workload: Callable[[], Any]) -> tuple[list[Triple], ReferenceLedger]:
    with ReferenceLedger(model) as ref:
        workload()
    return [tuple(c) for c in ref.calls], ref


def _fmt(c: Triple | None) -> str:
    return "-" if c is None else f"peak={c[1]:>9} retained={c[2]:>9}"


def describe_diff(lib: Sequence[Triple], ref: Sequence[Triple], max_show: int = 12,
                  reference: ReferenceLedger | None = None) -> str:
    """A readable account of how ``lib`` differs from ``ref`` (empty when they are equal)."""
    if list(lib) == list(ref):
        return ""
    out = [f"library: {len(lib)} layer_exit events, reference: {len(ref)} calls"]
    lp, rp = [c[0] for c in lib], [c[0] for c in ref]
    sm = difflib.SequenceMatcher(None, rp, lp, autojunk=False)
    ops = sm.get_opcodes()
    structural = [op for op in ops if op[0] != "equal"]
    if structural:
        out.append(f"the sequences of paths differ ({len(structural)} blocks); first blocks:")
        for tag, i1, i2, j1, j2 in structural[:4]:
            r_paths = Counter(rp[i1:i2])
            l_paths = Counter(lp[j1:j2])
            out.append(f"  {tag}: reference calls [{i1}:{i2}] {dict(list(r_paths.items())[:8])} "
                       f"vs library events [{j1}:{j2}] {dict(list(l_paths.items())[:8])}")
    mismatches: list[tuple[int, int]] = []
    for tag, i1, i2, j1, j2 in ops:
        if tag != "equal":
            continue
        for k in range(i2 - i1):
            if ref[i1 + k] != lib[j1 + k]:
                mismatches.append((i1 + k, j1 + k))
    if mismatches:
        per_path = Counter(ref[i][0] for i, _ in mismatches)
        out.append(f"{len(mismatches)} aligned calls with different figures; by path: "
                   f"{dict(per_path.most_common(10))}")
        out.append(f"  {'ref#':>5} {'lib#':>5}  {'path':<36} {'library':<34} reference")
        for i, j in mismatches[:max_show]:
            out.append(f"  {i:>5} {j:>5}  {ref[i][0]!r:<36} {_fmt(lib[j]):<34} {_fmt(ref[i])}")
    if reference is not None and reference.born_outside_dispatch:
        out.append(f"(reference: storages first met as op inputs: {reference.born_outside_dispatch[:6]})")
    return "\n".join(out)


def assert_same_calls(lib: Sequence[Triple], ref: Sequence[Triple],
                      reference: ReferenceLedger | None = None) -> None:
    msg = describe_diff(lib, ref, reference=reference)
    assert not msg, "library differs from the reference:\n" + msg


def roots(calls: Sequence[Triple]) -> list[Triple]:
    return [c for c in calls if c[0] == ""]


# ---- HF models from tiny configs ---------------------------------------------------------------
def _llama() -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      bos_token_id=1, eos_token_id=2, pad_token_id=0)
    return LlamaForCausalLM(cfg).eval()


def _t5() -> nn.Module:
    from transformers import T5Config, T5ForConditionalGeneration

    cfg = T5Config(vocab_size=VOCAB, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_decoder_layers=2,
                   num_heads=4, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    return T5ForConditionalGeneration(cfg).eval()


def _bart() -> nn.Module:
    from transformers import BartConfig, BartForConditionalGeneration

    cfg = BartConfig(vocab_size=VOCAB, d_model=64, encoder_layers=2, decoder_layers=2,
                     encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
                     decoder_ffn_dim=128, max_position_embeddings=512, pad_token_id=1, bos_token_id=0,
                     eos_token_id=2, decoder_start_token_id=2, forced_bos_token_id=None,
                     forced_eos_token_id=None)
    return BartForConditionalGeneration(cfg).eval()


def _generate_workload(model: nn.Module, new_tokens: int) -> Callable[[], Any]:
    ids = torch.randint(3, VOCAB, (1, PROMPT_LEN))
    mask = torch.ones_like(ids)
    cfg = model.config

    def work() -> Any:
        with torch.no_grad():  # generate() is no_grad itself; explicit, as a server would run it
            return model.generate(ids, attention_mask=mask, max_new_tokens=new_tokens,
                                  min_new_tokens=new_tokens, do_sample=False, num_beams=1,
                                  use_cache=True, pad_token_id=cfg.pad_token_id,
                                  eos_token_id=cfg.eos_token_id)
    return work


def _check_generate(build: Callable[[], nn.Module], new_tokens: int) -> tuple[list[Triple], list[Triple]]:
    torch.manual_seed(0)
    model = build()
    lib, ref, reference = run_both(model, _generate_workload(model, new_tokens))
    # the reference saw one root forward per generated token (KV cache: one step per token)
    assert len(roots(ref)) == new_tokens, f"reference saw {len(roots(ref))} root forwards"
    assert_same_calls(lib, ref, reference)
    return lib, ref


GEN_CASES = [pytest.param(24, id="24tok"), pytest.param(128, id="128tok")]


# ---- 1, 2: decoder-only generate with a KV cache ----------------------------------------------
@pytest.mark.parametrize("new_tokens", GEN_CASES)
def test_gpt2_generate_kv_cache(new_tokens: int) -> None:
    _check_generate(tiny_gpt2, new_tokens)


@pytest.mark.parametrize("new_tokens", GEN_CASES)
def test_llama_generate_kv_cache(new_tokens: int) -> None:
    _check_generate(_llama, new_tokens)


# ---- 3: encoder-decoder generate: the encoder is called directly, not through the root --------
@pytest.mark.parametrize("build,encoder_prefix", [pytest.param(_t5, "encoder", id="t5"),
                                                   pytest.param(_bart, "model.encoder", id="bart")])
def test_encoder_decoder_generate_attributes_encoder(build: Callable[[], nn.Module], encoder_prefix: str) -> None:
    torch.manual_seed(0)
    model = build()
    new_tokens = 24
    lib, ref, reference = run_both(model, _generate_workload(model, new_tokens))
    assert len(roots(ref)) == new_tokens
    ref_enc = [c for c in ref if c[0] == encoder_prefix or c[0].startswith(encoder_prefix + ".")]
    assert ref_enc, "reference saw no encoder call: generate() no longer calls the encoder directly?"
    lib_enc = [c for c in lib if c[0] == encoder_prefix or c[0].startswith(encoder_prefix + ".")]
    problems = []
    if not lib_enc:
        problems.append(f"the library attributed no {encoder_prefix!r} layer (the reference has "
                        f"{len(ref_enc)} encoder calls, e.g. {ref_enc[-1]})")
    diff = describe_diff(lib, ref, reference=reference)
    if diff:
        problems.append("library differs from the reference:\n" + diff)
    assert not problems, "\n".join(problems)


# ---- 4: a cache attribute grown by torch.cat, one 64 KiB chunk per forward ---------------------
CHUNK = 64 * KiB
CHUNK_FLOATS = CHUNK // F32


class GrowCache(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.cache = torch.zeros(CHUNK_FLOATS)  # one chunk, made before any forward

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        chunk = x * 2                                   # +64 KiB, freed at return
        self.cache = torch.cat([self.cache, chunk])     # +(k+1) chunks, then the old k chunks freed
        return x                                        # nothing new


class Wrap(nn.Module):
    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x)


def test_cache_growth_by_cat_retains_one_chunk_per_forward() -> None:
    torch.manual_seed(0)
    model = Wrap(GrowCache())
    x = torch.randn(CHUNK_FLOATS)
    n = 8

    def work() -> None:
        with torch.inference_mode():
            for _ in range(n):
                model(x)

    lib, ref, reference = run_both(model, work)
    expected: list[Triple] = []
    for k in range(1, n + 1):  # k chunks in the cache before forward k
        figures = ((k + 2) * CHUNK, CHUNK)
        expected += [("inner", *figures), ("", *figures)]
    assert ref == expected, "REFERENCE disagrees with arithmetic:\n" + describe_diff(ref, expected)
    assert model.inner.cache.numel() == (n + 1) * CHUNK_FLOATS
    assert_same_calls(lib, ref, reference)
    assert all(c[2] == CHUNK for c in lib), "library: retained must be 64 KiB on every forward"
    model = Wrap(GrowCache())
    assert_same_calls(run_library(model, work), expected)  # and without the reference attached


# ---- 5: torch.tensor(list) inside forward (aten.lift_fresh) -------------------------------------
LIST_FLOATS = 512 * 1024


class FromList(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.values = [0.5] * LIST_FLOATS

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = torch.tensor(self.values)   # 2 MiB, built in C++ then aten.lift_fresh; freed at return
        return x + t[0]                 # x.numel() floats


def test_torch_tensor_from_python_list_counts_two_mib() -> None:
    torch.manual_seed(0)
    model = Wrap(FromList())
    x = torch.randn(4)

    def work() -> None:
        with torch.inference_mode():
            for _ in range(2):
                model(x)

    lib, ref, reference = run_both(model, work)
    figures = (2 * MiB + x.numel() * F32, x.numel() * F32)
    expected = [("inner", *figures), ("", *figures)] * 2
    assert ref == expected, "REFERENCE disagrees with arithmetic:\n" + describe_diff(ref, expected)
    assert_same_calls(lib, ref, reference)
    model = Wrap(FromList())
    assert_same_calls(run_library(model, work), expected)  # and without the reference attached


# ---- 6: out= into storage made before the forward -----------------------------------------------
OUT_FLOATS = 16 * 1024  # 64 KiB


class AddOut(nn.Module):
    def __init__(self, buf: torch.Tensor) -> None:
        super().__init__()
        self.b = torch.ones(OUT_FLOATS)
        self.buf = buf

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        torch.add(x, self.b, out=self.buf)
        return self.buf


@pytest.mark.parametrize("initial_floats,expected_first", [
    pytest.param(OUT_FLOATS, (0, 0), id="same-size"),
    pytest.param(0, (OUT_FLOATS * F32, OUT_FLOATS * F32), id="resized-from-empty"),
])
def test_out_into_preexisting_storage(initial_floats: int, expected_first: tuple[int, int]) -> None:
    torch.manual_seed(0)
    model = Wrap(AddOut(torch.empty(initial_floats)))
    x = torch.randn(OUT_FLOATS)

    def work() -> None:
        with torch.no_grad():
            for _ in range(2):
                model(x)

    lib, ref, reference = run_both(model, work)
    # the second forward writes into a buffer already big enough: nothing either way
    expected = [("inner", *expected_first), ("", *expected_first), ("inner", 0, 0), ("", 0, 0)]
    assert ref == expected, "REFERENCE disagrees with arithmetic:\n" + describe_diff(ref, expected)
    assert torch.equal(model.inner.buf, x + 1)
    assert_same_calls(lib, ref, reference)
    model = Wrap(AddOut(torch.empty(initial_floats)))
    assert_same_calls(run_library(model, work), expected)  # and without the reference attached


# ---- 7: a pre-existing state tensor swapped out --------------------------------------------------
STATE_FLOATS = 64 * 1024  # 256 KiB


class SwapState(nn.Module):
    def __init__(self, shrink: bool) -> None:
        super().__init__()
        self.shrink = shrink
        self.state = torch.randn(STATE_FLOATS)  # made before any forward

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        src = self.state[: self.state.numel() // 2] if self.shrink else self.state
        self.state = torch.zeros_like(src)      # +new; then the old state is freed
        return x


@pytest.mark.parametrize("shrink", [pytest.param(False, id="same-size"), pytest.param(True, id="halving")])
def test_swapped_out_state_frees_show_as_negative_retained(shrink: bool) -> None:
    torch.manual_seed(0)
    model = Wrap(SwapState(shrink))
    x = torch.randn(4)
    n = 3

    def work() -> None:
        with torch.inference_mode():
            for _ in range(n):
                model(x)

    lib, ref, reference = run_both(model, work)
    expected: list[Triple] = []
    size = STATE_FLOATS * F32
    for _ in range(n):
        new = size // 2 if shrink else size
        figures = (new, new - size)   # the new state is made while the old one is still alive
        expected += [("inner", *figures), ("", *figures)]
        size = new
    assert ref == expected, "REFERENCE disagrees with arithmetic:\n" + describe_diff(ref, expected)
    assert_same_calls(lib, ref, reference)
    if shrink:
        assert all(c[2] < 0 for c in lib), "library: the old state's free must show as negative retained"
    model = Wrap(SwapState(shrink))
    assert_same_calls(run_library(model, work), expected)  # and without the reference attached


# ---- self-checks of the reference ---------------------------------------------------------------
class Transient(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = torch.ones(1000)  # 4000 bytes, freed at return
        return x + 1


class TwoTransients(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = Transient()
        self.b = Transient()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x))


def test_reference_self_check_transients_by_arithmetic() -> None:
    model = TwoTransients()
    x = torch.zeros(10)

    def work() -> None:
        with torch.no_grad():
            model(x)
            model(x)

    calls, ref = run_reference(model, work)
    # a: ones(1000) then x + 1 (40 B) while ones is alive; b: the same on a's output, which lives
    # until b returns; the root keeps b's output only
    one = [("a", 4040, 40), ("b", 4040, 40), ("", 4080, 40)]
    assert calls == one * 2
    assert ref.born_outside_dispatch == []
    # and the library on the same case (the simplest agreement there is)
    lib, ref2, _ = run_both(model, work)
    assert ref2 == one * 2
    assert_same_calls(lib, ref2)


def test_reference_self_check_frees_and_level() -> None:
    """Births, in-op resizes and frees of storages made before the context, each to the byte."""
    big = torch.ones(1000)
    keep = {"big": big}
    del big
    small = torch.empty(0)
    model = Transient()
    with ReferenceLedger(model) as ref:
        start = ref.level
        with torch.no_grad():
            y = torch.zeros(250)                    # +1000
            assert ref.level - start == 1000
            torch.add(y, 1, out=small)              # small resized 0 -> 1000 bytes
            assert ref.level - start == 2000
            keep.clear()                            # the pre-existing 4000 bytes die
            assert ref.level - start == -2000
            lst = torch.tensor([1.0] * 100)         # born outside the dispatcher: 400 bytes
            assert ref.level - start == -1600
            del y, lst
            assert ref.level - start == -3000
    assert ref.born_outside_dispatch == [("aten.lift_fresh.default", 400)]
    assert ref.calls == []


def test_no_interaction_between_reference_and_library() -> None:
    """Each side alone gives the same calls as beside the other (GPT-2 generate, 12 tokens).

    The reference half is a self-check (it passes whatever the library computes); the library half
    shows that the reference being attached does not change the library's figures.
    """
    def fresh() -> tuple[nn.Module, Callable[[], Any]]:
        torch.manual_seed(0)
        model = tiny_gpt2()
        return model, _generate_workload(model, 12)

    ref_alone, _ = run_reference(*fresh())
    lib_beside, ref_beside, _ = run_both(*fresh())
    lib_alone = run_library(*fresh())
    assert ref_alone == ref_beside, "REFERENCE changed by the library:\n" + describe_diff(ref_beside, ref_alone)
    assert lib_alone == lib_beside, "library changed by the reference:\n" + describe_diff(lib_beside, lib_alone)


# ---- after a Ctrl-C: a generate() interrupted mid-forward, then a full one --------------------
@pytest.mark.parametrize("exc", [KeyboardInterrupt, asyncio.CancelledError])
def test_generate_after_an_interrupted_generate_is_exact(exc: type[BaseException]) -> None:
    torch.manual_seed(0)
    model = tiny_gpt2()
    h = _instrument(model)
    try:
        steps = {"n": 0}

        def interrupt(module: nn.Module, args: Any) -> None:
            steps["n"] += 1
            if steps["n"] == 3:  # the third decode step, inside transformer.h.1
                raise exc()

        handle = model.transformer.h[1].register_forward_pre_hook(interrupt)
        with pytest.raises(exc):
            _generate_workload(model, 8)()
        handle.remove()
        assert h.interrupted_forwards == 1 and torch._C._len_torch_dispatch_stack() == 0
        h.reset_stats()
        with ReferenceLedger(model) as ref:
            _generate_workload(model, 12)()
        lib = library_calls(h)
    finally:
        h.uninstrument()
    assert len(roots([tuple(c) for c in ref.calls])) == 12
    assert_same_calls(lib, [tuple(c) for c in ref.calls], ref)
