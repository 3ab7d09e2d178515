"""The in-process engine on tiny real models: every method, several lookaheads, pass counts, losslessness."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from runinfra_opt.engine.hf.engine import HFEngine, check_same_vocabulary
from runinfra_opt.errors import UserInputError
from runinfra_opt.methods import BASELINE, Variant
from runinfra_opt.models import LoadedModel, load_model
from runinfra_opt.records import compare_to_baseline
from runinfra_opt.workload.model import Message, Request

MAX_TOKENS = 48
CHAT = Request(id="chat-1", line=3, messages=(Message("user", "repeat after me: abc abc abc abc"),))
PROMPT = Request(id="prompt-1", line=4, prompt="the cat sat on the mat. the cat sat on the mat. the cat")


@pytest.fixture(scope="module")
def loaded(tiny_models: tuple[Path, Path]) -> tuple[LoadedModel, LoadedModel]:
    target_dir, draft_dir = tiny_models
    return load_model(str(target_dir), device="cpu"), load_model(str(draft_dir), device="cpu")


@pytest.fixture(scope="module")
def engine(loaded: tuple[LoadedModel, LoadedModel], tiny_models: tuple[Path, Path]) -> HFEngine:
    target, draft = loaded
    return HFEngine(target, {str(tiny_models[1]): draft}, threads=1)


def _variants(draft_spec: str) -> list[Variant]:
    out: list[Variant] = []
    for k in (1, 2, 4, 7):
        out.append(Variant("ngram", lookahead=k, ngram_max=2))
        out.append(Variant("draft", lookahead=k, draft=draft_spec))
        out.append(Variant("early_exit", lookahead=k, exit_layer=2))
    out.append(Variant("ngram", lookahead=3, ngram_max=1))
    out.append(Variant("ngram", lookahead=3, ngram_max=3))
    out.append(Variant("early_exit", lookahead=3, exit_layer=1))
    out.append(Variant("early_exit", lookahead=3, exit_layer=3))
    return out


@pytest.mark.parametrize("request_", [CHAT, PROMPT], ids=["chat", "prompt"])
def test_every_method_is_lossless_with_consistent_counts(
    engine: HFEngine, tiny_models: tuple[Path, Path], request_: Request
) -> None:
    base = engine.generate(request_, BASELINE, max_tokens=MAX_TOKENS)
    assert base.output_tokens == MAX_TOKENS or base.output_ids[-1] in engine.prompts.eos_token_ids
    assert base.target_passes == base.output_tokens  # one forward per token, the prefill included
    assert base.draft_passes == 0
    assert base.drafted_tokens == 0
    assert base.accepted_per_pass == []
    assert 0 < base.ttft_s <= base.e2e_s
    assert base.prompt_tokens == len(engine.prompts.prompt_ids(request_))
    for variant in _variants(str(tiny_models[1])):
        record = engine.generate(request_, variant, max_tokens=MAX_TOKENS)
        compare_to_baseline(record, base)
        assert record.lossless, f"{variant.name} differs at {record.first_mismatch}"
        assert record.variant == variant.name
        assert 0 < record.ttft_s <= record.e2e_s
        # Every target pass delivers its accepted draft tokens plus the one token it adds itself.
        assert len(record.accepted_per_pass) == record.target_passes
        assert record.target_passes + record.accepted_tokens == record.output_tokens
        assert all(0 <= a <= variant.lookahead for a in record.accepted_per_pass)
        assert record.accepted_tokens <= record.drafted_tokens <= variant.lookahead * record.target_passes
        if variant.method == "ngram":
            assert record.draft_passes == 0
        else:
            # Constant lookahead, confidence threshold 0: the draft runs one forward per drafted token
            # (fewer than k only where the draft stops at EOS or the length limit).
            assert record.draft_passes == record.drafted_tokens
            assert record.draft_passes > 0


def test_lookahead_is_constant_not_heuristic(engine: HFEngine, tiny_models: tuple[Path, Path]) -> None:
    variant = Variant("draft", lookahead=3, draft=str(tiny_models[1]))
    draft_config = engine.drafts[str(tiny_models[1])].model.generation_config
    keys = ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold")
    before = {key: getattr(draft_config, key) for key in keys}
    record = engine.generate(PROMPT, variant, max_tokens=MAX_TOKENS)
    # Every round drafts exactly k tokens except possibly the last (length limit); a heuristic schedule would
    # start at 20 and move by +2/-1.
    assert record.drafted_tokens >= 3 * (record.target_passes - 1)
    assert record.drafted_tokens <= 3 * record.target_passes
    # The settings are restored on the draft after the request.
    assert {key: getattr(draft_config, key) for key in keys} == before


def test_prompt_lookup_needs_fewer_passes_on_a_prompt_containing_its_answer(engine: HFEngine) -> None:
    base = engine.generate(PROMPT, BASELINE, max_tokens=MAX_TOKENS)
    answer = engine.target.tokenizer.decode(base.output_ids, skip_special_tokens=True)
    # The same prompt, with the model's own answer already in it once: prompt lookup can copy it.
    echo = Request(id="echo", line=5, prompt=PROMPT.prompt + answer + PROMPT.prompt)  # type: ignore[operator]
    echo_base = engine.generate(echo, BASELINE, max_tokens=MAX_TOKENS)
    record = engine.generate(echo, Variant("ngram", lookahead=4, ngram_max=2), max_tokens=MAX_TOKENS)
    assert compare_to_baseline(record, echo_base).lossless
    assert record.target_passes < record.output_tokens
    assert record.accepted_tokens > 0
    assert echo_base.target_passes == echo_base.output_tokens


def test_sampled_requests_are_reproducible_and_not_compared(engine: HFEngine) -> None:
    sampled = Request(id="s", line=1, prompt="hello there", temperature=0.8, top_p=0.9, seed=7)
    first = engine.generate(sampled, BASELINE, max_tokens=24)
    second = engine.generate(sampled, BASELINE, max_tokens=24)
    assert first.output_ids == second.output_ids
    assert not first.greedy
    ngram = engine.generate(sampled, Variant("ngram", lookahead=2, ngram_max=2), max_tokens=24)
    assert compare_to_baseline(ngram, first).lossless is None


def test_request_max_tokens_caps_the_engine_limit(engine: HFEngine) -> None:
    capped = Request(id="c", line=1, prompt="abc", max_tokens=5)
    record = engine.generate(capped, BASELINE, max_tokens=40)
    assert record.output_tokens <= 5
    assert engine.prompts.max_new_tokens(capped, 3) == 3


def test_chat_requests_use_the_chat_template(engine: HFEngine) -> None:
    ids = engine.prompts.prompt_ids(CHAT)
    text = engine.target.tokenizer.decode(ids)
    assert text.startswith("<|im_start|>user\nrepeat after me")
    assert text.endswith("<|im_start|>assistant\n")


def test_too_long_requests_error_or_skip(loaded: tuple[LoadedModel, LoadedModel]) -> None:
    target, _ = loaded
    context = target.model.config.max_position_embeddings
    long = Request(id="long-one", line=7, prompt="x" * (context - 10))
    short = Request(id="short", line=8, prompt="hi")
    strict = HFEngine(target)
    with pytest.raises(UserInputError, match=r"traffic\.jsonl:7: request long-one: prompt .* exceeds"):
        strict.prompts.filter_requests([short, long], max_tokens=20, source="traffic.jsonl")
    with pytest.raises(UserInputError, match="line 7: request long-one"):
        strict.generate(long, BASELINE, max_tokens=20)
    lenient = HFEngine(target, skip_too_long=True)
    kept, skipped = lenient.prompts.filter_requests([short, long], max_tokens=20)
    assert kept == [short]
    assert skipped == [long]
    assert lenient.prompts.filter_requests([long], max_tokens=5) == ([long], [])


def test_unknown_draft_and_bad_exit_layer(engine: HFEngine) -> None:
    with pytest.raises(UserInputError, match="not loaded"):
        engine.generate(PROMPT, Variant("draft", lookahead=2, draft="other"), max_tokens=4)
    with pytest.raises(UserInputError, match="exit layer 4 must be below"):
        engine.generate(PROMPT, Variant("early_exit", lookahead=2, exit_layer=4), max_tokens=4)


def test_environment_is_recorded(engine: HFEngine) -> None:
    env = engine.environment()
    for key in ("python", "torch", "transformers", "runinfra_opt", "device_name", "cpu", "threads", "dtype"):
        assert env[key], key
    assert env["threads"] == 1
    assert env["dtype"] == "float32"
    assert len(env["model_sha256"]["target"]) == 64
    assert len(env["model_sha256"]) == 2


@pytest.fixture(scope="module")
def permuted_draft(tiny_models: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny draft's weights with a tokenizer whose ids are permuted (same size, different ids)."""
    import json

    out = tmp_path_factory.mktemp("permuted") / "tiny-draft-permuted"
    shutil.copytree(tiny_models[1], out)
    data = json.loads((out / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = data["model"]["vocab"]
    chars = sorted((t for t, i in vocab.items() if i >= 4), reverse=True)
    data["model"]["vocab"] = {**{t: i for t, i in vocab.items() if i < 4}, **{t: 4 + n for n, t in enumerate(chars)}}
    (out / "tokenizer.json").write_text(json.dumps(data), encoding="utf-8")
    return out


@pytest.fixture(scope="module")
def bigger_vocab_draft(tiny_models: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny draft with extra tokens in its tokenizer and embeddings (a different vocabulary size)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path_factory.mktemp("bigger") / "tiny-draft-bigger-vocab"
    tok = AutoTokenizer.from_pretrained(tiny_models[1])
    tok.add_tokens(["<extra-1>", "<extra-2>", "<extra-3>"])
    model = AutoModelForCausalLM.from_pretrained(tiny_models[1])
    model.resize_token_embeddings(len(tok))
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def test_tokenizer_mismatch_is_refused_naming_both(
    loaded: tuple[LoadedModel, LoadedModel], permuted_draft: Path, bigger_vocab_draft: Path
) -> None:
    target, draft = loaded
    assert check_same_vocabulary(target, draft) is None
    for path in (permuted_draft, bigger_vocab_draft):
        other = load_model(str(path), device="cpu")
        assert check_same_vocabulary(target, other) is not None
        with pytest.raises(UserInputError, match=rf"{path.name}.*tiny-target.*--allow-tokenizer-mismatch"):
            HFEngine(target, {str(path): other})
    # Same size, different ids: transformers cannot run universal assisted generation, so it stays refused.
    permuted = load_model(str(permuted_draft), device="cpu")
    with pytest.raises(UserInputError, match="same vocabulary size"):
        HFEngine(target, {str(permuted_draft): permuted}, allow_tokenizer_mismatch=True)


def test_tokenizer_mismatch_allowed_runs_universal_assisted_generation(
    loaded: tuple[LoadedModel, LoadedModel], bigger_vocab_draft: Path
) -> None:
    target, _ = loaded
    other = load_model(str(bigger_vocab_draft), device="cpu")
    engine = HFEngine(target, {str(bigger_vocab_draft): other}, allow_tokenizer_mismatch=True)
    base = engine.generate(PROMPT, BASELINE, max_tokens=24)
    record = engine.generate(PROMPT, Variant("draft", lookahead=3, draft=str(bigger_vocab_draft)), max_tokens=24)
    assert compare_to_baseline(record, base).lossless
    assert record.draft_passes > 0
    engine.close()


def test_prompt_tokenizer_without_weights_tokenizes_as_the_engine(
    engine: HFEngine, tiny_models: tuple[Path, Path]
) -> None:
    from runinfra_opt.engine.prompts import PromptTokenizer

    prompts = PromptTokenizer.load(str(tiny_models[0]))
    for request in (CHAT, PROMPT):
        assert prompts.prompt_ids(request) == engine.prompts.prompt_ids(request)
    assert prompts.eos_token_ids == engine.prompts.eos_token_ids
    assert prompts.context_length == engine.prompts.context_length == 4096
    long = Request(id="long-1", line=9, prompt="x" * 4100)
    assert "exceeds the target's context of 4096 tokens" in (prompts.too_long(long, 8) or "")
    with pytest.raises(UserInputError, match=r"data.jsonl:9: request long-1"):
        prompts.filter_requests([PROMPT, long], max_tokens=8, source="data.jsonl")
