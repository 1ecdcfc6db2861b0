"""Storage overlap between a call's outputs and its arguments: the evidence of the
``no_aliasing`` rule, reported by the worker with every answer and turned into a violation by
:func:`d2kbench.checking.verdict.check_reply`.
"""

from __future__ import annotations


def _storage_range(t) -> tuple[int, int]:
    st = t.untyped_storage()
    return st.data_ptr(), st.data_ptr() + st.nbytes()


def find_aliases(outputs: list, args: list) -> list[str]:
    """Evidence strings for outputs whose storage overlaps an input's storage."""
    import torch  # lazily: the worker imports this module before its measured torch import

    found = []
    spans = [(i, _storage_range(a)) for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
    spans += [(i, _storage_range(t)) for i, a in enumerate(args) if isinstance(a, list)  # tensor-list arguments
              for t in a if isinstance(t, torch.Tensor)]
    for k, o in enumerate(outputs):
        if not isinstance(o, torch.Tensor) or o.untyped_storage().nbytes() == 0:
            continue
        lo, hi = _storage_range(o)
        for i, (alo, ahi) in spans:
            if lo < ahi and alo < hi:
                found.append(f"output {k} shares storage with argument {i} ([{lo:#x}, {hi:#x}) vs [{alo:#x}, {ahi:#x}))")
    return found
