"""Builders for tests and benchmarks: a tiny byte-level BPE tokenizer and a tiny Llama, and a free loopback port.

Both are built in a few hundred milliseconds, on CPU, with no download, so
tests can run real forward passes and real training steps. They ship in the
package (like the ``scripted`` engine) so users can test their own agents the
same way.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

_CORPUS = [
    "You are a helpful assistant. Use the tools when they help.",
    '<tool_call>\n{"name": "lookup", "arguments": {"key": "A1"}}\n</tool_call>',
    "<tool_response>\n{\"value\": 42}\n</tool_response>",
    "<tools>\n</tools> function name arguments description parameters type object properties required string integer",
    "The answer is 42. <final_output>{\"status\": \"ok\"}</final_output>",
    "system user assistant tool Call the tool, then answer with the result.",
    "0123456789 abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ",
    "What is the value for key A1? Reply with DONE when finished.",
]


def trained_bpe(vocab_size: int, special_tokens: list[str], extra_corpus: list[str] | None = None) -> Any:
    """A byte-level BPE ``tokenizers.Tokenizer`` trained on the small test corpus (and ``extra_corpus``)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=special_tokens,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 4 + list(extra_corpus or []), trainer=trainer)
    return tok


def tiny_tokenizer(vocab_size: int = 512, extra_corpus: list[str] | None = None) -> Any:
    """A byte-level BPE tokenizer trained on a small corpus, wrapped for transformers.

    It has no chat template of its own: mtrl's tool-capable ChatML template is
    used with it, as with SmolLM2.
    """
    from transformers import PreTrainedTokenizerFast

    tok = trained_bpe(vocab_size, SPECIAL_TOKENS, extra_corpus)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token="<|endoftext|>",
    )


def tiny_model(tokenizer: Any, hidden_size: int = 64, layers: int = 2, seed: int = 0) -> Any:
    """A randomly initialised LlamaForCausalLM sized for millisecond steps on CPU."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )
    model = LlamaForCausalLM(config)
    model.eval()
    return model


def save_tiny_model(folder: str | Path, hidden_size: int = 64, layers: int = 2, seed: int = 0) -> Path:
    """Build the tiny tokenizer and model and save both as a local HF folder."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = tiny_tokenizer()
    model = tiny_model(tokenizer, hidden_size=hidden_size, layers=layers, seed=seed)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def latencies_during_step(service: Any, batch: Any,
                          ask: Callable[[], tuple[float, float]]) -> tuple[float, list[float]]:
    """One training step of ``batch`` on an online service's learner, on a thread, while ``ask`` sends user
    requests one after another (each returns its start and end on ``time.perf_counter``) until the step is done.

    Returns the step's seconds and the latencies of the requests that started and ended inside it, for a test or
    a bench that checks users are answered while the policy trains (docs/online.md).
    """
    import threading
    import time

    window: dict[str, float] = {}
    step = service.learner.update.step

    def timed(samples: Any) -> Any:
        window["start"] = time.perf_counter()
        try:
            return step(samples)
        finally:
            window["end"] = time.perf_counter()

    service.learner.update.step = timed
    try:
        training = threading.Thread(target=lambda: service.call(service.learner.step(batch)))
        training.start()
        while "start" not in window:
            time.sleep(0.005)
        during: list[tuple[float, float]] = []
        while training.is_alive():
            during.append(ask())
        training.join()
    finally:
        service.learner.update.step = step
    inside = [e - s for s, e in during if window["start"] <= s and e <= window["end"]]
    return window["end"] - window["start"], inside


def free_port(host: str = "127.0.0.1") -> int:
    """A port on ``host`` that nothing listens on now (the OS's pick for port 0): for a server a test starts, or
    an address where nothing answers. Another process may take it before the server binds it."""
    import socket

    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


__all__ = ["SPECIAL_TOKENS", "free_port", "latencies_during_step", "save_tiny_model", "tiny_model", "tiny_tokenizer",
           "trained_bpe"]
