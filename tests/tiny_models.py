"""Tiny real models built from a config (no downloads): a character-level tokenizer with a chat template,
a 4-layer Llama target and a 2-layer draft that shares its tokenizer (the draft copies the target's first
layers, embeddings and head, so it agrees with the target part of the time)."""

from __future__ import annotations

import string
from pathlib import Path

SPECIAL = ["<pad>", "<s>", "<|im_end|>", "<|im_start|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build_tokenizer(out: Path):  # type: ignore[no-untyped-def]
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = sorted(set(string.printable) - set("\x0b\x0c\r"))
    vocab = {tok: i for i, tok in enumerate(SPECIAL + chars)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    from tokenizers import decoders

    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="<|im_end|>",
        unk_token="<pad>",
        additional_special_tokens=["<|im_start|>"],
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    return fast


def build_model(out: Path, *, layers: int = 4, hidden: int = 64, seed: int = 0, vocab_size: int = 0):  # type: ignore[no-untyped-def]
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config)
    # Sharper logits so greedy decoding is decisive (random init is near-uniform): outputs then vary and
    # fall into loops, as a real model's do on repetitive text.
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(4.0)
        model.lm_head.weight.mul_(4.0)
    model.generation_config.pad_token_id = 0
    model.generation_config.eos_token_id = 2
    model.eval()
    model.save_pretrained(out)
    return model


def build_pair(root: Path) -> tuple[Path, Path]:
    """Build target (4 layers) and draft (its first 2 layers) directories under `root`; return their paths."""
    import copy

    target_dir, draft_dir = root / "tiny-target", root / "tiny-draft"
    tok = build_tokenizer(target_dir)
    target = build_model(target_dir, layers=4, vocab_size=len(tok))
    tok.save_pretrained(draft_dir)
    draft = copy.deepcopy(target)
    draft.model.layers = draft.model.layers[:2]
    draft.config.num_hidden_layers = 2
    draft.config.layer_types = draft.config.layer_types[:2] if getattr(draft.config, "layer_types", None) else None
    draft.save_pretrained(draft_dir)
    return target_dir, draft_dir
