"""Record a real vLLM server's streamed and whole ``/v1/completions`` answers for tests/test_vllm_engine.py.

Writes tests/data/vllm_stream.json: per case, the request the vllm engine
sends (``completion_body``), the raw server-sent-event lines of the streamed
answer and the JSON of the non-streamed answer to the same request. The
unmarked parser test reads them; nothing in the file is hand-written.

    # needs: a running vLLM server on SmolLM2-135M-Instruct, started as the vllm engine starts it
    .venv/bin/python tests/data/vllm_stream_capture.py http://127.0.0.1:PORT
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import httpx

from mtrl_runtime.engines import resolve_model
from mtrl_runtime.engines.vllm._stream import stream_body
from mtrl_runtime.engines.vllm._wire import completion_body
from mtrl_runtime.types import GenerationRequest, SamplingParams

OUT = Path(__file__).with_name("vllm_stream.json")
CASES = {  # name: (question, sampling, stop token ids)
    "greedy_eos_top3": ("Say OK.", SamplingParams(temperature=0.0, max_tokens=64, top_logprobs=3), (2,)),
    "seeded_length": ("Tell a long story.", SamplingParams(temperature=1.0, max_tokens=24, seed=7), ()),
    "stop_string": ("Count from 1 to 20.", SamplingParams(temperature=0.0, max_tokens=64, stop=("5",)), ()),
}


def main(url: str) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(resolve_model("smollm2-135m"))
    models = httpx.get(url + "/v1/models", timeout=30).json()["data"]
    version = httpx.get(url + "/version", timeout=30).json()["version"]
    cases = {}
    with httpx.Client(timeout=300) as http:
        for name, (question, sampling, stop_ids) in CASES.items():
            text = tok.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                           tokenize=False)
            request = GenerationRequest(tuple(tok.encode(text, add_special_tokens=False)), sampling,
                                        stop_token_ids=frozenset(stop_ids))
            whole = http.post(url + "/v1/completions", json=completion_body(request, models[0]["id"], 2048))
            with http.stream("POST", url + "/v1/completions", json=stream_body(request, models[0]["id"], 2048)) as r:
                lines = list(r.iter_lines())
            cases[name] = {"request": completion_body(request, models[0]["id"], 2048), "top_k": sampling.top_logprobs,
                           "stream_lines": lines, "whole": whole.json()}
    source = {"vllm": version, "model": "HuggingFaceTB/SmolLM2-135M-Instruct (float32, --logprobs-mode raw_logprobs)",
              "recorded": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "by": "tests/data/vllm_stream_capture.py"}
    OUT.write_text(json.dumps({"source": source, "cases": cases}, indent=1) + "\n")
    print(f"wrote {OUT} ({len(cases)} cases)")


if __name__ == "__main__":
    main(sys.argv[1].rstrip("/"))
