"""The program ``spark-submit`` runs: the ``millwheel`` command, inside spark-submit's driver.

``spark-submit`` takes a Python file, not a console script; ``millwheel cluster launcher``
prints this file's path::

    spark-submit --master spark://127.0.0.1:7077 --deploy-mode client \\
        "$(millwheel cluster launcher)" run topologies/zeitgeist --until-drained

Everything after the file is ``millwheel``'s command line. The master, the deploy mode
and every ``--conf`` are spark-submit's (``_session.under_spark_submit``); see
``docs/deployment.md`` for YARN and Kubernetes.
"""

from __future__ import annotations

import sys

if __name__ == "__main__":
    from millwheel.cli import main

    sys.exit(main(sys.argv[1:]))
