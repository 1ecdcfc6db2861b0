"""Solution template for kv_cache_fp8_store. Implement ``run`` with your own Triton kernels.

Read task.yaml (the specification), requirements.md (the rules) and reference.py (the
semantics). The harness imports this file in a separate process and calls ``run`` with
fresh inputs on every call; the registered workloads are timed by CUDA-graph replay.
"""

import torch
import triton  # noqa: F401
import triton.language as tl  # noqa: F401


def run(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
        slot_mapping: torch.Tensor, k_scale: torch.Tensor, v_scale: torch.Tensor) -> None:
    """Quantise new keys/values to FP8 e4m3fn and write them into their cache slots, in place.

    Args:
        key, value: [T, Hkv, D] bfloat16.
        key_cache, value_cache: [NB, BS, Hkv, D] float8_e4m3fn (NHD pages, contiguous). Write
            cache[slot // BS, slot % BS, h, :] = e4m3fn(clamp(float32(x[t, h, :]) / scale, -448, 448))
            for every token t with slot = slot_mapping[t] != -1; touch nothing else.
        slot_mapping: [T] int64 device tensor (-1 = padding token).
        k_scale, v_scale: [1] float32 device tensors.

    Returns:
        None (an in-place operator). Never read slot_mapping on the host.
    """
    raise NotImplementedError("implement run() with Triton kernels")
