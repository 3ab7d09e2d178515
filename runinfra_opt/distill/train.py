"""The draft's architecture, its initialisation from the target, and the distillation loop.

A draft is a narrow, shallow `LlamaForCausalLM` with the target's vocabulary (at batch 1 its tied vocabulary
projection dominates its cost, so width is what makes it cheap), its embedding started from the target's. It is
trained on the teacher's top-k distribution and greedy token; everything random derives from (seed, step), so a
resumed run reaches the same weights as an uninterrupted one."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM

from runinfra_opt.distill.config import HEAD_DIM, DistillConfig
from runinfra_opt.distill.data import TeacherData
from runinfra_opt.errors import UserInputError
from runinfra_opt.models import cpu_has_native_bf16

CHECKPOINT_VERSION = 1
WARMUP_STEPS = 20
StepCallback = Callable[[int, float, float], None]
"""on_step(step, loss, elapsed training seconds)."""


def draft_config(target_config: Any, layers: int, hidden: int, **overrides: Any) -> LlamaConfig:
    """A narrow Llama config sharing the target's vocabulary, special tokens, positions and RoPE."""
    heads = max(1, hidden // HEAD_DIM)
    rope = getattr(target_config, "rope_parameters", None) or {"rope_type": "default", "rope_theta": 10000.0}
    settings: dict[str, Any] = {
        "vocab_size": int(target_config.vocab_size),
        "hidden_size": hidden,
        "intermediate_size": hidden * 4,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": heads,
        "head_dim": HEAD_DIM,
        "max_position_embeddings": int(getattr(target_config, "max_position_embeddings", 2048)),
        "rope_parameters": dict(rope),
        "rms_norm_eps": float(getattr(target_config, "rms_norm_eps", 1e-5)),
        "bos_token_id": target_config.bos_token_id,
        "eos_token_id": target_config.eos_token_id,
        "pad_token_id": getattr(target_config, "pad_token_id", None),
        "tie_word_embeddings": True,
        "hidden_act": "silu",
    }
    settings.update(overrides)
    return LlamaConfig(**settings)


def projected_embeddings(target_embeddings: torch.Tensor, hidden: int) -> torch.Tensor:
    """The target's embedding matrix projected onto its top-`hidden` principal (right singular) directions.

    Uses the eigenvectors of E^T E (width x width), which is cheap even for a 49,152-token vocabulary."""
    emb = target_embeddings.detach().float().cpu()
    width = emb.shape[1]
    if hidden >= width:
        padded = torch.zeros(emb.shape[0], hidden)
        padded[:, :width] = emb
        return padded
    gram = emb.T @ emb
    _eigvals, eigvecs = torch.linalg.eigh(gram.double())
    basis = eigvecs[:, -hidden:].flip(-1).float()  # largest first
    # Fix each direction's sign so the result does not depend on the eigen-solver's arbitrary choice.
    signs = torch.sign(basis[basis.abs().argmax(dim=0), torch.arange(hidden)])
    return emb @ (basis * signs)


def init_draft(target: Any, layers: int, hidden: int, seed: int) -> LlamaForCausalLM:
    """A freshly initialised draft for `target` (a transformers causal LM)."""
    torch.manual_seed(seed)
    config = draft_config(target.config, layers, hidden)
    draft = LlamaForCausalLM(config)
    with torch.no_grad():
        emb = projected_embeddings(target.get_input_embeddings().weight, hidden)
        # The target's own scale: the tied head's logits are h . e, so it sets the initial sharpness.
        embeddings: Any = draft.get_input_embeddings()
        embeddings.weight.copy_(emb)
        # Residual branches start small so the initial draft is close to the embedding-only model.
        depth_scale = 1.0 / (2 * layers) ** 0.5
        for layer in draft.model.layers:
            layer.self_attn.o_proj.weight.mul_(depth_scale)
            layer.mlp.down_proj.weight.mul_(depth_scale)
    draft.tie_weights()
    _copy_generation_ids(draft, target)
    draft.eval()
    return draft


def source_layers(target_layers: int, layers: int) -> list[int]:
    """Which target layers a `layers`-deep draft copies: evenly spaced, first and last included."""
    if layers == 1:
        return [0]
    return [round(i * (target_layers - 1) / (layers - 1)) for i in range(layers)]


def residual_basis(target: Any, samples: list[list[int]], hidden: int) -> torch.Tensor:
    """[width, hidden]: the top principal directions of the target's residual stream (every layer's hidden
    state over `samples`, each layer weighted equally), sign-fixed so the result is deterministic."""
    width = int(target.config.hidden_size)
    moment = torch.zeros(width, width, dtype=torch.float64)
    with torch.inference_mode():
        for ids in samples:
            states = target.model(
                input_ids=torch.tensor([ids], device=target.device), output_hidden_states=True
            ).hidden_states
            for state in states:
                flat = state[0].double().cpu()
                moment += flat.T @ flat / flat.pow(2).sum(-1).mean()
    _eigvals, eigvecs = torch.linalg.eigh(moment)
    basis = eigvecs[:, -hidden:].flip(-1).float()
    signs = torch.sign(basis[basis.abs().argmax(dim=0), torch.arange(hidden)])
    return basis * signs


def init_draft_from_layers(target: Any, layers: int, basis: torch.Tensor, seed: int) -> LlamaForCausalLM:
    """A draft made of some of the target's layers, with the residual stream projected onto `basis`
    ([width, hidden]): attention heads, MLP width and RoPE stay the target's, every matrix that reads or
    writes the residual stream is projected, and the RMSNorm gains are folded into the matrices after them.
    With the full basis and every layer it is the target itself."""
    torch.manual_seed(seed)
    tcfg = target.config
    width, hidden = basis.shape
    config = draft_config(
        tcfg,
        layers,
        hidden,
        num_attention_heads=int(tcfg.num_attention_heads),
        num_key_value_heads=int(getattr(tcfg, "num_key_value_heads", None) or tcfg.num_attention_heads),
        head_dim=int(getattr(tcfg, "head_dim", None) or width // tcfg.num_attention_heads),
        intermediate_size=int(tcfg.intermediate_size),
        attention_bias=bool(getattr(tcfg, "attention_bias", False)),
        mlp_bias=bool(getattr(tcfg, "mlp_bias", False)),
        tie_word_embeddings=bool(getattr(tcfg, "tie_word_embeddings", True)),
    )
    draft = LlamaForCausalLM(config)
    v = basis.float()
    # A projected state keeps most of the energy in fewer dimensions, so its RMS is larger by sqrt(width/hidden).
    scale = (width / hidden) ** 0.5
    with torch.no_grad():
        emb: Any = draft.get_input_embeddings()
        emb.weight.copy_(target.get_input_embeddings().weight.float().cpu() @ v)
        for mine, index in zip(draft.model.layers, source_layers(int(tcfg.num_hidden_layers), layers), strict=True):
            theirs = target.model.layers[index]
            g_in = theirs.input_layernorm.weight.float().cpu()
            g_post = theirs.post_attention_layernorm.weight.float().cpu()
            for name in ("q_proj", "k_proj", "v_proj"):
                w = getattr(theirs.self_attn, name).weight.float().cpu()
                getattr(mine.self_attn, name).weight.copy_((w * g_in) @ v * scale)
                if config.attention_bias:
                    getattr(mine.self_attn, name).bias.copy_(getattr(theirs.self_attn, name).bias)
            mine.self_attn.o_proj.weight.copy_(v.T @ theirs.self_attn.o_proj.weight.float().cpu())
            for name in ("gate_proj", "up_proj"):
                w = getattr(theirs.mlp, name).weight.float().cpu()
                getattr(mine.mlp, name).weight.copy_((w * g_post) @ v * scale)
            mine.mlp.down_proj.weight.copy_(v.T @ theirs.mlp.down_proj.weight.float().cpu())
            mine.input_layernorm.weight.fill_(1.0)
            mine.post_attention_layernorm.weight.fill_(1.0)
        g_final = target.model.norm.weight.float().cpu()
        if config.tie_word_embeddings:
            # The final gain cannot be folded into a tied head: keep its diagonal in the new basis.
            draft.model.norm.weight.copy_((v.pow(2) * g_final[:, None]).sum(0) * scale)
        else:
            head = target.get_output_embeddings().weight.float().cpu()
            draft.lm_head.weight.copy_((head * g_final) @ v * scale)
            draft.model.norm.weight.fill_(1.0)
    draft.tie_weights()
    _copy_generation_ids(draft, target)
    draft.eval()
    return draft


def _copy_generation_ids(draft: Any, target: Any) -> None:
    for name in ("eos_token_id", "pad_token_id", "bos_token_id"):
        setattr(draft.generation_config, name, getattr(target.generation_config, name))


BASIS_SAMPLE_TOKENS = 4096


def check_width(target_config: Any, config: DistillConfig) -> None:
    """UserInputError when `--hidden` cannot be made from the target's layers (`--init layers`): wider than the
    target, or not a multiple of its attention heads. Checked before the teacher data is generated."""
    if config.init_from_model or config.init == "embedding":
        return
    width = int(target_config.hidden_size)
    heads = int(target_config.num_attention_heads)
    if config.hidden > width:
        raise UserInputError(f"--hidden {config.hidden}: wider than the target ({width}); use --init embedding")
    if config.hidden % heads:
        raise UserInputError(
            f"--hidden {config.hidden}: with --init layers it must be a multiple of the target's {heads} attention "
            f"heads (e.g. {width // 4 // heads * heads or heads}, {width // 2 // heads * heads})"
        )


def make_draft(target: Any, data: TeacherData, train_indices: list[int], config: DistillConfig) -> LlamaForCausalLM:
    """The initial draft for `config.init` (see `init_draft_from_layers`, `init_draft` and `load_initial_draft`)."""
    if config.init_from_model:
        return load_initial_draft(target, Path(config.init))
    if config.init == "embedding":
        return init_draft(target, config.layers, config.hidden, config.seed)
    check_width(target.config, config)
    samples, total = [], 0
    for i in train_indices:
        ids = data.sequences[i].ids[-512:]
        samples.append(ids)
        total += len(ids)
        if total >= BASIS_SAMPLE_TOKENS:
            break
    basis = residual_basis(target, samples, config.hidden)
    return init_draft_from_layers(target, config.layers, basis, config.seed)


def load_initial_draft(target: Any, path: Path) -> LlamaForCausalLM:
    """A model directory to start from (an earlier draft, or a small pretrained Llama-style model). It must be
    a Llama (the draft is saved as one) with the target's vocabulary size."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(path)
    if getattr(config, "model_type", None) != "llama":
        raise UserInputError(f"--init {path}: a {config.model_type} model; a draft must be a Llama-style model")
    if int(config.vocab_size) != int(target.config.vocab_size):
        raise UserInputError(
            f"--init {path}: vocabulary of {config.vocab_size} tokens, the target has {target.config.vocab_size}"
        )
    draft = LlamaForCausalLM.from_pretrained(path, dtype=torch.float32)
    _copy_generation_ids(draft, target)
    draft.eval()
    return draft


@dataclass
class Example:
    """One training sequence as the loop uses it (already cut to the window)."""

    ids: torch.Tensor
    """int64 [T]: input tokens."""
    continuation_from: int
    """First row (position) whose target token belongs to the continuation."""
    topk_values: torch.Tensor
    """float16 [T, k]: teacher logits at each input position (predicting the next token)."""
    topk_indices: torch.Tensor
    """int64 [T, k]."""


def make_examples(data: TeacherData, indices: list[int], max_seq_tokens: int) -> list[Example]:
    """Training examples for the given sequences, each keeping its last `max_seq_tokens` input positions."""
    examples = []
    for i in indices:
        seq = data.sequences[i]
        rows = len(seq.ids) - 1
        if rows < 1:
            continue
        start = max(0, rows - max_seq_tokens)
        examples.append(
            Example(
                ids=torch.tensor(seq.ids[start:rows], dtype=torch.long),
                continuation_from=max(0, seq.prompt_len - 1 - start),
                topk_values=data.topk_values[i][start:rows],
                topk_indices=data.topk_indices[i][start:rows].long(),
            )
        )
    return examples


def _order(n: int, seed: int, epoch: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(n, generator=gen).tolist()


def _batch_at(examples: list[Example], seed: int, cursor: int, batch_tokens: int) -> tuple[list[Example], int]:
    """The examples of the step starting at global position `cursor` (epochs are consecutive permutations);
    returns them and the next cursor. Steps take sequences until the padded batch would exceed batch_tokens."""
    n = len(examples)
    batch: list[Example] = []
    width = 0
    while True:
        epoch, offset = divmod(cursor, n)
        example = examples[_order(n, seed, epoch)[offset]]
        new_width = max(width, len(example.ids))
        if batch and new_width * (len(batch) + 1) > batch_tokens:
            return batch, cursor
        batch.append(example)
        width = new_width
        cursor += 1
        if len(batch) >= n:
            return batch, cursor


def _rows_for(
    example: Example, gen: torch.Generator, prompt_positions: int, prompt_weight: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows used for the loss in one example: all continuation rows plus sampled prompt rows; with weights."""
    length = len(example.ids)
    cont = torch.arange(example.continuation_from, length)
    n_prompt = example.continuation_from
    if n_prompt > prompt_positions:
        prompt = torch.randperm(n_prompt, generator=gen)[:prompt_positions].sort().values
    else:
        prompt = torch.arange(n_prompt)
    rows = torch.cat([prompt, cont])
    weights = torch.cat([torch.full((len(prompt),), prompt_weight), torch.ones(len(cont))])
    return rows, weights


def distill_loss(
    draft: LlamaForCausalLM, batch: list[Example], gen: torch.Generator, config: DistillConfig, autocast: bool
) -> torch.Tensor:
    """Weighted soft-label cross-entropy + greedy-token cross-entropy over the batch's selected rows."""
    width = max(len(e.ids) for e in batch)
    pad = int(draft.config.pad_token_id or 0)
    ids = torch.full((len(batch), width), pad, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    row_index, weight_list, values, indices = [], [], [], []
    for b, example in enumerate(batch):
        n = len(example.ids)
        ids[b, :n] = example.ids
        mask[b, :n] = 1
        rows, weights = _rows_for(example, gen, config.prompt_positions, config.prompt_weight)
        row_index.append(rows + b * width)
        weight_list.append(weights)
        values.append(example.topk_values[rows])
        indices.append(example.topk_indices[rows])
    device = next(draft.parameters()).device
    flat_rows = torch.cat(row_index).to(device)
    weight = torch.cat(weight_list).to(device)
    teacher_values = torch.cat(values).to(device).float()
    teacher_indices = torch.cat(indices).to(device)
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
        hidden = draft.model(input_ids=ids.to(device), attention_mask=mask.to(device)).last_hidden_state
        selected = hidden.reshape(-1, hidden.shape[-1])[flat_rows]
        logits = draft.lm_head(selected)
    log_probs = F.log_softmax(logits.float(), dim=-1)
    soft_targets = F.softmax(teacher_values, dim=-1)
    soft = -(soft_targets * log_probs.gather(1, teacher_indices)).sum(-1)
    hard = -log_probs.gather(1, teacher_indices[:, :1]).squeeze(1)
    return ((soft + hard) * weight).sum() / weight.sum()


def _lr(step: int, base: float) -> float:
    return base * min(1.0, (step + 1) / WARMUP_STEPS)


@dataclass
class TrainState:
    step: int = 0
    cursor: int = 0
    elapsed_s: float = 0.0
    last_loss: float | None = None
    finished: bool = False


def save_checkpoint(
    path: Path, draft: LlamaForCausalLM, optimizer: torch.optim.Optimizer, state: TrainState, key: str
) -> None:
    """Write the checkpoint atomically (a crash mid-write leaves the previous one)."""
    path.mkdir(parents=True, exist_ok=True)
    tmp = path / f"state.pt.tmp-{os.getpid()}"
    torch.save(
        {
            "version": CHECKPOINT_VERSION,
            "key": key,
            "model": draft.state_dict(),
            "optimizer": optimizer.state_dict(),
            "state": state.__dict__,
        },
        tmp,
    )
    tmp.replace(path / "state.pt")


def load_checkpoint(path: Path, key: str) -> dict[str, Any] | None:
    """The checkpoint's contents when it exists and was written by a run with the same training settings."""
    file = path / "state.pt"
    if not file.is_file():
        return None
    saved = torch.load(file, weights_only=False)
    if saved.get("version") != CHECKPOINT_VERSION or saved.get("key") != key:
        return None
    return saved


def use_autocast(train_dtype: str, device: str) -> bool:
    """bfloat16 autocast: asked for, or `auto` on CUDA with bf16 support and on CPUs with AVX512-BF16/AMX."""
    if train_dtype != "auto":
        return train_dtype == "bfloat16"
    if device.startswith("cuda"):
        return bool(torch.cuda.is_bf16_supported())
    return cpu_has_native_bf16()


def train(
    draft: LlamaForCausalLM,
    examples: list[Example],
    config: DistillConfig,
    checkpoint_dir: Path,
    key: str,
    *,
    device: str = "cpu",
    on_step: StepCallback | None = None,
    checkpoint_every_s: float = 60.0,
) -> TrainState:
    """Train `draft` in place until the time budget or `config.max_steps`, resuming from `checkpoint_dir`
    when it holds a checkpoint of the same settings (`key`). Checkpoints periodically and at the end."""
    if not examples:
        raise ValueError("no training sequences")
    draft.to(device)  # type: ignore[arg-type]
    optimizer = torch.optim.AdamW(draft.parameters(), lr=config.learning_rate, betas=(0.9, 0.98), weight_decay=0.0)
    state = TrainState()
    saved = load_checkpoint(checkpoint_dir, key)
    if saved is not None:
        draft.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        state = TrainState(**saved["state"])
    autocast = use_autocast(config.train_dtype, device)
    budget_s = config.minutes * 60.0
    draft.train()
    started = time.perf_counter()
    base_elapsed = state.elapsed_s
    last_checkpoint = started
    consistent = True  # False while an optimizer update is half applied (an interrupt then saves nothing)
    try:
        while True:
            elapsed = base_elapsed + time.perf_counter() - started
            if config.max_steps is not None and state.step >= config.max_steps:
                break
            if elapsed >= budget_s:
                break
            batch, next_cursor = _batch_at(examples, config.seed, state.cursor, config.batch_tokens)
            gen = torch.Generator().manual_seed(config.seed * 7_919 + state.step)
            for group in optimizer.param_groups:
                group["lr"] = _lr(state.step, config.learning_rate)
            loss = distill_loss(draft, batch, gen, config, autocast)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
            consistent = False
            optimizer.step()
            state.step += 1
            state.cursor = next_cursor
            state.last_loss = float(loss.detach())
            now = time.perf_counter()
            state.elapsed_s = base_elapsed + now - started
            consistent = True
            if on_step is not None:
                on_step(state.step, state.last_loss, state.elapsed_s)
            if now - last_checkpoint >= checkpoint_every_s:
                save_checkpoint(checkpoint_dir, draft, optimizer, state, key)
                last_checkpoint = now
    except KeyboardInterrupt:
        # Keep what was trained: a rerun with the same settings resumes from here.
        if consistent and state.step:
            save_checkpoint(checkpoint_dir, draft, optimizer, state, key)
        raise
    state.finished = True
    state.elapsed_s = base_elapsed + time.perf_counter() - started
    save_checkpoint(checkpoint_dir, draft, optimizer, state, key)
    draft.eval()
    return state


def save_draft(draft: LlamaForCausalLM, tokenizer: Any, out: Path) -> None:
    """save_pretrained of the draft (float32, safetensors) and the target's tokenizer into `out`."""
    out.mkdir(parents=True, exist_ok=True)
    draft.to("cpu")  # type: ignore[arg-type]
    draft.save_pretrained(out)
    tokenizer.save_pretrained(out)


def decode_step_ms(model: Any, context: list[int], *, steps: int = 24, device: str = "cpu") -> float:
    """Median time of one single-token forward over a KV cache of len(context) tokens (a decode step)."""
    from transformers import DynamicCache

    times = []
    with torch.inference_mode():
        ids = torch.tensor([context], device=device)
        cache = DynamicCache(config=model.config)
        model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1)
        token = ids[:, -1:]
        for _ in range(steps + 4):
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            model(input_ids=token, cache=cache, use_cache=True, logits_to_keep=1)
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
            cache.crop(-(int(cache.get_seq_length()) - len(context)))
    ordered = sorted(times[4:])
    return 1000.0 * ordered[len(ordered) // 2]
