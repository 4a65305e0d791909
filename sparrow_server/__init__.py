"""Sparrow Server: sparse rollouts for RL of LLMs (schedule-driven block-sparse decode)."""

__version__ = "0.1.0"
