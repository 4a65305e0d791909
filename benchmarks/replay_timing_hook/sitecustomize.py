"""Times every CUDA-graph replay of the process with CUDA events, for ``benchmarks/replay_timing.py``.

Loaded by Python at start-up when this folder is first on ``PYTHONPATH`` (the benchmark puts it there for the
server it starts, and only then); does nothing unless ``SPARROW_REPLAY_TIMING_DIR`` is set. Each replay of a
``torch.cuda.CUDAGraph`` gets an event before and after it on the replaying stream; once the end event has
completed (checked without blocking at the next replay) one line goes to ``DIR/replays-PID.tsv``:
wall-clock seconds at the launch, the graph's id, whether the torch profiler was on, GPU µs from the start event
to the end event (the replay as the GPU ran it, gaps included), host µs the launch call took, GPU µs from the
previous replay's end to this one's start.
"""
import os

_DIR = os.environ.get("SPARROW_REPLAY_TIMING_DIR")


def _install(out_dir: str) -> None:
    import time

    import torch

    pending: list = []
    state = {"prev_end": None, "file": None}
    replay = torch.cuda.CUDAGraph.replay

    def flush() -> None:
        while pending and pending[0][1].query():
            start, end, wall, host_us, prev_end, profiled, graph_id = pending.pop(0)
            since_prev = prev_end.elapsed_time(start) * 1e3 if prev_end is not None else float("nan")
            if state["file"] is None:
                os.makedirs(out_dir, exist_ok=True)
                state["file"] = open(os.path.join(out_dir, f"replays-{os.getpid()}.tsv"), "a", buffering=1)
            state["file"].write(f"{wall:.6f}\t{graph_id}\t{int(profiled)}\t{start.elapsed_time(end) * 1e3:.1f}\t"
                                f"{host_us:.1f}\t{since_prev:.1f}\n")

    def timed_replay(self):
        flush()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        profiled = torch._C._autograd._profiler_enabled()
        wall, t0 = time.time(), time.perf_counter()
        start.record()
        out = replay(self)
        end.record()
        pending.append((start, end, wall, (time.perf_counter() - t0) * 1e6, state["prev_end"], profiled, id(self)))
        state["prev_end"] = end
        return out

    torch.cuda.CUDAGraph.replay = timed_replay


if _DIR:
    _install(_DIR)
