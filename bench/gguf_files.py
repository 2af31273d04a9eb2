"""The GGUF files that the llama.cpp comparisons load (bench/peers.py,
bench/single_stream.py), written once next to the benchmark models.

- ``rewritten_gguf(source, target)``: a GGUF with every tensor that is not F32
  re-encoded as ``target`` (bf16, f16, q8_0 or q4_0), all else as it was: the
  embedded SmolLM2 Q4_1 file dequantized to BF16/F16 (the values the Q4_1 file stands
  for), or requantized to Q8_0 or Q4_0 (llama.cpp's fastest CPU format: it repacks
  Q4_0 weights for its own kernels as it loads them).
- ``qwen2_gguf(folder, target)``: a Hugging Face Qwen2 folder (the
  ``qwen2.5-0.5b-shape`` benchmark model) as llama.cpp's converter lays it out: arch
  ``qwen2``, llama.cpp's tensor names, q/k rows in HF's order (the converter permutes
  them for llama-type models, not for qwen2), the folder's byte-level BPE tokenizer;
  2-D weights in ``target`` (in a Q4_1 file the tied embedding in Q8_0, as
  llama-quantize stores it), norms and biases F32.

Both are written to a ``.partial`` file first and renamed when complete, so an
interrupted run leaves no half file under the final name. A file once written is
reused as it is: delete it to write it anew.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import gguf
import numpy as np
from gguf import GGMLQuantizationType as QType
from gguf import LlamaFileType
from hetero_infer.engine.loader.gguf import GGUF_GLOBAL_NAMES, GGUF_LAYER_PARTS

from bench.models import cache_root

# --gguf-dtype -> (tensor type, general.file_type)
GGUF_TYPES: dict[str, tuple[QType, LlamaFileType]] = {
    "f32": (QType.F32, LlamaFileType.ALL_F32),
    "bf16": (QType.BF16, LlamaFileType.MOSTLY_BF16),
    "f16": (QType.F16, LlamaFileType.MOSTLY_F16),
    "q8_0": (QType.Q8_0, LlamaFileType.MOSTLY_Q8_0),
    "q4_1": (QType.Q4_1, LlamaFileType.MOSTLY_Q4_1),
    "q4_0": (QType.Q4_0, LlamaFileType.MOSTLY_Q4_0),
}
# What rewritten_gguf makes of the SmolLM2 file.
REWRITE_TYPES = ("bf16", "f16", "q8_0", "q4_0")
QWEN2_TYPES = ("q4_1", "q8_0", "bf16", "f16", "f32")


def gguf_path(name: str, target: str) -> Path:
    """Where benchmark GGUF ``name`` in ``target`` is kept: ``<name>.<TARGET>.gguf``."""
    return cache_root() / f"{name}.{target.upper()}.gguf"


def encode(values: np.ndarray, qtype: QType) -> np.ndarray:
    """fp32 ``values`` in GGUF type ``qtype``: floats, or for a block type a uint8
    array of each row's blocks (``add_tensor(..., raw_dtype=qtype)`` works out the
    element shape from it)."""
    return gguf.quants.quantize(values.astype(np.float32, copy=False), qtype)


class _Writer(gguf.GGUFWriter):
    """gguf-py's writer, but one that writes an empty array, as the format allows and
    llama.cpp reads: gguf-py refuses them. A byte-level vocabulary without merges (the
    benchmark tokenizer's: every text encodes to its bytes) needs one, as llama.cpp
    refuses a BPE vocabulary whose file has no ``tokenizer.ggml.merges`` and a made-up
    merge would change the tokenizer; a rewrite of such a file copies it."""

    def _pack_val(
        self, val: Any, vtype: gguf.GGUFValueType, add_vtype: bool, sub_type: Any = None
    ) -> bytes:
        if vtype == gguf.GGUFValueType.ARRAY and len(val) == 0:
            head = self._pack("I", vtype) if add_vtype else b""
            return head + self._pack("I", sub_type) + self._pack("Q", 0)
        return super()._pack_val(val, vtype, add_vtype, sub_type)


def _finish(writer: gguf.GGUFWriter, staging: Path, out: Path) -> Path:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.replace(staging, out)
    return out


# ---- the SmolLM2 file in another type ----


def kept_types(target: str) -> tuple[QType, ...]:
    """The tensor types rewritten_gguf copies as they are into a ``target`` file."""
    qtype = GGUF_TYPES[target][0]
    return (QType.F32, qtype, QType.Q8_0) if target == "q4_0" else (QType.F32, qtype)


def rewritten_gguf(source: Path, target: str, out: Path | None = None) -> Path:
    """``source`` with every tensor that is neither F32 nor ``target`` already
    dequantized and encoded as ``target`` (one of REWRITE_TYPES): the same metadata
    (general.file_type updated), names, shapes and layout (llama.cpp's q/k row order
    included). F32 tensors (norms) stay F32, as llama.cpp wants them. A tensor already
    in ``target`` (SmolLM2's Q8_0 embedding, for q8_0) is copied as it is, and so is a
    Q8_0 one for a 4-bit target (the tied embedding stays as the Q4_1 file has it)."""
    if target not in REWRITE_TYPES:
        raise ValueError(f"cannot rewrite a GGUF as {target!r}; choose from {REWRITE_TYPES}")
    qtype, file_type = GGUF_TYPES[target]
    out = out or gguf_path(source.stem.split(".")[0], target)
    if out.is_file():
        return out
    reader = gguf.GGUFReader(source)
    arch = reader.fields["general.architecture"].contents()
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = out.with_suffix(".partial")
    writer = _Writer(staging, arch)  # writes general.architecture itself
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue  # the header's own counts, written anew
        if name == "general.alignment":
            writer.add_custom_alignment(int(field.contents()))
            continue
        value = int(file_type) if name == "general.file_type" else field.contents()
        sub_type = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, value, field.types[0], sub_type=sub_type)
    for tensor in reader.tensors:
        kind = tensor.tensor_type
        if kind in kept_types(target):
            writer.add_tensor(tensor.name, np.asarray(tensor.data), raw_dtype=kind)
            continue
        values = gguf.quants.dequantize(tensor.data, kind)
        writer.add_tensor(tensor.name, encode(values, qtype), raw_dtype=qtype)
    return _finish(writer, staging, out)


# ---- a Hugging Face Qwen2 folder as a GGUF ----

# HF parameter name -> llama.cpp's tensor name: the loader's own map, inverted.
HF_TO_GGUF_GLOBAL = {hf: name for name, hf in GGUF_GLOBAL_NAMES.items()}
HF_TO_GGUF_LAYER = {hf: part for part, hf in GGUF_LAYER_PARTS.items()}
_HF_LAYER_RE = re.compile(r"model\.layers\.(\d+)\.(.+)\.(weight|bias)")


def gguf_tensor_name(hf_name: str) -> str:
    """llama.cpp's name for HF parameter ``hf_name`` of a Qwen2 model."""
    if hf_name in HF_TO_GGUF_GLOBAL:
        return HF_TO_GGUF_GLOBAL[hf_name]
    match = _HF_LAYER_RE.fullmatch(hf_name)
    if match is None or match[2] not in HF_TO_GGUF_LAYER:
        raise ValueError(f"no GGUF name for Qwen2 parameter {hf_name!r}")
    return f"blk.{match[1]}.{HF_TO_GGUF_LAYER[match[2]]}.{match[3]}"


def qwen2_tensor_type(gguf_name: str, ndim: int, target: str) -> QType:
    """The type a tensor is stored in: 2-D weights in ``target``; norms and biases F32
    (llama.cpp computes them in F32). In a Q4_1 file the (tied) embedding is Q8_0:
    the type llama-quantize gives it for Q4_1 when its rows are no multiple of 256
    (Qwen2.5-0.5B's 896), and the type of the SmolLM2 Q4_1 file's embedding."""
    if ndim < 2:
        return QType.F32
    if gguf_name == "token_embd.weight" and target == "q4_1":
        return QType.Q8_0
    return GGUF_TYPES[target][0]


def _add_tokenizer(writer: gguf.GGUFWriter, folder: Path, config: Any) -> None:
    """The folder's tokenizer as llama.cpp's converter writes a byte-level BPE one:
    tokens (in the byte-to-unicode spelling of tokenizer.json) by id, their types,
    merges, special ids, whether BOS is added, the chat template."""
    import transformers

    # The generic class: AutoTokenizer would give a qwen2 folder Qwen2Tokenizer, whose
    # defaults add an "<|endoftext|>" beyond the vocabulary that is not the folder's.
    tokenizer = transformers.PreTrainedTokenizerFast.from_pretrained(folder)
    by_id = {index: token for token, index in tokenizer.get_vocab().items()}
    added = tokenizer.added_tokens_decoder  # id -> AddedToken
    tokens, types = [], []
    for index in range(config.vocab_size):
        if index not in by_id:  # rows of the embedding that no token uses
            tokens.append(f"[PAD{index}]")
            types.append(gguf.TokenType.UNUSED)
        elif index in added:
            tokens.append(by_id[index])
            special = added[index].special
            types.append(gguf.TokenType.CONTROL if special else gguf.TokenType.USER_DEFINED)
        else:
            tokens.append(by_id[index])
            types.append(gguf.TokenType.NORMAL)
    model = json.loads(tokenizer.backend_tokenizer.to_str())["model"]
    if model["type"] != "BPE":
        raise ValueError(f"{folder}: a {model['type']} tokenizer, not byte-level BPE")
    # tokenizer.json spells a merge "a b" or, in newer files, ["a", "b"].
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]

    bos = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else config.bos_token_id
    eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else config.eos_token_id
    # No pad token of its own: pad with eos, as Hugging Face does.
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    writer.add_tokenizer_model("gpt2")  # llama.cpp's name for byte-level BPE
    # The split before merging: Qwen2's regex. Without merges the split cannot change
    # the ids (every piece is its bytes), so it agrees with the folder's GPT-2 split.
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_key_value(
        gguf.Keys.Tokenizer.MERGES, merges, gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.STRING
    )
    for add_id, value in (
        (writer.add_bos_token_id, bos),
        (writer.add_eos_token_id, eos),
        (writer.add_pad_token_id, pad),
    ):
        if value is not None:
            add_id(int(value))
    # llama.cpp puts BOS before a prompt only where the file says so: as the folder does.
    plain = tokenizer.encode("a", add_special_tokens=False)
    writer.add_add_bos_token(bos is not None and tokenizer.encode("a") == [bos, *plain])
    if isinstance(tokenizer.chat_template, str):
        writer.add_chat_template(tokenizer.chat_template)


def qwen2_gguf(folder: Path, target: str, out: Path | None = None) -> Path:
    """The Qwen2 model in ``folder`` (config.json, safetensors, a byte-level BPE
    tokenizer) as a GGUF of type ``target`` (one of QWEN2_TYPES), kept as
    ``gguf_path(folder.name, target)`` unless ``out`` says where."""
    import transformers
    from safetensors import safe_open

    if target not in QWEN2_TYPES:
        raise ValueError(f"no Qwen2 GGUF in {target!r}; choose from {QWEN2_TYPES}")
    out = out or gguf_path(folder.name, target)
    if out.is_file():
        return out
    config = transformers.AutoConfig.from_pretrained(folder)
    if config.model_type != "qwen2":
        raise ValueError(f"{folder}: a {config.model_type!r} model, not qwen2")
    rope = getattr(config, "rope_parameters", None) or {}
    rope_theta = rope.get("rope_theta", getattr(config, "rope_theta", None))

    out.parent.mkdir(parents=True, exist_ok=True)
    staging = out.with_suffix(".partial")
    writer = _Writer(staging, "qwen2")  # writes general.architecture itself
    writer.add_name(folder.name)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_freq_base(float(rope_theta))
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(config.vocab_size)
    writer.add_file_type(GGUF_TYPES[target][1])
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    _add_tokenizer(writer, folder, config)

    for path in sorted(folder.glob("*.safetensors")):
        # torch, not numpy: numpy has no bfloat16 for a bf16 folder.
        with safe_open(path, framework="pt") as weights:
            for hf_name in weights.keys():  # noqa: SIM118 (safe_open is no mapping)
                if hf_name == "lm_head.weight" and config.tie_word_embeddings:
                    continue  # tied: llama.cpp reuses token_embd, as the folder does
                name = gguf_tensor_name(hf_name)
                values = weights.get_tensor(hf_name).float().numpy()
                qtype = qwen2_tensor_type(name, values.ndim, target)
                writer.add_tensor(name, encode(values, qtype), raw_dtype=qtype)
    return _finish(writer, staging, out)
