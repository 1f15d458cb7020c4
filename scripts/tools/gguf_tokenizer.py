"""Writes a Hugging Face tokenizer.json from a GGUF file's BPE vocabulary
(tokenizer.ggml.tokens and .merges, byte-level as GPT-2's), so that
`taper.data.text{ tokenizer = ... }` tokenizes text as the model expects.
The pre-tokenizer splits digits one by one before GPT-2's byte-level split,
as llama.cpp's "smollm" pre-tokenizer does.

    .venv-test/bin/python scripts/tools/gguf_tokenizer.py model.gguf tokenizer.json
"""
import json
import sys

import numpy as np
from gguf import GGUFReader


def strings(field):
    return [bytes(field.parts[i]).decode("utf-8") for i in field.data]


reader = GGUFReader(sys.argv[1])
fields = reader.fields
assert bytes(fields["tokenizer.ggml.model"].parts[-1]).decode() == "gpt2", "not a GPT-2 style BPE"
tokens = strings(fields["tokenizer.ggml.tokens"])
merges = strings(fields["tokenizer.ggml.merges"])
types = [int(fields["tokenizer.ggml.token_type"].parts[i][0]) for i in fields["tokenizer.ggml.token_type"].data]
special = [
    {"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
     "normalized": False, "special": True}
    for i, (t, ty) in enumerate(zip(tokens, types)) if ty == 3  # CONTROL
]
byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
out = {
    "version": "1.0",
    "truncation": None,
    "padding": None,
    "added_tokens": special,
    "normalizer": None,
    "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": True}, byte_level]},
    "post_processor": None,
    "decoder": byte_level,
    "model": {
        "type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
        "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
        "vocab": {t: i for i, t in enumerate(tokens)},
        "merges": merges,
    },
}
with open(sys.argv[2], "w") as f:
    json.dump(out, f, ensure_ascii=False)
print(f"{sys.argv[2]}: {len(tokens)} tokens, {len(merges)} merges, {len(special)} special")
