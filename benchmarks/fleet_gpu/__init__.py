"""The parts of ``benchmarks/fleet_2gpu.py``: two sparrow servers behind sglang-router (``router``,
``kill``) and SGLang's NCCL weight path from a stand-in trainer (``nccl``).

- ``common``: sizes, schedules, server launch (SGLang on GPUs, the reference engine on CPU for the
  dry run), rollouts, log counting, latency summaries;
- ``router_part``: 256 mixed-schedule rollouts through the router, exactly once, equal to the
  workers' own ``/rollout``; latency and tokens/s with one and two workers;
- ``kill_part``: SIGKILL of one worker mid-run, its restart and rejoin;
- ``nccl_part``: NCCL weight updates, idle and under streaming rollouts (GPU only).
"""
