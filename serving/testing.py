"""Test helpers: a tiny random checkpoint with a real tokenizer, and a live server on a loopback port."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from pathlib import Path

TEST_MODEL = "test-model"

WORDS = (
    "the a cat dog sat on mat ran to home red blue green big small one two three four five six seven "
    "eight nine ten is was what how why when where who and or but not yes no sum of plus minus times "
    "answer question list sort reverse count number word letter hello world good bad fast slow"
)


def build_checkpoint(directory: str | Path, *, seed: int = 0, block_causal: bool = False, d_model: int = 48,
                     n_layers: int = 2, n_heads: int = 4, mlp_hidden_size: int = 96, initializer_range: float = 0.5,
                     max_sequence_length: int = 4096, tokenizer=None, **generation) -> Path:
    """Save a random LLaDA-format model + word-level tokenizer + generation config into ``directory``.

    ``tokenizer`` defaults to a word-level tokenizer over :data:`WORDS` (any tokenizer with the dllm
    special tokens works). ``generation`` overrides the saved ``DiffusionGenerationConfig`` (default:
    threshold decoding, blocks of 8, 32 new tokens; ``d2f`` with blocks of 8 when ``block_causal``).
    """
    import torch

    from dllm.decoding.config import DiffusionGenerationConfig
    from dllm.modeling import LLaDAConfig, LLaDAModelLM
    from dllm.tokenization import build_tokenizer, special_token_ids

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tok = tokenizer if tokenizer is not None else build_tokenizer([WORDS])
    ids = special_token_ids(tok)
    extra = {"attention_policy": "block_causal", "block_size": 8} if block_causal else {}
    cfg = LLaDAConfig(d_model=d_model, n_layers=n_layers, n_heads=n_heads, n_kv_heads=n_heads,
                      mlp_hidden_size=mlp_hidden_size, vocab_size=len(tok), embedding_size=len(tok),
                      rope_theta=10000.0, initializer_range=initializer_range,
                      max_sequence_length=max_sequence_length, **ids, **extra)
    torch.manual_seed(seed)
    model = LLaDAModelLM(cfg).eval()
    model.save_pretrained(str(directory))
    tok.save_pretrained(str(directory))
    gen = {"strategy": "d2f" if block_causal else "threshold", "block_length": 8, "max_new_tokens": 32}
    gen.update(generation)
    DiffusionGenerationConfig(**gen).save_pretrained(directory)
    return directory


def free_socket(host: str = "127.0.0.1") -> socket.socket:
    # proto=IPPROTO_TCP: asyncio sets TCP_NODELAY only on sockets that say so; without it every
    # keep-alive response waits ~40 ms for a delayed ACK (Nagle).
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((host, 0))
    return sock


@contextlib.contextmanager
def running_server(app, *, host: str = "127.0.0.1", timeout: float = 30.0):
    """Run ``app`` with uvicorn in a thread on a free loopback port; yields the base URL."""
    import uvicorn

    from .http_protocol import OpenAIErrorProtocol

    sock = free_socket(host)
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=5,
                                           http=OpenAIErrorProtocol))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the test server did not start")
        time.sleep(0.01)
    try:
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout)
        sock.close()
