"""Tiny real models built from a config (no downloads): a character-level tokenizer with a chat template,
a 4-layer Llama target and a 2-layer draft that shares its tokenizer (the draft copies the target's first
layers, embeddings and head, so it agrees with the target part of the time)."""

from __future__ import annotations

import string
from pathlib import Path
from typing import Any

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


def build_gguf(out: Path, source: Path, *, vocab: int = 1024) -> Path:
    """A tiny GGUF file at `out`: the metadata of the GGUF at `source` (its tokenizer, chat template and
    architecture), the vocabulary cut to `vocab` tokens, and a one-layer, 64-wide model of float32 random weights:
    converting it does everything a GGUF conversion does (tokenizer, tensors, the saved directory) in seconds."""
    import gguf
    import numpy as np

    reader = gguf.GGUFReader(source)
    arch = str(reader.fields["general.architecture"].contents())
    # The first `vocab` tokens and the merges among them (a BPE merge's parts and result all kept): reading and
    # converting the whole 49,152-token vocabulary takes most of a conversion's time.
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()[:vocab]
    kept = set(tokens)
    merges = [
        m for m in reader.fields["tokenizer.ggml.merges"].contents() if {*m.split(" "), m.replace(" ", "")} <= kept
    ]
    hidden, ff, heads, kv = 64, 128, 4, 2
    head_dim = hidden // heads
    replaced = {
        "block_count": 1, "embedding_length": hidden, "feed_forward_length": ff, "attention.head_count": heads,
        "attention.head_count_kv": kv, "rope.dimension_count": head_dim, "vocab_size": vocab,
        "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.token_type": reader.fields["tokenizer.ggml.token_type"].contents()[:vocab],
        "general.file_type": int(gguf.LlamaFileType.ALL_F32),
    }  # fmt: skip
    writer = gguf.GGUFWriter(out, arch)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        key = name.removeprefix(f"{arch}.")
        value = replaced[key] if key in replaced else field.contents()
        kind = field.types[0]
        if kind == gguf.GGUFValueType.ARRAY:
            writer.add_key_value(name, value, kind, sub_type=field.types[-1])
        else:
            writer.add_key_value(name, value, kind)
    rng = np.random.default_rng(0)

    def weight(*shape: int) -> Any:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    writer.add_tensor("token_embd.weight", weight(vocab, hidden))
    writer.add_tensor("output_norm.weight", np.ones(hidden, dtype=np.float32))
    layer = {
        "attn_norm": np.ones(hidden, dtype=np.float32), "ffn_norm": np.ones(hidden, dtype=np.float32),
        "attn_q": weight(hidden, hidden), "attn_k": weight(kv * head_dim, hidden),
        "attn_v": weight(kv * head_dim, hidden),
        "attn_output": weight(hidden, hidden), "ffn_gate": weight(ff, hidden), "ffn_up": weight(ff, hidden),
        "ffn_down": weight(hidden, ff),
    }  # fmt: skip
    for part, tensor in layer.items():
        writer.add_tensor(f"blk.0.{part}.weight", tensor)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out
