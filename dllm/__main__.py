"""``python -m dllm ...``: the ``dllm`` command without the console script on PATH."""

import sys

from dllm.cli import main

sys.exit(main())
