"""libmoe: the libmoe C MoE-layer library from Python (ctypes, no compiler at install).

    import libmoe
    layer = libmoe.MoELayer.from_checkpoint("path/to/checkpoint", layer=0)
    y = layer(x)          # x [T, H] numpy float32 or torch float32/bfloat16

The shared library is found through LIBMOE_LIBRARY, else a copy bundled at install, else the
repository's build/, else the system loader (docs/python.md).
"""
from .errors import (Error, InvalidArgumentError, OutOfMemoryError, FormatError, NotFoundError,
                     ShapeError, DtypeError, UnsupportedError, RangeError, DenseLayerError,
                     WorkspaceError)
from .layer import MoELayer

__all__ = ["MoELayer", "Error", "InvalidArgumentError", "OutOfMemoryError", "FormatError",
           "NotFoundError", "ShapeError", "DtypeError", "UnsupportedError", "RangeError",
           "DenseLayerError", "WorkspaceError"]
