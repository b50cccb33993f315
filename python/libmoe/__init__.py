"""libmoe: the libmoe C MoE-layer library from Python (ctypes, no compiler at install).

    import libmoe
    layer = libmoe.MoELayer.from_checkpoint("path/to/checkpoint", layer=0)
    y = layer(x)          # x [T, H] numpy float32 or torch float32/bfloat16

    import libmoe.transformers   # "libmoe" in transformers' ExpertsInterface; patch(model)

The shared library is found through LIBMOE_LIBRARY, else a copy bundled at install, else the
repository's build/, else the system loader (docs/python.md).
"""
from .errors import (Error, InvalidArgumentError, OutOfMemoryError, FormatError, NotFoundError,
                     ShapeError, DtypeError, UnsupportedError, RangeError, DenseLayerError,
                     WorkspaceError)
from .layer import MoELayer


def memory_report(model):
    """Bytes of the MoE layers libmoe packed in a transformers model (libmoe.transformers:
    experts_implementation="libmoe" or patch()): {"modules", "original_bytes", "packed_bytes",
    "remaining_original_bytes"}, also logged at INFO on the "libmoe" logger. Imports torch and
    transformers (docs/python.md)."""
    from .transformers import memory_report as _report
    return _report(model)

__all__ = ["MoELayer", "memory_report", "Error", "InvalidArgumentError", "OutOfMemoryError", "FormatError",
           "NotFoundError", "ShapeError", "DtypeError", "UnsupportedError", "RangeError",
           "DenseLayerError", "WorkspaceError"]
