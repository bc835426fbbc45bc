"""The indexerd client: unary calls and the step session (SPEC §6).

Thread safety: a Client may be shared by threads (gRPC channels and stubs
are thread-safe). A StepSession is driven by one thread at a time;
independent sessions over disjoint sequences may run concurrently.
"""

import dataclasses
import queue
import threading

import grpc
import numpy as np

from ._pb import indexer_pb2 as pb
from ._pb import indexer_pb2_grpc as pb_grpc
from .errors import RegionError, StepClosedError, TensorError
from .regions import send_memfd
from .tensors import from_tensor, to_tensor

CLIENT_ID_HEADER = "x-indexer-client"
_MAX_MESSAGE = 1 << 30
_END = object()  # closes a step's request stream (half-close)


def seq_id(x):
    """A SequenceId from an int (numeric id), a str (name) or a SequenceId."""
    if isinstance(x, pb.SequenceId):
        return x
    if isinstance(x, (int, np.integer)) and not isinstance(x, bool):
        return pb.SequenceId(num=int(x))
    if isinstance(x, str):
        return pb.SequenceId(name=x)
    raise TypeError(f"sequence id: expected int or str, got {type(x).__name__}")


def step_header(sequences, request_id=""):
    """A StepHeader of sequences = [(id, q_len[, create]), ...]."""
    header = pb.StepHeader(request_id=request_id)
    for i, s in enumerate(sequences):
        if len(s) not in (2, 3):
            raise TensorError(f"sequences[{i}]: expected (id, q_len[, create]), got {s!r}")
        header.sequences.add(id=seq_id(s[0]), q_len=int(s[1]),
                             create=bool(s[2]) if len(s) == 3 else False)
    return header


@dataclasses.dataclass
class LayerResult:
    """One layer's answer.

    topk: [rows, topk] (or [Hi, rows, topk_blocks] for block layers) int32,
      -1 past a row's visible entries; None when the request named topk_out
      (the daemon wrote it there, `shape` says what it wrote).
    timings: the daemon's LayerTimings in microseconds, as a dict.
    """
    layer: int
    topk: object
    shape: tuple
    timings: dict


def _timings(t):
    return {f.name: getattr(t, f.name) for f in pb.LayerTimings.DESCRIPTOR.fields}


def _as_tensor(value, what, dtype=None):
    """A Tensor from a Tensor message (inline or ref) or an array."""
    if value is None or isinstance(value, pb.Tensor):
        return value
    return to_tensor(value, dtype=dtype, what=what)


def layer_request(layer, k=None, q=None, weights=None, q_scale=None, topk_out=None,
                  k_dtype=None, q_dtype=None):
    """The LayerRequest of run_layer's arguments (StepSession, RingStep)."""
    req = pb.LayerRequest(layer=int(layer))
    for field, value, dtype in (("k", k, k_dtype), ("q", q, q_dtype),
                                ("weights", weights, None), ("q_scale", q_scale, None)):
        t = _as_tensor(value, f"layer {layer}: {field}", dtype)
        if t is not None:
            getattr(req, field).CopyFrom(t)
    if topk_out is not None:
        req.topk_out.CopyFrom(topk_out)
    return req


def layer_result(reply, written_out):
    """A LayerResult of a LayerReply; `written_out`: the request named
    topk_out (the reply carries shape, no bytes)."""
    topk = None if written_out else from_tensor(reply.topk, f"layer {reply.layer}: topk")
    return LayerResult(layer=reply.layer, topk=topk, shape=tuple(reply.topk.shape),
                       timings=_timings(reply.timings))


