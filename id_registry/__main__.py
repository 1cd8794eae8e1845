"""``python -m id_registry serve ...`` (the same as ``millwheel registry serve ...``)."""

import sys

from id_registry.cli import main

sys.exit(main(sys.argv[1:]))
