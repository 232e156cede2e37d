"""The synthetic adapter, whose trials end only once the file `release=FILE` exists: a test holds
the first host's trials open until another host has joined, so that both train whatever the load."""

from __future__ import annotations

import os
import time
from typing import Any

from adapters.synthetic import SyntheticAdapter


class GatedAdapter(SyntheticAdapter):
    name = "gated"
    options = {**SyntheticAdapter.options, "release": ""}

    def train(self, params, *, epochs, device, options, report, checkpoint: Any = None) -> float:
        while options["release"] and not os.path.exists(options["release"]):
            time.sleep(0.1)
        return super().train(
            params, epochs=epochs, device=device, options=options, report=report,
            checkpoint=checkpoint,
        )  # fmt: skip


adapter = GatedAdapter()
