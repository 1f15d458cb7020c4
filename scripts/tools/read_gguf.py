"""Reads a GGUF file with llama.cpp's own reader (PyPI `gguf`) and prints its
metadata and every tensor, dequantized, as JSON: an independent check of
taper's GGUF export (tests/export.rs).

    .venv-test/bin/python scripts/tools/read_gguf.py model.gguf
"""
import json
import sys

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize

reader = GGUFReader(sys.argv[1])
out = {"metadata": {}, "tensors": {}}
for key, field in reader.fields.items():
    if key.startswith("GGUF."):
        continue
    value = field.parts[field.data[0]]
    out["metadata"][key] = bytes(value).decode() if value.dtype == np.uint8 else value.tolist()
for t in reader.tensors:
    values = dequantize(t.data, t.tensor_type).astype(np.float64).reshape(-1)
    out["tensors"][t.name] = {
        "type": t.tensor_type.name,
        # GGUF lists dimensions innermost first; report them outermost first.
        "shape": [int(d) for d in reversed(t.shape)],
        "values": values.tolist(),
    }
json.dump(out, sys.stdout)
