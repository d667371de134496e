"""What a docs page's preloaded python imports (``tests/test_docs.py``), also read by ``bench/preloaded_fork.py``.

A page's Python blocks and ``mtrl`` commands fork from one process that made
``PRELOAD``'s imports: the third-party modules that ``mtrl train``, ``eval``,
``collect``, ``sft``, ``export`` and ``serve`` import before their first line
of work (7.5 s of CPU in one process, summed module by module on the 2-core
machine), and ``MODELS``, transformers' model classes, unless the page speaks
to botocore, which they bring (``page_preload``). Only those the page installs
are imported (a blocked one stays blocked). None loads another module of
``ADAPTERS_WATCH``.
"""

PRELOAD = ["torch", "transformers", "tokenizers", "safetensors.torch",
           "numpy", "yaml", "pydantic", "jinja2", "httpx", "mlflow", "mlflow.store.tracking.sqlalchemy_store",
           "sqlalchemy", "alembic", "pandas", "matplotlib", "matplotlib.figure", "matplotlib.backends.backend_agg",
           "fastapi", "uvicorn", "starlette"]
# transformers is lazy: its model classes and generation, and what they import (SciPy, torch.distributed.tensor,
# accelerate), come with the first model an ``mtrl`` command loads: 3.2 s of a forked ``mtrl train``'s 6.7 s of CPU.
MODELS = ["transformers.modeling_utils", "transformers.models.auto.modeling_auto", "transformers.generation",
          "transformers.models.llama.modeling_llama", "peft"]
# accelerate imports boto3 for its SageMaker settings, so MODELS bring botocore, an SDK mtrl_adapters instruments. A
# page whose blocks speak to it (Bedrock, boto3) forks from PRELOAD alone and meets botocore as a fresh process does.
MODELS_BRING = ["botocore"]
BOTOCORE_WORDS = ("boto", "bedrock")
# What mtrl_adapters instruments when it is imported, or at once when it is already loaded: a block must meet
# these as a fresh process does, so the preloaded python never imports them (it fails if PRELOAD did).
ADAPTERS_WATCH = ["openai", "anthropic", "google.genai", "botocore", "aiobotocore", "litellm", "langchain_core",
                  "strands", "mcp", "langchain_mcp_adapters", "agents"]


def page_preload(code: str) -> tuple[list[str], list[str]]:
    """What the preloaded python of a page whose blocks hold ``code`` imports, and what must stay unimported."""
    if any(word in code.lower() for word in BOTOCORE_WORDS):
        return PRELOAD, ADAPTERS_WATCH
    return PRELOAD + MODELS, [name for name in ADAPTERS_WATCH if name not in MODELS_BRING]
