"""Cost model: model shapes, hardware ceilings, roofline dense vs sparse decode, the paper's
closed forms, and the schedule search."""
from sparrow_server.cost.hardware import HARDWARE_PRESETS, Hardware, resolve_hardware
from sparrow_server.cost.model_shape import MODEL_PRESETS, ModelShape, load_model_shape, model_shape_from_config, resolve_model
from sparrow_server.cost.roofline import RolloutEstimate, predicted_speedup, rollout_estimate, roofline_bytes

__all__ = [
    "HARDWARE_PRESETS", "Hardware", "resolve_hardware", "MODEL_PRESETS", "ModelShape", "load_model_shape",
    "model_shape_from_config", "resolve_model", "RolloutEstimate", "predicted_speedup", "rollout_estimate",
    "roofline_bytes",
]
