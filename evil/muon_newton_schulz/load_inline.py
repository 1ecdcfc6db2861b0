"""Catalogue #30: an inline CUDA/C++ extension (cuBLAS or hand-written CUDA) instead of Triton.

Trick: build an extension with ``torch.utils.cpp_extension.load_inline`` at the first call.
Expected: ``integrity_violation`` / ``forbidden_library`` (the audit hook refuses the solution's
import of ``torch.utils.cpp_extension``; were it already loaded, the wrapped entry point would
refuse the call before anything is compiled). Static review: ``ast_forbidden_import``, ``ast_compile``.
"""
from torch.utils.cpp_extension import load_inline

EXPECT = {"status": "integrity_violation", "rule": "forbidden_library", "catalogue": [30], "device": "cpu",
          "static": ["ast_forbidden_import", "ast_compile"], "static_checks": False, "evidence": "load_inline"}

_SRC = "torch::Tensor run(torch::Tensor g) { return g.clone(); }"


def run(G, steps=5):
    ext = load_inline(name="d2k_evil_ext", cpp_sources=_SRC, functions=["run"], verbose=False)
    return ext.run(G)
