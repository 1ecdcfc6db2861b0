"""Catalogue #3: lazy or proxy outputs.

Trick: return a ``torch.Tensor`` subclass whose ``__torch_function__`` could defer the work to
the moment the checker reads it (outside the timed region).
Expected: ``integrity_violation`` / ``exact_tensor_type`` (outputs must be exactly
``torch.Tensor``); the static review reports ``ast_tensor_subclass``.
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _tiny_muon import muon  # noqa: E402

EXPECT = {"status": "integrity_violation", "rule": "exact_tensor_type", "catalogue": [3], "device": "cpu",
          "static": ["ast_tensor_subclass"]}


class Deferred(torch.Tensor):
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return super().__torch_function__(func, types, args, kwargs or {})


def run(G, steps=5):
    return muon(G).as_subclass(Deferred)
