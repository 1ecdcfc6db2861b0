"""Catalogue #18 and #33 (less work than the operator, a partial update): the LoRA update of the first adapter only.

Trick: a single-adapter kernel (the common case of one fine-tune) run for adapter 0: tokens of
every other adapter keep their base output, so the call touches a fraction of the weights.
Expected: ``incorrect`` / ``state:y`` (the in-place update of y is checked per token row: a
missing update is an error of order one in its rows).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _lora import lora_update  # noqa: E402

EXPECT = {"status": "incorrect", "rule": "state:y", "catalogue": [18, 33], "device": "cpu", "static": []}


def run(x, y, lora_a, lora_b, slice_offsets, token_lora_mapping, scale):
    lora_update(x, y, lora_a, lora_b, slice_offsets, token_lora_mapping, scale, only_adapter=0)