class _Step:
    """What a Step stream session and a ring step share: the context
    manager (leaving the block open aborts), is_open, run_layer and the
    commit's answer. Subclasses give _exchange(request) -> StepResponse,
    _close() and abort()."""

    _open = False
    committed = None  # lengths after commit

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if self._open:
            self.abort()
        return False

    @property
    def is_open(self):
        return self._open

    def run_layer(self, layer, k=None, q=None, weights=None, q_scale=None, topk_out=None,
                  k_dtype=None, q_dtype=None):
        """Sends one layer and waits for its reply.

        k, q, weights, q_scale: numpy arrays (sent inline; FP32/INT32/UINT8
          from the array's dtype, or k_dtype / q_dtype, e.g.
          DataType.FP8_E4M3 for uint8 e4m3 codes, DataType.BF16) or Tensor
          messages (inline or references, see tensors.ref_tensor). Shapes
          follow the proto: k [n_new, D] or [n_new, VB + SB] UINT8, q
          [rows, H, D] (or [rows, H, D/2] UINT8 + q_scale [rows, H, D/32]
          for MXFP4), weights [rows, H] FP32 (none for block layers).
        topk_out: a TensorRef where the daemon writes the top-k instead of
          the reply.
        Returns a LayerResult. Raises the daemon's status (grpc.RpcError on
        the Step stream, RingError on a ring; the step is then rolled back
        and this session closed).
        """
        req = layer_request(layer, k, q, weights, q_scale, topk_out, k_dtype, q_dtype)
        resp = self._exchange(pb.StepRequest(layer=req))
        if resp.WhichOneof("kind") != "layer" or resp.layer.layer != req.layer:
            self.abort()
            raise StepClosedError(f"step: expected the reply of layer {layer}, got {resp}")
        return layer_result(resp.layer, topk_out is not None)

    def _commit(self):
        """Sends StepCommit, closes, returns the lengths in header order."""
        resp = self._exchange(pb.StepRequest(commit=pb.StepCommit()))
        self._close()
        if resp.WhichOneof("kind") != "committed":
            raise StepClosedError(f"step: expected StepCommitted, got {resp}")
        self.committed = list(resp.committed.seq_lens)
        return self.committed


class StepSession(_Step):
    """One open Step stream: header sent, then run_layer per layer, then
    commit. Use it as a context manager: leaving the block by an exception,
    or without commit(), aborts the step (the daemon rolls every sequence
    back). Errors the daemon finds in the header surface at the first
    run_layer, as grpc.RpcError. After any error the session is closed: the
    daemon has already rolled the step back.
    """

    def __init__(self, stub, header, metadata, timeout, abort_grace):
        self._requests = queue.Queue()
        self._requests.put(pb.StepRequest(header=header))
        self._abort_grace = abort_grace
        self._done = threading.Event()
        self._call = stub.Step(iter(self._requests.get, _END), metadata=metadata,
                               timeout=timeout)
        self._call.add_done_callback(lambda _: self._done.set())
        self._open = True

    def __del__(self):
        if getattr(self, "_open", False):
            self._call.cancel()

    def _exchange(self, request):
        if not self._open:
            raise StepClosedError("step: already committed, aborted or failed")
        self._requests.put(request)
        try:
            return next(self._call)
        except grpc.RpcError:
            self._close()
            raise
        except StopIteration:
            self._close()
            raise StepClosedError("step: the daemon ended the stream without a reply") from None

    def _close(self):
        self._open = False
        self._requests.put(_END)

    def commit(self):
        """Commits the step; returns the sequences' lengths in header order."""
        self._commit()
        # The daemon ends the stream after StepCommitted; wait for its status
        # so that the sequences are free for the next step when this returns.
        self._done.wait(self._abort_grace)
        return self.committed

    def abort(self):
        """Rolls the step back: closes the request stream and waits (up to
        the client's abort_grace) for the daemon's ABORTED, which it sends
        after the rollback, so the sequences are usable again on return;
        cancels the call if the daemon does not answer in time."""
        if not self._open:
            return
        self._close()
        if not self._done.wait(self._abort_grace):
            self._call.cancel()


def _read_pem(field, path):
    if path is None:
        return None
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise ValueError(f"{field}: cannot read {path!r}: {e}") from None


