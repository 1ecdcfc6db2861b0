"""Tolerance probes for lora_shrink_expand: implementations the tolerance must accept or reject.

``d2k calibrate lora_shrink_expand`` runs every probe through the task's checks (GPU: the
registered bf16 workloads) and reports whether the thresholds separate them; the numbers are in
the tolerance rationale of task.yaml. Each probe is the reference with one numerical or semantic
choice made the way a kernel might make it (trusted PyTorch, run in the harness's own process);
each updates y in place and returns None, as a solution does.
"""

from __future__ import annotations

import torch

from d2kbench.suite.lora_shrink_expand.reference import lora_delta
from d2kbench.suite.lora_shrink_expand.reference import run as reference_run


def _apply(x, y, lora_a, lora_b, slice_offsets, token_lora_mapping, scale, *, round_h=False, round_delta=False,
           fp64=False, scale_on=True, overwrite=False, shift_adapter=False, none_as_zero=False,
           one_slice=False) -> None:
    """The reference with one deviation: ``round_h`` rounds the rank-R intermediate to the
    weights' dtype before the expand (vLLM); ``round_delta`` rounds the update to y's dtype
    before the add; ``fp64`` evaluates in float64; ``scale_on=False`` drops the scaling;
    ``overwrite`` writes the update instead of adding it; ``shift_adapter`` gives every token the
    next adapter's weights; ``none_as_zero`` treats tokens without an adapter as adapter 0 (a
    clamp of -1); ``one_slice`` expands every column with slice 0's intermediate."""
    mapping = token_lora_mapping
    L = lora_a.shape[1]
    if shift_adapter:
        mapping = torch.where(mapping >= 0, (mapping + 1) % L, mapping)
    if none_as_zero:
        mapping = mapping.clamp_min(0)
    offsets = slice_offsets
    if one_slice:
        offsets = torch.zeros_like(slice_offsets)
        offsets[-1] = slice_offsets[-1]
        offsets[1:-1] = slice_offsets[-1]
    s = scale if scale_on else 1.0
    if fp64:
        delta = lora_delta(x.double(), lora_a.double(), lora_b.double(), offsets, mapping, s).float()
    else:
        delta = lora_delta(x, lora_a, lora_b, offsets, mapping, s, round_h=lora_a.dtype if round_h else None)
    if round_delta:
        delta = delta.to(y.dtype).float()
    keep = (mapping < 0)[:, None]
    new = delta.to(y.dtype) if overwrite else (y.float() + delta).to(y.dtype)
    y.copy_(torch.where(keep, y, new))


#: (name, function of the run arguments, "accept" | "reject").
PROBES = [
    ("reference", reference_run, "accept"),
    ("h_rounded_to_weight_dtype", lambda *a: _apply(*a, round_h=True), "accept"),
    ("update_rounded_before_add", lambda *a: _apply(*a, round_h=True, round_delta=True), "accept"),
    ("float64", lambda *a: _apply(*a, fp64=True), "accept"),
    ("scaling_dropped", lambda *a: _apply(*a, scale_on=False), "reject"),
    ("y_overwritten", lambda *a: _apply(*a, overwrite=True), "reject"),
    ("next_adapter", lambda *a: _apply(*a, shift_adapter=True), "reject"),
    ("no_adapter_as_adapter_0", lambda *a: _apply(*a, none_as_zero=True), "reject"),
    ("slice_0_for_all_columns", lambda *a: _apply(*a, one_slice=True), "reject"),
]
