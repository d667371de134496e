"""What an ``mtrl`` process leaves out of its imports: scikit-learn, which transformers would load unused.

Loading any transformers model class imports ``transformers.generation``,
whose assisted-generation module imports ``sklearn.metrics`` whenever
scikit-learn is installed (MLflow installs it), and with it SciPy and pandas:
about a fifth of what an ``mtrl train`` process spends importing
(``bench/cli_startup.py``). Transformers uses it for one thing, tuning an
assistant model's confidence threshold in assisted generation, which mtrl
never runs, and works without it (scikit-learn is optional there).
"""

from __future__ import annotations

import sys


def leave_out_sklearn() -> bool:
    """Tell transformers, in this process, that scikit-learn is not installed, as if it were not.

    Only the ``mtrl`` executable calls it (``cli.console``), before the command
    imports a model class: a process that is mtrl's own. Returns False (and
    changes nothing) once ``transformers.generation`` was imported, since the
    import it avoids has then happened.
    """
    if "transformers.generation.candidate_generator" in sys.modules:
        return False
    import transformers.utils
    from transformers.utils import import_utils

    def unavailable() -> bool:
        return False

    import_utils.is_sklearn_available = unavailable
    transformers.utils.is_sklearn_available = unavailable
    return True


__all__ = ["leave_out_sklearn"]
