"""GGUF files as targets: dequantized through transformers' own GGUF loader into the usual HF layout.

A `.gguf` holds weights, config and tokenizer in llama.cpp's names. transformers maps all three to
its own (config keys, the tokenizer rebuilt as a fast tokenizer with the file's chat template, llama's
Q/K rows un-permuted) and dequantizes every type gguf-py implements, so the fetched checkpoint is
exactly the model `from_pretrained(dir, gguf_file=...)` builds and nothing downstream knows it came
from a GGUF. ExecuTorch 1.5.1's model-free reader (`executorch.extension.llm.export.load.iter_checkpoint`)
is no alternative for this: it yields llama.cpp's tensor names with llama's Q/K rows still permuted,
no config and no tokenizer, and keeps only Q4_K, Q5_K and Q6_K, refusing Q4_0, Q4_1 and Q8_0 (SmolLM2's
file fails at its first tensor). Its strength, K-quants kept quantized, matters for exporting models
too large to dequantize, not for a checkpoint written once.
"""

import json
import re
from pathlib import Path

import torch
from safetensors.torch import save_file

from dflash_et.checkpoints import families
from dflash_et.errors import CheckpointError

# `owner/name[@revision]:path/in/repo.gguf`: one file of a hub repo, through hf_hub_download
HUB_GGUF = re.compile(r"^(?P<repo>[\w.-]+/[\w.-]+)(@(?P<revision>[\w./-]+))?:(?P<file>[\w./-]+\.gguf)$")
# kept as they are; anything quantized is dequantized to float32, where its values are exact
FLOAT_TYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


def is_gguf(source: str) -> bool:
    return source.lower().endswith(".gguf")


def _reader(path: Path, name: str):
    from gguf import GGUFReader

    if not path.is_file():
        raise CheckpointError(f"{name}: {path} is not a file; give the path of a .gguf file")
    try:
        return GGUFReader(path)
    except Exception as e:  # noqa: BLE001  any parse failure of a foreign file format
        raise CheckpointError(f"{name}: {path.name} is not a readable GGUF file ({type(e).__name__}: "
                              f"{str(e).strip()[:120]}); it is truncated or not GGUF, download it again") from None


def supported_types() -> set[str]:
    """GGML tensor types gguf-py can dequantize (what transformers' loader calls)."""
    from gguf import quants

    return set(FLOAT_TYPES) | {t.name for t in quants._type_traits}


def check_gguf(path: Path, name: str) -> tuple[str, torch.dtype]:
    """(model_type, dtype the weights are written in), or a one-line refusal of an architecture the
    project cannot build or a tensor type that cannot be dequantized. Reads the header only."""
    from transformers.integrations.ggml import GGUF_CONFIG_MAPPING
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    reader = _reader(path, name)
    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode() \
        if "general.architecture" in reader.fields else "?"
    ours = sorted(a for a in GGUF_CONFIG_MAPPING if families.claiming(a) or families.claiming(f"{a}_text"))
    try:
        model_type = load_gguf_checkpoint(str(path))["config"]["model_type"]
    except ValueError:  # transformers: "GGUF model with architecture X is not supported yet."
        model_type = None
    if families.claiming(model_type) is None:
        raise CheckpointError(f"{name}: GGUF architecture {arch!r} is not supported; GGUF targets can be {ours}")
    supported = supported_types()
    unknown = sorted({t.tensor_type.name for t in reader.tensors} - supported)
    if unknown:
        raise CheckpointError(f"{name}: GGUF tensor type(s) {unknown} cannot be dequantized; supported: "
                              f"{sorted(supported)}")
    matrices = {t.tensor_type.name for t in reader.tensors if len(t.shape) > 1}
    only = next(iter(matrices)) if len(matrices) == 1 else None
    return model_type, FLOAT_TYPES.get(only, torch.float32)


def write_from_gguf(path: Path, out: Path, name: str) -> None:
    """Write the GGUF at `path` to `out` as an HF checkpoint: config.json, generation_config.json,
    model.safetensors (the dequantized weights; a tied head stored once, as HF saves it), the tokenizer
    with its chat template."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _, dtype = check_gguf(path, name)
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=dtype)
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    config = model.config
    if hasattr(config, "quantization_config"):  # the GGUF marker: the weights written here are plain tensors
        del config.quantization_config
    config.architectures, config.dtype = [type(model).__name__], dtype
    config.save_pretrained(out)  # as HF writes it: no machine-dependent source path, so the fingerprint is stable
    weights = {k: v.contiguous() for k, v in model.state_dict().items()}
    if config.tie_word_embeddings:
        weights.pop("lm_head.weight", None)
    save_file(weights, out / "model.safetensors", metadata={"format": "pt"})
    generation = model.generation_config
    if generation.eos_token_id is None:
        generation.eos_token_id = tokenizer.eos_token_id
    generation.save_pretrained(out)
    save_tokenizer(tokenizer, out)


def save_tokenizer(tokenizer, out: Path) -> None:
    """Save the tokenizer so that tokenizer.json alone defines it, as ExecuTorch's runners read it.

    transformers names a family's tokenizer class in tokenizer_config.json (Qwen2Tokenizer for a qwen3
    GGUF), and on loading, such a class rebuilds its own pre-tokenizer over the file's: a GGUF whose
    pre-tokenizer differs would then encode differently after the round trip. The generic class keeps
    the file's."""
    from transformers import AutoTokenizer

    tokenizer.save_pretrained(out)
    config_path = out / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["tokenizer_class"] = "TokenizersBackend"
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    probe = "Héllo, 2+2=4? 你好\n\n  x_1 = [3.14, 'a'] <|im_end|>"
    if AutoTokenizer.from_pretrained(out).encode(probe) != tokenizer.encode(probe):
        raise CheckpointError(f"the GGUF's tokenizer does not survive saving as tokenizer.json "
                              f"({type(tokenizer).__name__}); this GGUF's tokenizer is not supported")
