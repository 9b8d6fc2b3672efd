"""A tiny llama model in GGUF, written from seeded random weights: nothing is downloaded.

Its answers are nonsense, and that is its point: it exercises the serving path of
a real llama.cpp server (loading, slots, ``/props``, the OpenAI API, streaming, a
crash) in seconds on a CPU, and a claim of ``tools`` made for it is refused by
``llmgw engine-check``, as it would be for any model that cannot call tools.

The shape: a 2-layer, 64-wide llama, 4 heads, with a byte-level SentencePiece
vocabulary (the 256 byte tokens, the 3 control tokens and a few pieces: 267 in
all), about 0.5 MB in float32. The same seed gives the same bytes.

    python -m engine_check.tiny_gguf /tmp/tiny.gguf
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

# Pieces beyond the bytes, so that common text is not all byte tokens ("▁" is
# SentencePiece's word boundary).
_PIECES = ("▁", "▁the", "▁a", "▁to", "▁and", "▁of", "▁is", "▁in")
# A ChatML template, so /v1/chat/completions has a prompt format to apply.
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def vocabulary() -> tuple[list[str], list[float], list[int]]:
    """Tokens, scores and types (gguf.TokenType values) of the byte-level vocabulary."""
    from gguf import TokenType

    tokens = ["<unk>", "<s>", "</s>"]
    types = [TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL]
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [TokenType.BYTE] * 256
    tokens += list(_PIECES)
    types += [TokenType.NORMAL] * len(_PIECES)
    # SentencePiece prefers higher scores; longer pieces win over their bytes.
    scores = [0.0] * 3 + [-1000.0] * 256 + [-float(i) for i in range(len(_PIECES))]
    return tokens, scores, [int(t) for t in types]


def write(
    path: Path,
    *,
    seed: int = 0,
    layers: int = 2,
    width: int = 64,
    heads: int = 4,
    ffn: int = 128,
    context: int = 4096,
) -> Path:
    """Write the model to ``path`` (its parent must exist) and return ``path``."""
    import gguf

    tokens, scores, types = vocabulary()
    rng = np.random.default_rng(seed)

    def weights(*shape: int) -> np.ndarray:
        # Small, so activations stay finite through the layers.
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    def ones(n: int) -> np.ndarray:
        return np.ones(n, dtype=np.float32)

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("llmgw tiny test model")
    writer.add_context_length(context)
    writer.add_embedding_length(width)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(heads)
    writer.add_rope_dimension_count(width // heads)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_chat_template(CHAT_TEMPLATE)

    # numpy shapes are (rows, columns) = (out, in): ggml's [in, out], as llama.cpp wants.
    writer.add_tensor("token_embd.weight", weights(len(tokens), width))
    for i in range(layers):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", ones(width))
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            writer.add_tensor(f"blk.{i}.{name}.weight", weights(width, width))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", ones(width))
        writer.add_tensor(f"blk.{i}.ffn_gate.weight", weights(ffn, width))
        writer.add_tensor(f"blk.{i}.ffn_up.weight", weights(ffn, width))
        writer.add_tensor(f"blk.{i}.ffn_down.weight", weights(width, ffn))
    writer.add_tensor("output_norm.weight", ones(width))
    writer.add_tensor("output.weight", weights(len(tokens), width))

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m engine_check.tiny_gguf",
        description="write a tiny random-weight llama model in GGUF (for tests and smoke runs)",
    )
    p.add_argument("path", type=Path, help="where to write it, such as /tmp/tiny.gguf")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    write(args.path, seed=args.seed)
    print(f"{args.path}: {args.path.stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
