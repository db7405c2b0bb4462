"""The course's GPU timers: ``timer(fn) -> milliseconds``, the median time of one call of ``fn``.

:func:`flush_timer` is the course's timer (do_bench's method, timing the GPU alone, with the L2
flushed by writing or, :func:`read_flush_timer`, by reading before each call);
:func:`do_bench_timer` is ``triton.testing.do_bench`` itself, the baselines' timer; :func:`host_us`
times the other side, the host's Python and launches per call. Each timer carries its
``settings``, which :func:`flashcourse.bench.run` writes into the result. Making a timer needs no
GPU; calling one does (tests stand a fake timer in for them).

Example:
    >>> flush_timer().settings["flush"], DO_BENCH["rep"]
    ('write 256 MiB', 100)
    >>> do_bench_timer(5, 20).settings["timer"]
    'triton.testing.do_bench'
"""
from __future__ import annotations

__all__ = ["DO_BENCH", "FLUSH_BYTES", "FLUSHES", "do_bench_timer", "flush_timer", "read_flush_timer", "host_us"]

#: The do_bench settings of the course (and of the H100 baselines): warm up 25 ms, time 100 ms, median.
DO_BENCH = {"warmup": 25, "rep": 100, "return_mode": "median"}


def do_bench_timer(warmup: int = DO_BENCH["warmup"], rep: int = DO_BENCH["rep"]):
    """The median of ``triton.testing.do_bench(fn, warmup, rep)``, in ms: the baselines' timer.

    do_bench flushes the L2 cache before every call and times each with CUDA events. When the
    host needs longer to launch ``fn`` than the GPU needs for the flush, the GPU's wait for the
    launch is timed too: :func:`flush_timer`, the course's timer, keeps the host ahead.
    """
    def timer(fn) -> float:
        import triton.testing
        return float(triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))
    timer.settings = {"timer": "triton.testing.do_bench", "warmup_ms": warmup, "rep_ms": rep,
                      "return_mode": "median"}
    return timer


#: Bytes a flush reads or writes: several times any L2 of the course's GPUs (the H100's is 50 MB).
FLUSH_BYTES = 256 * 1024 * 1024
FLUSHES = ("write", "read")
_FLUSH: list = []
_CYCLES_PER_MS: list = []
_WARMED: list = []