def _tls_credentials(tls_ca, tls_cert, tls_key):
    """TLS to the daemon (README "Security"): tls_ca verifies the daemon
    (None = the system roots); tls_cert + tls_key present a client
    certificate for mutual TLS."""
    if (tls_cert is None) != (tls_key is None):
        raise ValueError("tls_cert, tls_key: expected both or neither")
    return grpc.ssl_channel_credentials(
        root_certificates=_read_pem("tls_ca", tls_ca),
        private_key=_read_pem("tls_key", tls_key),
        certificate_chain=_read_pem("tls_cert", tls_cert))


class Client:
    """A connection to indexerd.

    addr: "host:port". client_id: sent as metadata "x-indexer-client" on every
    call (the daemon's plaintext client identity, which namespaces sequences
    and regions). timeout: deadline in seconds of each unary call and of each
    whole step stream (None = none). abort_grace: how long an abort waits
    for the daemon's rollback before cancelling. metadata: more (key, value)
    pairs sent on every call, e.g. ("traceparent", ...) and ("x-request-id",
    ...), which the daemon writes into its per-call log line.
    """

    def __init__(self, addr, client_id=None, timeout=300.0, abort_grace=10.0,
                 max_message_bytes=_MAX_MESSAGE, channel=None, tls_ca=None,
                 tls_cert=None, tls_key=None, tls_server_name=None, metadata=()):
        self.addr = addr
        self.timeout = timeout
        self.abort_grace = abort_grace
        self._metadata = (((CLIENT_ID_HEADER, client_id),) if client_id else ()) + tuple(
            (str(k), str(v)) for k, v in metadata)
        options = [("grpc.max_send_message_length", max_message_bytes),
                   ("grpc.max_receive_message_length", max_message_bytes)]
        if channel is None and (tls_ca or tls_cert or tls_key or tls_server_name):
            channel = grpc.secure_channel(
                addr, _tls_credentials(tls_ca, tls_cert, tls_key),
                options + ([("grpc.ssl_target_name_override", tls_server_name)]
                           if tls_server_name else []))
        self._channel = channel or grpc.insecure_channel(addr, options=options)
        self.stub = pb_grpc.IndexerStub(self._channel)

    def close(self):
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def wait_ready(self, timeout=10.0):
        """Blocks until the channel connects; grpc.FutureTimeoutError after
        timeout seconds."""
        grpc.channel_ready_future(self._channel).result(timeout=timeout)

    def _unary(self, method, request):
        return method(request, metadata=self._metadata, timeout=self.timeout)

    def server_info(self):
        """The daemon's ServerInfo message (profile, groups, layers, features,
        capacity, open steps, sequences held)."""
        return self._unary(self.stub.GetServerInfo, pb.GetServerInfoRequest())

    def release(self, ids):
        """Drops sequences; returns the pages released. NOT_FOUND for an
        unknown id, FAILED_PRECONDITION for one in an open step."""
        req = pb.ReleaseRequest(ids=[seq_id(i) for i in ids])
        return self._unary(self.stub.Release, req).released_pages

    def write_entries(self, sequence, num_tokens, layers, create=False):
        """Imports num_tokens tokens of K computed elsewhere (atomic).

        layers: {layer id: entries} for every layer of the profile, each an
          array ([n_new, D] float32, or [n_new, VB + SB] uint8
          pre-quantized) or a Tensor. Returns the sequence length after.
        """
        req = pb.WriteEntriesRequest(id=seq_id(sequence), create=create,
                                     num_tokens=int(num_tokens))
        for layer, k in sorted(layers.items()):
            req.layers.add(layer=int(layer)).k.CopyFrom(_as_tensor(k, f"layers[{layer}].k"))
        return self._unary(self.stub.WriteEntries, req).seq_len

    def step(self, sequences, request_id=""):
        """Opens a step over sequences = [(id, q_len, create), ...] (create
        may be left out: False). Returns a StepSession."""
        return StepSession(self.stub, step_header(sequences, request_id), self._metadata,
                           self.timeout, self.abort_grace)

    # Lifecycle (README "Lifecycle").

    def list_sequences(self, page_size=0, page_token=""):
        """One page of this client's own sequences: (list of SequenceInfo
        {id, length, pages per group, idle_ms, busy}, next_page_token; ""
        = no more)."""
        resp = self._unary(self.stub.ListSequences,
                           pb.ListSequencesRequest(page_size=page_size, page_token=page_token))
        return list(resp.sequences), resp.next_page_token

    def export_entries(self, sequence, max_message_bytes=0, max_tokens=0):
        """Yields a sequence's entries as WriteEntriesRequest messages (the
        first with create set): sent in order to another daemon of the same
        profile (write_entries_request) they recreate it there."""
        req = pb.ExportEntriesRequest(id=seq_id(sequence), max_message_bytes=max_message_bytes,
                                      max_tokens=max_tokens)
        yield from self.stub.ExportEntries(req, metadata=self._metadata, timeout=self.timeout)

    def write_entries_request(self, request):
        """WriteEntries with a ready WriteEntriesRequest (e.g. an exported
        one); returns the sequence length after."""
        return self._unary(self.stub.WriteEntries, request).seq_len

    def copy_sequence(self, sequence, to, max_message_bytes=0):
        """Exports a sequence from this daemon into Client `to`, one message
        at a time (the prefill -> decode hand-off); returns its length there.
        On an error midway `to` holds a prefix: release it before a retry."""
        length = 0
        for m in self.export_entries(sequence, max_message_bytes=max_message_bytes):
            length = to.write_entries_request(m)
        return length

    # Regions (SPEC §6 data plane). The region helpers in regions.py wrap these.

    def register_host_region(self, name, shm_name, nbytes, offset=0):
        """Registers [offset, offset + nbytes) of POSIX shared-memory object
        shm_name ("/name"); returns (region id, lease_ms)."""
        req = pb.RegisterRegionRequest(
            name=name, host=pb.HostRegion(shm_name=shm_name, offset=offset, bytes=nbytes))
        resp = self._unary(self.stub.RegisterRegion, req)
        return resp.region, resp.lease_ms

    def register_memfd_token(self, name, token, nbytes, offset=0):
        """Registers [offset, offset + nbytes) of the memfd that `token` (from
        send_memfd) names; returns (region id, lease_ms)."""
        req = pb.RegisterRegionRequest(
            name=name, host=pb.HostRegion(memfd_token=token, offset=offset, bytes=nbytes))
        resp = self._unary(self.stub.RegisterRegion, req)
        return resp.region, resp.lease_ms

    def register_memfd_region(self, name, fd, nbytes, offset=0, socket_path=None):
        """Passes memfd `fd` over the daemon's memfd socket (socket_path, by
        default the one ServerInfo names) and registers it; returns (region
        id, lease_ms). RegionError when the daemon has no memfd socket or
        refuses the descriptor."""
        if socket_path is None:
            socket_path = self.server_info().memfd_socket
            if not socket_path:
                raise RegionError(f"{self.addr}: the daemon has no memfd socket (feature "
                                  "host_regions_memfd)")
        return self.register_memfd_token(name, send_memfd(socket_path, fd), nbytes, offset)

    def register_device_region(self, name, ipc_handle, nbytes, offset=0, device_uuid="",
                               pci_bus_id=""):
        """Registers nbytes at offset of the GPU allocation that ipc_handle
        (64 bytes of cudaIpcMemHandle) names; returns (region id, lease_ms)."""
        req = pb.RegisterRegionRequest(
            name=name, device=pb.DeviceRegion(ipc_handle=bytes(ipc_handle),
                                              device_uuid=device_uuid, pci_bus_id=pci_bus_id,
                                              offset=offset, bytes=nbytes))
        resp = self._unary(self.stub.RegisterRegion, req)
        return resp.region, resp.lease_ms

    def unregister_region(self, region):
        self._unary(self.stub.UnregisterRegion, pb.UnregisterRegionRequest(region=int(region)))

    def list_regions(self):
        return list(self._unary(self.stub.ListRegions, pb.ListRegionsRequest()).regions)
