"""Alternative ``mamba_chunk_scan_combined``: the Mamba reference Triton kernels (state-spaces/mamba,
``mamba_ssm.ops.triton.ssd_combined.mamba_chunk_scan_combined``), what a user without vLLM's
varlen fork would call.

The upstream entry point takes one initial state per batch row (its packed ``seq_idx`` varlen
mode cannot start each sequence from its own state), so:

* equal lengths (the Mamba2-2.7B and Codestral workloads): one batched call on the
  ``[N, T / N]`` view, ``initial_states`` gathered from the pool (zeros where
  ``has_initial_state`` is False: those slots hold NaN);
* unequal lengths: one call per sequence (``batch = 1``), a host loop over ``cu_seqlens``
  (read on the host: fine under the task's event timing; each call launches the five-kernel
  pipeline).

``dt_softplus=True`` with ``dt_bias`` (softplus, threshold 20), ``D`` per head,
``return_final_states=True`` (mamba-ssm 2.3.2 keeps its chunk states in float32, the pool's
dtype). The final states are scattered back to their slots with PyTorch indexing inside the timed
call.

Device: ``task.yaml`` declares it for ``cuda`` only; the package is imported inside ``run``, so a
machine without it gets a clear error. Only the package's Triton kernels are used: the device
machine gets them as a trimmed wheel (``tools/device-wheels.sh``), since the package's
``__init__`` imports its compiled CUDA extension.
"""

from __future__ import annotations

import torch


def _combined():
    try:
        from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined
    except ImportError as e:  # the comparator is optional: say what to install
        raise RuntimeError("alternative mamba_chunk_scan_combined needs the mamba-ssm package (its Triton "
                           "kernels: tools/device-wheels.sh builds them as a trimmed wheel, since the package's own build "
                           "needs nvcc and its __init__ imports the compiled extension)") from e
    return mamba_chunk_scan_combined


def run(x: torch.Tensor, dt: torch.Tensor, dt_bias: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
        C: torch.Tensor, D: torch.Tensor, cu_seqlens: torch.Tensor, state_pool: torch.Tensor,
        state_indices: torch.Tensor, has_initial_state: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """The Mamba reference kernels, batched (equal lengths) or per sequence; updates ``state_pool``.

    Raises:
        RuntimeError: the mamba-ssm package is not installed.
    """
    fn = _combined()
    T, H, P = x.shape
    slots = state_indices.long()
    h0 = torch.where(has_initial_state[:, None, None, None], state_pool[slots], 0.0)
    cu = cu_seqlens.tolist()
    N = len(cu) - 1
    lens = [cu[i + 1] - cu[i] for i in range(N)]
    kw = dict(D=D, dt_bias=dt_bias, dt_softplus=True, return_final_states=True)
    if len(set(lens)) == 1:
        L = lens[0]
        y, fin = fn(x.view(N, L, H, P), dt.view(N, L, H), A, B.view(N, L, *B.shape[1:]), C.view(N, L, *C.shape[1:]),
                    chunk_size, initial_states=h0, **kw)
        state_pool[slots] = fin.to(state_pool.dtype)
        return y.reshape(T, H, P)
    y = torch.empty_like(x)
    for i in range(N):
        a, b = cu[i], cu[i + 1]
        yi, fin = fn(x[None, a:b], dt[None, a:b], A, B[None, a:b], C[None, a:b], chunk_size,
                     initial_states=h0[i:i + 1], **kw)
        y[a:b] = yi[0]
        state_pool[slots[i]] = fin[0].to(state_pool.dtype)
    return y