def flush_timer(flush: str = "write", warmup: int = DO_BENCH["warmup"], rep: int = DO_BENCH["rep"]):
    """do_bench's method, with the GPU's time only: the median time of ``fn``, in ms.

    Like ``triton.testing.do_bench``: warm-up and repeat counts from ``warmup``/``rep`` ms, the L2
    flushed before each call, CUDA events around each call, the median. Three differences:

    * ``flush="write"`` zeroes 256 MB, as do_bench does: every timed call starts with an L2 full
      of dirty lines, and each line it brings in first writes one back to HBM. For a kernel that
      streams tens of MB (a KV cache, a weight matrix) that is up to the L2's size (50 MB on an
      H100, ~16 us) of write-back charged to the kernel. ``flush="read"`` reads 256 MB instead,
      so the L2 holds clean lines that are simply dropped -- the state a decode step finds after
      the GEMMs and norms before it.
    * Before its first timing in a process, the timer keeps the GPU busy for 0.3 s: the first case
      of a run otherwise meets an idle GPU (an H100 timed the first of 140 cases 5% slower than
      the same kernel later in the run).
    * The host is kept ahead of the GPU. The start event is queued before ``fn`` is called; if the
      host needs longer to launch ``fn`` (a Triton kernel's Python launch: 20-80 us) than the GPU
      needs for the flush, the GPU waits for the launch between the two events and the wait is
      timed as if it were the kernel's. So when the host's time per call exceeds the GPU's, each
      call is preceded by a GPU sleep (``torch.cuda._sleep``) longer than the host's time: the
      launches queue up ahead and the events time the kernels alone.

    Example:
        >>> flush_timer("read").settings["flush"]
        'read 256 MiB'
    """
    if flush not in FLUSHES:
        raise ValueError(f"flush_timer: flush is {flush!r}; expected 'write' (do_bench's zeroing) or 'read'")

    def timer(fn) -> float:
        import time

        import torch
        if not _FLUSH:
            _FLUSH.append(torch.ones(FLUSH_BYTES // 4, dtype=torch.int32, device="cuda"))
        buf = _FLUSH[0]
        flush_l2 = buf.sum if flush == "read" else buf.zero_
        if not _WARMED:                     # the first case of a run must not find an idle GPU
            _warm_up(flush_l2)

        fn()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        start.record()
        for _ in range(5):
            flush_l2()
            fn()
        end.record()
        host_ms = (time.perf_counter() - t0) * 1e3 / 5
        torch.cuda.synchronize()
        gpu_ms = start.elapsed_time(end) / 5                   # one flush and one call
        estimate = max(gpu_ms, 1e-3)
        n_warmup, n_repeat = max(1, int(warmup / estimate)), max(1, int(rep / estimate))
        # the host's time per call beyond the GPU's: sleep 2x the host's time, so the host gains
        sleep = _sleep_cycles(2 * host_ms) if host_ms > 0.5 * gpu_ms else 0
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(n_repeat)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(n_repeat)]
        for _ in range(n_warmup):
            fn()
        for i in range(n_repeat):
            if sleep:
                torch.cuda._sleep(sleep)
            flush_l2()
            starts[i].record()
            fn()
            ends[i].record()
        torch.cuda.synchronize()
        times = sorted(a.elapsed_time(b) for a, b in zip(starts, ends))
        return float(times[len(times) // 2])
    timer.settings = {"timer": "do_bench's method, host kept ahead", "flush": f"{flush} 256 MiB",
                      "warmup_ms": warmup, "rep_ms": rep, "return_mode": "median"}
    return timer


def _warm_up(work, seconds: float = 0.3) -> None:
    """Keep the GPU busy for ``seconds`` (clocks up, memory warm) before the first timing of a run."""
    import time

    import torch
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(10):
            work()
        torch.cuda.synchronize()
    _WARMED.append(True)


def _sleep_cycles(ms: float) -> int:
    """GPU clock cycles that ``torch.cuda._sleep`` spins for ``ms`` milliseconds (measured once)."""
    import torch
    if not _CYCLES_PER_MS:
        cycles = 10_000_000
        torch.cuda._sleep(cycles // 10)
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        torch.cuda._sleep(cycles)
        b.record()
        torch.cuda.synchronize()
        _CYCLES_PER_MS.append(cycles / max(a.elapsed_time(b), 1e-3))
    return max(1, int(ms * _CYCLES_PER_MS[0]))


def read_flush_timer(warmup: int = DO_BENCH["warmup"], rep: int = DO_BENCH["rep"]):
    """:func:`flush_timer` with the L2 flushed by *reading* 256 MB (clean lines, nothing to write back).

    Example:
        >>> read_flush_timer().settings["flush"]
        'read 256 MiB'
    """
    return flush_timer("read", warmup, rep)


def host_us(fn, calls: int = 100, rounds: int = 9, sleep: bool = True) -> float:
    """The host's time per call of ``fn`` in microseconds: what Python and the launches cost, without the GPU.

    With ``sleep`` the GPU is first put to sleep (``torch.cuda._sleep``) for longer than the calls
    take, so every launch is only queued: the loop measures the host alone, however long the kernels
    run. (A function that synchronises with the GPU waits for the sleep, and its time shows it.)
    The median of ``rounds`` loops of ``calls`` calls; keep ``calls`` times the launches per call
    under the GPU's queue of about a thousand launches.

    Example (on a GPU):
        >>> import torch                                                # doctest: +SKIP
        >>> x = torch.ones(1, device="cuda")                            # doctest: +SKIP
        >>> 1 < host_us(lambda: x + 1) < 100                            # doctest: +SKIP
        True
    """
    import statistics
    import time

    import torch
    fn()
    torch.cuda.synchronize()
    per_call = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        guess_ms = max((time.perf_counter() - t0) * 1e3, 0.05)
        if sleep:
            torch.cuda._sleep(_sleep_cycles(2 * guess_ms * calls + 5))
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        per_call.append((time.perf_counter() - t0) / calls * 1e6)
        torch.cuda.synchronize()
    return statistics.median(per_call)
