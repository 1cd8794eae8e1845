"""``python -m watermark_authority serve ...`` (the same as ``millwheel authority serve ...``)."""

import sys

from watermark_authority.cli import main

sys.exit(main(sys.argv[1:]))
