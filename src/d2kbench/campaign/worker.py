"""``python -m d2kbench.campaign.worker``: run one job (a JSON :class:`Job` on stdin) and print
its :class:`RunOutcome` as the last line of stdout. Executors start one per run, so a run
that crashes or hangs takes nothing else down and can be killed as a process group.
"""

from __future__ import annotations

import sys

from pydantic import BaseModel

from d2kbench.agents.runner import RunSpec, run_agent


class Job(BaseModel):
    """One run to execute: the spec, its attempt number, the store and the runs directory."""

    spec: RunSpec
    attempt: int
    store: str
    runs_root: str

    @property
    def run_id(self) -> str:
        return f"{self.spec.key()}-a{self.attempt}"


def main() -> int:
    job = Job.model_validate_json(sys.stdin.read())
    out = run_agent(job.spec, store_path=job.store, runs_root=job.runs_root, attempt=job.attempt,
                    progress=lambda m: print(m, file=sys.stderr, flush=True))
    print(out.model_dump_json(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
