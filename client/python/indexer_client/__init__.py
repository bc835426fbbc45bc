"""Python client of indexerd, the sparse-attention indexer daemon (SPEC §6).

    from indexer_client import Client
    c = Client("127.0.0.1:50061", client_id="fe-0")
    with c.step([(7, 1, False)]) as s:
        r = s.run_layer(0, k=k, q=q_codes, q_dtype=DataType.FP8_E4M3, weights=w)
        s.commit()

Modules: client (Client, StepSession), tensors (numpy <-> Tensor), fp8 (the
e4m3 codec and SPEC §3 quantizers), reference (SPEC §5 dense reference and
top-k check), regions (host regions by shared-memory name or memfd, and
device regions), ring (Ring: a co-located front-end's steps through a
request ring in shared memory, no gRPC in the loop), cuda_ipc (CUDA IPC export
via ctypes), routing (RoutedClient: sequences spread over several daemons
by rendezvous hashing). torch is imported only by DeviceRegion.
"""

from ._pb import indexer_pb2 as pb
from .client import CLIENT_ID_HEADER, Client, LayerResult, StepSession, seq_id
from .errors import RegionError, StepClosedError, TensorError
from .regions import Arena, DeviceRegion, HostRegion, MemfdRegion, packed_size, send_memfd
from .ring import Ring, RingError, RingStep
from .routing import Part, RoutedClient, pick_daemon, rendezvous_weight
from .tensors import (DataType, from_bf16_bits, from_tensor, nbytes, ref_tensor, tensor_ref,
                      to_bf16_bits, to_tensor)

__all__ = [
    "Arena", "CLIENT_ID_HEADER", "Client", "DataType", "DeviceRegion", "HostRegion",
    "LayerResult", "MemfdRegion", "Part", "RegionError", "Ring", "RingError", "RingStep", "RoutedClient", "pick_daemon", "rendezvous_weight", "StepClosedError", "StepSession", "TensorError", "from_bf16_bits",
    "from_tensor", "nbytes", "packed_size", "pb", "ref_tensor", "send_memfd", "seq_id", "tensor_ref",
    "to_bf16_bits", "to_tensor",
]
