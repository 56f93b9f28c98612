"""riffle: globally shuffled, parallel data loading for ML training.

``riffle.Loader`` iterates batches served by the local riffle daemon through
shared memory; ``riffle.torch`` adapts it to PyTorch; ``riffle.decode`` turns
record bytes into arrays.
"""

from .client import (Batch, DaemonGone, DataChanged, DataError, InvalidSpec, JobClosed, Loader, MemoryBudget,
                     PathNotFound, RiffleError, connect, default_socket, merge_states)
from . import decode

__all__ = ["Batch", "DaemonGone", "DataChanged", "DataError", "InvalidSpec", "JobClosed", "Loader", "MemoryBudget",
           "PathNotFound", "RiffleError", "connect", "decode", "default_socket", "merge_states"]
__version__ = "0.2.0"
