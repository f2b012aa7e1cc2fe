"""Capture: a model's training step as one joint forward+backward ATen graph (a Program)."""
from autopar.capture.export import capture, program_inputs

__all__ = ["capture", "program_inputs"]
