"""Timing: CUDA events around each call (or burst of back-to-back calls), repetitions
interleaved round-robin, a repetition plan that keeps a run inside its deadline."""

import time

from . import gpu

DEFAULT_SPIN_MS = 0.5  # the spin before each timed call, where an implementation needs no longer


class CudaTimer:
    """Times callables with CUDA events on the current stream.

    A short GPU spin (torch.cuda._sleep) goes before each timed call so the CPU can enqueue the
    start event, the launch and the end event while the GPU is still busy: the events then bracket
    GPU work only, not Python and launch overhead (which matters for the small cases). A burst
    (many calls between the two events, for peers whose Python host path outlasts their
    kernel) asks for a longer spin, one that covers the enqueue of all its calls."""

    def __init__(self, spin_ms=DEFAULT_SPIN_MS):
        import torch
        self.torch = torch
        self.spin_cycles = 0
        self.cycles_per_ms = 0.0
        if hasattr(torch.cuda, "_sleep"):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(1000)  # first call loads the kernel
            start.record()
            torch.cuda._sleep(1_000_000)
            end.record()
            end.synchronize()
            ms = start.elapsed_time(end)
            if ms > 0:
                self.cycles_per_ms = 1_000_000 / ms
        self.spin_cycles = self.cycles_for(spin_ms)

    def cycles_for(self, ms):
        """torch.cuda._sleep cycles of about `ms` of GPU time (0 without _sleep or for ms <= 0)."""
        return int(max(0.0, ms) * self.cycles_per_ms)

    def launch(self, fn, spin_cycles=None):
        """(start, end, enqueue_ms): the events around fn and the host time from the spin's
        launch to the end event's, which must stay under the spin for the events to bracket GPU
        work only."""
        torch = self.torch
        cycles = self.spin_cycles if spin_cycles is None else spin_cycles
        if cycles:
            torch.cuda._sleep(cycles)
        t0 = time.perf_counter()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        return start, end, (time.perf_counter() - t0) * 1e3

    @staticmethod
    def elapsed_ms(handle):
        start, end = handle[:2]
        return start.elapsed_time(end)


def burst(fn, calls):
    """fn called `calls` times back to back (one timed sample of a burst)."""
    def run():
        for _ in range(calls):
            fn()
    return run


def covering_spin_ms(timer, base_ms, enqueue_ms):
    """The spin before a timed call (or burst) whose host enqueue takes enqueue_ms: at least
    base_ms, and twice the enqueue plus 0.2 ms, so the events bracket GPU work only; 0 where the
    timer spins not at all."""
    return max(base_ms, 2.0 * enqueue_ms + 0.2) if timer.spin_cycles else 0.0


def enqueue_spins(impls, timer, base_ms):
    """({name: spin cycles}, {name: spin ms}): a spin per implementation of at least base_ms that
    covers twice its host enqueue, measured on one calibration call (a GPU with work queued
    behind a spin shorter than the enqueue would time host time too; FA4's Python path is ~0.1-0.6
    ms a call). No spins (0) where the timer has none."""
    spins, spin_ms = {}, {}
    for name, fn in impls.items():
        handle = timer.launch(fn)
        gpu.sync()
        spin_ms[name] = covering_spin_ms(timer, base_ms, handle[2])
        spins[name] = timer.cycles_for(spin_ms[name])
    return spins, spin_ms


def round_robin(impls, targets, timer, spins=None, enqueue=None):
    """Interleaves repetitions: round r runs every impl that still needs samples once, in turn.

    cuDNN's speed moves 5-10% from call to call; interleaving spreads those drifts over all
    implementations alike instead of handing one a good or bad stretch. spins: {name: spin
    cycles} for impls that need their own (bursts); enqueue: a dict that gets {name: [host ms
    of each sample's enqueue]}."""
    samples = {name: [] for name in impls}
    names = list(impls)
    spins = spins or {}
    for r in range(max(targets.values(), default=0)):
        handles = []
        # the order rotates too, so no implementation always runs right after the same one
        for name in names[r % len(names):] + names[:r % len(names)]:
            if len(samples[name]) < targets[name]:
                handles.append((name, timer.launch(impls[name], spins.get(name))))
        gpu.sync()  # bounded number of live events; reading them needs completion anyway
        for name, handle in handles:
            samples[name].append(timer.elapsed_ms(handle))
            if enqueue is not None:
                enqueue.setdefault(name, []).append(handle[2])
    return samples


def per_call_ms(runs, calls, reps, timer, spin_ms=5.0):
    """{name: [ms per call of each burst]}: `reps` bursts of `calls` back-to-back calls of every
    run, warmed once, interleaved round-robin after a GPU spin of spin_ms (tools' sweeps)."""
    bursts = {name: burst(fn, calls) for name, fn in runs.items()}
    for fn in bursts.values():  # warm
        fn()
    spin = timer.cycles_for(spin_ms)
    samples = round_robin(bursts, {name: reps for name in runs}, timer,
                          spins={name: spin for name in runs})
    return {name: [ms / calls for ms in s] for name, s in samples.items()}


def plan_reps(per_call_s, reps, min_reps, budget_s, time_left_s):
    """Repetitions per impl: `reps`, fewer (down to min_reps) only for calls so slow that reps of
    them would take over budget_s (the slowest kernels at 64k); then, when the deadline is near,
    all scaled down to fit the time left (down to 1), so the device call ends with its report."""
    if time_left_s <= 0:
        return {name: 1 for name in per_call_s}
    targets = {}
    for name, t in per_call_s.items():
        n = reps
        if t * reps > budget_s:
            n = max(min_reps, int(budget_s / max(t, 1e-9)))
        targets[name] = n
    total = sum(targets[n] * per_call_s[n] for n in targets)
    if total > time_left_s:
        factor = time_left_s / total
        targets = {n: max(1, int(c * factor)) for n, c in targets.items()}
    return targets
