"""torchfleet runtime: load, warm up and serve a PyTorch model."""

__version__ = "0.1.0"
