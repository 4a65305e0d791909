"""``sparrow-server`` subcommands: one module each (``sparrow_server.commands.<name>``) exposing
``register(subparsers)``, which adds its parser (help: ``SUMMARIES[name]``) and sets ``func(args) -> int``.

``SUMMARIES`` sits here, apart from the modules, so that the CLI lists every command without
importing any: ``sparrow-server --help`` and each command load only what they use (a command
module imports its heavy libraries, torch and transformers included, inside the functions that
need them)."""

# Subcommand -> one-line help, in the order ``--help`` lists them.
SUMMARIES = {
    "demo": "serve the embedded model, stream one sparse rollout, exit",
    "serve": "start the rollout server",
    "rollout": "stream one rollout from a running server and print it",
    "schedules": "list, show and validate sparsity schedules",
    "cost": "predicted rollout speedup of a schedule (roofline cost model)",
    "calibrate": "calibrate a schedule for a model (p5 acceptance >= threshold)",
    "distill": "train a DistillSparse LoRA for a schedule",
    "weights": "update weights / pause / resume running servers",
    "autopilot": "steer one schedule across a fleet from pooled verification data",
}
