"""distcourse: distributed training, built from scratch on torch.distributed."""

__version__ = "0.1.0"
