"""Zero false positives of the expert solutions: every task's expert passes with every
integrity defence on, on the CPU smoke workloads of its shared evaluation (``tests/shipped.py``:
its first timed smoke workload plus those its task's test file asserts on, one timed sample).

The references and straightforward ports, and the GPU variant, are in
``test_integrity_fp.py``; the experts have their own file so that ``pytest --dist loadfile``
can evaluate them on the other worker at the same time.
"""

from __future__ import annotations

import pytest
from shipped import SOLUTIONS, assert_not_flagged, param

EXPERTS = [(t, n) for t, n in SOLUTIONS if n == "expert"]


def test_every_task_ships_an_expert():
    assert len(EXPERTS) == len({t for t, _ in SOLUTIONS})


@pytest.mark.parametrize("item", [param(t, n) for t, n in EXPERTS])
def test_shipped_expert_is_not_flagged(item, shipped):
    assert_not_flagged(item, shipped.get(*item))
