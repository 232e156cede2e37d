"""An adapter module that takes long to import (as one importing a large library does): it says
it has started, then waits, so a test can stop `run` while it starts up."""

from __future__ import annotations

import os
import time
from pathlib import Path

Path(os.environ["SLOW_IMPORT_MARKER"]).write_text("importing\n")
time.sleep(120)

from adapters.synthetic import SyntheticAdapter  # noqa: E402

adapter = SyntheticAdapter()
