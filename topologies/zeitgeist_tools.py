"""Moved to the package :mod:`topologies.zeitgeist` (config, generator, evaluation, drivers, cli).

Only a re-export for ``tests/runtime/test_differential.py``, whose import is not ours to
change; delete this file once it imports from ``topologies.zeitgeist``.
"""

from topologies.zeitgeist import GeneratorConfig, generate, logs_dir

__all__ = ["GeneratorConfig", "generate", "logs_dir"]
