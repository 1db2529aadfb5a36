"""Write the tiny Llama model directory used by the CPU SGLang smoke launch.

    python bench/sglang_cpu/make_tiny_llama.py [OUT_DIR]
        default: writes bench/sglang_cpu/tiny-llama and bench/sglang_cpu/tiny-llama-remote-code

No weights (the launch uses --load-format dummy) and nothing downloaded: the tokenizer is
a byte-level BPE trained here, offline, on a few sentences with the `tokenizers` library
(any venv that has it; the SGLang venv does).  Every byte has a token, so any text can be
encoded and any id decodes to (possibly odd-looking) text.  The chat template is a plain
ChatML-style Jinja template so /v1/chat/completions works.  Output is deterministic.
"""

import json
import sys
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

VOCAB_SIZE = 512  # == config.json vocab_size; 256 byte tokens + 4 specials + merges
SPECIALS = ["<unk>", "<s>", "</s>", "<pad>"]  # ids 0..3: bos=1, eos=2 as in config.json
CORPUS = [
    "The server is fired up and ready to roll!",
    "dispatchlab triages crashes of LLM inference servers and proposes a fix.",
    "Hello, my name is Ada. What is the capital of France? The capital of France is Paris.",
    "A quick brown fox jumps over the lazy dog. Once upon a time there was a tiny model.",
    "def main():\n    print('hello world')\n    return 0\n",
    "SGLang serves large language models through an OpenAI-compatible API.",
    "tokens per second, time to first token, batch size, context length, KV cache",
    "user assistant system: you are a helpful assistant. Answer briefly.",
] * 4

CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "head_dim": 16,
    "vocab_size": VOCAB_SIZE,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 3,
}

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)


def build_tokenizer() -> Tokenizer:
    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer=trainer)
    return tok


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer()
    n = tok.get_vocab_size()
    assert n <= VOCAB_SIZE, n
    assert [tok.token_to_id(s) for s in SPECIALS] == [0, 1, 2, 3]
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<s>",
                "eos_token": "</s>",
                "unk_token": "<unk>",
                "pad_token": "<pad>",
                "add_bos_token": False,
                "add_eos_token": False,
                "clean_up_tokenization_spaces": False,
                "model_max_length": CONFIG["max_position_embeddings"],
                "chat_template": CHAT_TEMPLATE,
            },
            indent=2,
        )
        + "\n"
    )
    (out / "special_tokens_map.json").write_text(
        json.dumps(
            {
                "bos_token": "<s>",
                "eos_token": "</s>",
                "unk_token": "<unk>",
                "pad_token": "<pad>",
            },
            indent=2,
        )
        + "\n"
    )
    (out / "config.json").write_text(json.dumps(CONFIG, indent=2) + "\n")
    (out / "generation_config.json").write_text(
        json.dumps(
            {
                "bos_token_id": 1,
                "eos_token_id": 2,
                "pad_token_id": 3,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {out} (tokenizer vocab {n}, model vocab {VOCAB_SIZE})")


REMOTE_CODE_PY = '''from transformers import LlamaConfig


class TinyCustomLlamaConfig(LlamaConfig):
    """A Llama config under its own model_type: loading it needs trust_remote_code."""

    model_type = "tiny_custom_llama"
'''


def make_remote_code_variant(src: Path, out: Path) -> None:
    """Same model, but config.json names a model_type transformers does not know and maps
    AutoConfig to a local configuration_*.py (`auto_map`), like many hub checkpoints.
    Without --trust-remote-code SGLang dies in AutoConfig.from_pretrained with transformers'
    "contains custom code which must be executed" ValueError; with it, the server comes up
    (the architecture is still SGLang's native LlamaForCausalLM)."""
    out.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.is_file():
            (out / f.name).write_bytes(f.read_bytes())
    cfg = dict(
        CONFIG,
        model_type="tiny_custom_llama",
        auto_map={"AutoConfig": "configuration_tiny_custom_llama.TinyCustomLlamaConfig"},
    )
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    (out / "configuration_tiny_custom_llama.py").write_text(REMOTE_CODE_PY)
    print(f"wrote {out} (needs --trust-remote-code)")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(Path(sys.argv[1]))
    else:
        here = Path(__file__).resolve().parent
        main(here / "tiny-llama")
        make_remote_code_variant(here / "tiny-llama", here / "tiny-llama-remote-code")
