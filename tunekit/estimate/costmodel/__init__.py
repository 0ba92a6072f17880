"""The cost model: a recipe's step time by phase on a GPU type it never ran on, from FLOPs, bytes and the
hardware's peaks (``model``), phase efficiencies fitted from earlier probes (``calibrate``), and the full run's
memory, wall time and yuan (``predict``)."""

from tunekit.estimate.costmodel.calibrate import Calibration, calibrate
from tunekit.estimate.costmodel.predict import Prediction, compare, predict

__all__ = ["Calibration", "Prediction", "calibrate", "compare", "predict"]
