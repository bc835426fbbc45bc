"""Errors of the client library.

Failures the daemon reports keep their gRPC form: the call raises
``grpc.RpcError`` whose ``code()`` is the SPEC §6 status (INVALID_ARGUMENT,
NOT_FOUND, FAILED_PRECONDITION, ...) and ``details()`` the daemon's message,
which names the field and the expected value. Mistakes caught before anything
is sent (a tensor of the wrong shape or dtype, a step used after it ended)
raise the classes below.
"""


class TensorError(ValueError):
    """An array cannot become (or be read from) a Tensor as asked."""


class StepClosedError(RuntimeError):
    """A StepSession was used after it committed, aborted or failed."""


class RegionError(RuntimeError):
    """A region helper cannot do what was asked (size, alignment, CUDA)."""
