"""An adapter that prints, to stdout and stderr, from Python and from the C library: a trial's
output must end up in its own log file, never in `run`'s stdout."""

from __future__ import annotations

import ctypes
import sys

from adapters.synthetic import SyntheticAdapter

print("noisy: imported")  # in the trial process, outside any trial


class NoisyAdapter(SyntheticAdapter):
    name = "noisy"
    options = {**SyntheticAdapter.options, "fail": 0}

    def train(self, params, *, epochs, device, options, report):
        print(f"noisy: training batch {params['batch_size']}")
        print("noisy: a warning on stderr", file=sys.stderr)
        ctypes.CDLL(None).puts(b"noisy: from C")
        if options["fail"]:
            raise RuntimeError("noisy: this model does not train")
        return super().train(params, epochs=epochs, device=device, options=options, report=report)


adapter = NoisyAdapter()
