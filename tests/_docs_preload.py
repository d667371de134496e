"""What a docs page's preloaded python imports (``tests/test_docs.py``), also read by ``bench/preloaded_fork.py``.

A page's Python blocks and ``mtrl`` commands fork from one process that made
``PRELOAD``'s imports: the third-party modules that ``mtrl train``, ``eval``,
``collect``, ``sft``, ``export`` and ``serve`` import before their first line
of work (7.5 s of CPU in one process, summed module by module on the 2-core
machine). Only those the page installs are imported (a blocked one stays
blocked). None loads a module of ``ADAPTERS_WATCH``.
"""

PRELOAD = ["torch", "transformers", "tokenizers", "safetensors.torch",
           "numpy", "yaml", "pydantic", "jinja2", "httpx", "mlflow", "mlflow.store.tracking.sqlalchemy_store",
           "sqlalchemy", "alembic", "pandas", "matplotlib", "matplotlib.figure", "matplotlib.backends.backend_agg",
           "fastapi", "uvicorn", "starlette"]
# What mtrl_adapters instruments when it is imported, or at once when it is already loaded: a block must meet
# these as a fresh process does, so the preloaded python never imports them (it fails if PRELOAD did).
ADAPTERS_WATCH = ["openai", "anthropic", "google.genai", "botocore", "aiobotocore", "litellm", "langchain_core",
                  "strands", "mcp", "langchain_mcp_adapters", "agents"]
