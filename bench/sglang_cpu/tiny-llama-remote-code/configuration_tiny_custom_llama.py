from transformers import LlamaConfig


class TinyCustomLlamaConfig(LlamaConfig):
    """A Llama config under its own model_type: loading it needs trust_remote_code."""

    model_type = "tiny_custom_llama"
