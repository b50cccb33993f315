"""libmoe.Error and one subclass per moe_status (moe.h "moe_status")."""


class Error(Exception):
    """A libmoe call failed. `status` is the moe_status name ("MOE_EINVAL", ...), `message`
    libmoe's own message (moe_ctx_last_error) or the Python-side check's."""

    def __init__(self, status, message):
        super().__init__("%s: %s" % (status, message))
        self.status = status
        self.message = message


class InvalidArgumentError(Error, ValueError): pass      # MOE_EINVAL
class OutOfMemoryError(Error, MemoryError): pass         # MOE_ENOMEM
class IOError_(Error, OSError): pass                     # MOE_EIO
class FormatError(Error, ValueError): pass               # MOE_EFORMAT
class NotFoundError(Error, LookupError): pass            # MOE_ENOTFOUND
class ShapeError(Error, ValueError): pass                # MOE_ESHAPE
class DtypeError(Error, TypeError): pass                 # MOE_EDTYPE
class UnsupportedError(Error, NotImplementedError): pass # MOE_EUNSUPPORTED
class RangeError(Error, IndexError): pass                # MOE_ERANGE
class DenseLayerError(Error, ValueError): pass           # MOE_EDENSE
class WorkspaceError(Error): pass                        # MOE_EWORKSPACE

BY_STATUS = {"MOE_EINVAL": InvalidArgumentError, "MOE_ENOMEM": OutOfMemoryError,
             "MOE_EIO": IOError_, "MOE_EFORMAT": FormatError, "MOE_ENOTFOUND": NotFoundError,
             "MOE_ESHAPE": ShapeError, "MOE_EDTYPE": DtypeError,
             "MOE_EUNSUPPORTED": UnsupportedError, "MOE_ERANGE": RangeError,
             "MOE_EDENSE": DenseLayerError, "MOE_EWORKSPACE": WorkspaceError}


def make(status, message):
    return BY_STATUS.get(status, Error)(status, message)
