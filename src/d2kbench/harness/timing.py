"""Latency measurement (docs/timing.md) and the statistics of the samples.

Three timers, all called with ``call(i)`` that runs the solution on input set ``i``:

* :func:`time_events` - CUDA events around each call with an L2 flush before it; the host is kept
  ahead of the GPU (a spin kernel where needed), so that the host's launch time stays out of
  the window. For calls long enough (>~100 us) that launch overhead does not dominate.
* :func:`time_graph` - many calls on rotating input sets captured in one CUDA graph (at least
  :data:`MIN_GRAPH_CALLS` for short calls); each replay is timed with events and divided by the
  calls it holds. For short calls.
* :func:`time_cpu` - host ``perf_counter`` per call (CPU runs: exercises the logic, the
  numbers are not GPU latencies).

Warm-up (compilation, autotuning) always runs before and is excluded.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable

import numpy as np

from d2kbench.results import TimingStats

# Imports inside functions: torch loads in the worker, where the worker's start-up phases measure its import.

#: Default minimum/maximum number of timed samples and the target time spent sampling.
MIN_SAMPLES = 10
MAX_SAMPLES = 200
TARGET_MS = 1500.0
#: Graph timing of short calls: a replay holds at least this many calls (the input sets
#: repeated, in order), like the launch floor's graph
#: (:func:`d2kbench.harness.launch_floor.launch_floor_ms`), so that the replay's own fixed cost
#: (the graph launch, several us on the H200) is spread over as many calls in both. Measured on
#: the H200: a 1.3 us kernel (device time) timed at 9.0-11.1 us per call with 3 calls per replay
#: (results/h200/superseded/).
MIN_GRAPH_CALLS = 64
#: ... as long as the repeated passes hold at most this much work (ms, from the warm-up's host
#: estimate of one call): longer calls amortise the replay's cost by themselves. Generous on
#: purpose: the host estimate includes the solution's Python overhead, so a tight bound would
#: give two solutions of one workload different calls per replay (measured on the H200 with a
#: 2 ms bound: 24 vs 42 calls for two ~2 us kernels), and with them different shares of the
#: replay's fixed cost.
GRAPH_REPEAT_MS = 20.0
#: Events timing keeps the host ahead of the GPU, so that an event window never opens before
#: the host has launched the call (a window that does holds host launch time: docs/timing.md, "events",
#: a ~1 us kernel read 14 us with bare events). The warm-up ends with the GPU idle, so before the
#: first sample the GPU runs a spin kernel (``torch.cuda._sleep``) of ``HOLD_FACTOR`` x the host
#: time of one call (measured on an idle GPU), clamped to [``PRIME_US``, ``PRIME_MAX_US``]: the
#: host starts ahead and, for calls longer than their host time, stays ahead. A sample whose
#: start event had already fired when the host finished queuing it is a "late start"; two in a
#: row mean the host is behind for good (calls shorter than their host time), and every later
#: sample then starts with a spin of ``HOLD_FACTOR`` x the host queuing time (clamped to
#: [``HOLD_MIN_US``, ``HOLD_MAX_US``]; doubled after two more in a row). The count is reported
#: (``late_starts``). Calls longer than their host time must not get a per-sample spin: on the
#: H200 a fixed 0.85 ms spin before every sample of a 0.7 ms attention kernel lowered its mean by
#: 5.5-6.6% (power and clock headroom from the idle GPU) while without it only the first sample
#: of 200 started late (results/h200/profiles/events_hold_ab.md), and a 5 ms spin switched on by
#: one late start lowered a 16 ms Muon call by 7% (results/h200/superseded/README.md).
PRIME_US = 2000.0
PRIME_MAX_US = 100_000.0
HOLD_FACTOR = 3.0
HOLD_MIN_US = 50.0
HOLD_MAX_US = 5000.0


def summarize(samples_ms: list[float], mode: str, **extra) -> TimingStats:
    """Statistics of per-call samples (ms): mean (the paper's statistic), median, p10/p90,
    std and a 95% percentile-bootstrap confidence interval of the mean (2000 resamples,
    fixed seed so that the same samples give the same interval).

    Raises:
        ValueError: no samples, or a sample that is not a finite positive number.
    """
    x = np.asarray(samples_ms, dtype=np.float64)
    if x.size == 0:
        raise ValueError("no timing samples")
    if not np.all(np.isfinite(x)) or np.any(x < 0):
        raise ValueError(f"invalid timing samples: {x[~np.isfinite(x) | (x < 0)][:4].tolist()}")
    rng = np.random.default_rng(0)
    if x.size > 1:
        boot = x[rng.integers(0, x.size, size=(2000, x.size))].mean(axis=1)
        lo, hi = np.percentile(boot, [2.5, 97.5])
    else:
        lo = hi = x[0]
    return TimingStats(
        mode=mode,
        samples_ms=x.tolist(),
        n=int(x.size),
        mean_ms=float(x.mean()),
        median_ms=float(np.median(x)),
        std_ms=float(x.std(ddof=1)) if x.size > 1 else 0.0,
        p10_ms=float(np.percentile(x, 10)),
        p90_ms=float(np.percentile(x, 90)),
        min_ms=float(x.min()),
        max_ms=float(x.max()),
        ci95_low_ms=float(lo),
        ci95_high_ms=float(hi),
        **extra,
    )


def sample_count(est_ms: float, min_samples: int = MIN_SAMPLES, max_samples: int = MAX_SAMPLES,
                 target_ms: float = TARGET_MS) -> int:
    """How many samples to take for calls of about ``est_ms`` each (clamped to the bounds)."""
    if est_ms <= 0 or not math.isfinite(est_ms):
        return max_samples
    return int(min(max_samples, max(min_samples, math.ceil(target_ms / est_ms))))


def time_cpu(call: Callable[[int], object], n_sets: int, samples: int, warmup: int = 1) -> TimingStats:
    """Host-timed calls (ms), cycling through ``n_sets`` input sets."""
    for i in range(warmup):
        call(i % n_sets)
    out = []
    for i in range(samples):
        t0 = time.perf_counter()
        call(i % n_sets)
        out.append((time.perf_counter() - t0) * 1e3)
    return summarize(out, "cpu", input_sets=n_sets, warmup_calls=warmup)


def _warmup_cuda(call: Callable[[int], object], n_sets: int, warmup_ms: float, min_calls: int = 1) -> tuple[int, float]:
    """Run calls until ``warmup_ms`` have passed (at least ``min_calls``); return (calls, est ms/call)."""
    import torch

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    n = 0
    while n < min_calls or (time.perf_counter() - t0) * 1e3 < warmup_ms:
        call(n % n_sets)
        n += 1
        torch.cuda.synchronize()
        if n >= 1000:
            break
    # estimate from one more synchronized call, compilation now done
    t1 = time.perf_counter()
    call(n % n_sets)
    torch.cuda.synchronize()
    return n + 1, (time.perf_counter() - t1) * 1e3


def graph_passes(n_sets: int, est_ms: float, min_calls: int = MIN_GRAPH_CALLS,
                 repeat_ms: float = GRAPH_REPEAT_MS) -> int:
    """Passes over ``n_sets`` input sets that one graph captures: enough for ``min_calls`` calls,
    but no more than ``repeat_ms`` of work at ``est_ms`` per call (at least one pass)."""
    want = math.ceil(min_calls / max(1, n_sets))
    fit = math.floor(repeat_ms / (est_ms * max(1, n_sets)) + 1e-9) if est_ms > 0 and math.isfinite(est_ms) else 1
    return max(1, min(want, fit))


@functools.lru_cache(maxsize=1)
def _sleep_cycles_per_us() -> float:
    """GPU clock cycles per microsecond of ``torch.cuda._sleep`` (spin kernel), measured once."""
    import torch

    torch.cuda._sleep(1000)
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    cycles = 2_000_000
    s.record()
    torch.cuda._sleep(cycles)
    e.record()
    e.synchronize()
    return cycles / max(1e-3, s.elapsed_time(e) * 1e3)


def _hold(us: float) -> None:
    """Queue a spin kernel of about ``us`` microseconds on the current stream (no host wait)."""
    import torch

    torch.cuda._sleep(max(1, int(us * _sleep_cycles_per_us())))


def hold_us_for(host_us: float, factor: float = HOLD_FACTOR, lo: float = HOLD_MIN_US,
                hi: float = HOLD_MAX_US) -> float:
    """The GPU hold (us) before a timed call whose host queuing takes ``host_us`` (us):
    ``factor * host_us`` clamped to ``[lo, hi]`` (a non-finite host time gives ``hi``)."""
    if not math.isfinite(host_us):
        return hi
    return float(min(hi, max(lo, factor * host_us)))


def time_events(call: Callable[[int], object], n_sets: int, flush: Callable[[], None],
                warmup_ms: float = 100.0, min_samples: int = MIN_SAMPLES,
                max_samples: int = MAX_SAMPLES, target_ms: float = TARGET_MS,
                hold_us: float | None = None) -> TimingStats:
    """CUDA-event timing of single calls with an L2 flush (``flush()``) before each.

    The flush, any GPU spin and the input rotation sit outside the events; only ``call`` is
    timed. ``hold_us``: None (default) keeps the host ahead as :data:`PRIME_US` describes (a
    spin before the first sample; a per-sample spin only after two late starts in a row); 0
    times without any spin (windows may then include host launch time); > 0 spins that long
    before every sample (a diagnostic: devtools/events_hold_ab.py). The stats record the
    per-sample spin in force at the end (``hold_us``, 0 when none was needed) and the count of
    samples whose start event fired before the host had queued the call (``late_starts``: their
    windows may include host time).
    """
    import torch

    warm, est = _warmup_cuda(call, n_sets, warmup_ms)
    n = sample_count(est, min_samples, max_samples, target_ms)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    adaptive = hold_us is None
    hold = 0.0 if hold_us is None else float(hold_us)
    if adaptive:  # the host time of one call on the idle GPU (untimed), then the prime
        t0 = time.perf_counter()
        call(0)
        host_us = (time.perf_counter() - t0) * 1e6
        torch.cuda.synchronize()
        _hold(hold_us_for(host_us, lo=PRIME_US, hi=PRIME_MAX_US))
    late = run = 0
    for i in range(n):
        flush()
        if hold > 0:
            _hold(hold)
        t0 = time.perf_counter()
        starts[i].record()
        call(i % n_sets)
        ends[i].record()
        if not starts[i].query():  # the host queued the call before the GPU reached the start event
            run = 0
            continue
        late += 1
        run += 1
        if adaptive and run == 2:  # two in a row: the host is behind for good
            hold = min(HOLD_MAX_US, 2 * hold) if hold > 0 else hold_us_for((time.perf_counter() - t0) * 1e6)
            run = 0
    torch.cuda.synchronize()
    samples = [s.elapsed_time(e) for s, e in zip(starts, ends)]
    return summarize(samples, "events", input_sets=n_sets, warmup_calls=warm, l2_flush=True,
                     hold_us=hold, late_starts=late)


def time_graph(call: Callable[[int], object], n_sets: int, warmup_ms: float = 200.0,
               min_samples: int = MIN_SAMPLES, max_samples: int = 100,
               target_ms: float = TARGET_MS, before_replay: Callable[[], None] | None = None,
               after_replays: Callable[[object, list, int], None] | None = None) -> TimingStats:
    """CUDA-graph timing: one graph holds one call on each of ``n_sets`` input sets (rotating
    sets, together several times the L2, so replays do not hit a warm cache), repeated in
    :func:`graph_passes` passes for short calls; each replay is timed with events and divided
    by the calls it holds (``calls_per_sample``).

    ``before_replay`` (untimed) may rewrite inputs or poison outputs between replays;
    ``after_replays(graph, outputs_per_set, calls)`` runs once after the timed replays
    (integrity checks: a profiled replay, a verification replay on rewritten inputs); the
    outputs are those of the last pass, ``calls`` the calls per replay.
    """
    import torch

    warm, est_call = _warmup_cuda(lambda i: call(i), n_sets, warmup_ms)
    passes = graph_passes(n_sets, est_call)
    calls = n_sets * passes
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # a few eager calls on the capture stream, as PyTorch advises
        for i in range(min(n_sets, 3)):
            call(i)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    keep = []
    with torch.cuda.graph(graph):
        for _ in range(passes):  # only the last pass's outputs are kept (for the integrity checks)
            keep = [call(i) for i in range(n_sets)]
    graph.replay()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    graph.replay()
    torch.cuda.synchronize()
    est = (time.perf_counter() - t0) * 1e3
    n = sample_count(est, min_samples, max_samples, target_ms)
    samples = []
    for _ in range(n):
        if before_replay is not None:
            before_replay()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        graph.replay()
        e.record()
        e.synchronize()
        samples.append(s.elapsed_time(e) / calls)
    if after_replays is not None:
        after_replays(graph, keep, calls)
    del keep, graph
    return summarize(samples, "graph", calls_per_sample=calls, input_sets=n_sets, warmup_calls=warm)
