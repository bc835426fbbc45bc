"""Request rings (AttachRing; feature "host_ring"): a co-located front-end's
Step messages through shared memory, with no gRPC in the loop.

    with Ring(client, data_bytes=64 << 20) as ring:
        with ring.step([(7, 1, False)]) as s:
            ring.data.arena.reset()
            q = ring.data.put(q_codes, DataType.FP8_E4M3)
            w = ring.data.put(weights, DataType.FP32)
            out_ref, out = ring.data.output(DataType.INT32, (rows, topk))
            s.run_layer(0, q=q, weights=w, topk_out=out_ref)   # `out` holds the top-k
            s.commit()

The byte layout and the futex doorbell are proto/ring_wire.h's; this is
that contract in Python (struct offsets, ctypes for the futex). The ring
lives in a host region of its own; `ring.data` is a second HostRegion for
the tensors the messages reference (any region of the same client will do,
device regions too). Ordering contract: a request's inputs must be complete
when it is posted; its outputs are complete when its answer is read.

A Ring is driven by one thread at a time. It belongs to its Client's
identity, like the regions: the daemon detaches it (rolling an open step
back) on Ring.close(), on DetachRing, when its region is unregistered, or
one region lease after the client went away.
"""

import ctypes
import os
import platform
import struct
import time

import grpc

from ._pb import indexer_pb2 as pb
from .client import _Step, step_header
from .errors import RegionError, StepClosedError
from .regions import HostRegion, MemfdRegion

# proto/ring_wire.h
MAGIC = 0x49585247
VERSION = 1
HEADER_BYTES = 256
SLOT_HEADER_BYTES = 16
MIN_SLOT_BYTES = 1024
MAX_SLOT_BYTES = 16 << 20
MAX_SLOTS = 1024
# Word offsets in the RingHeader (each 32 bits, written by one side only).
_REQ_HEAD, _RESP_TAIL, _CLIENT_SLEEPING = 64, 68, 72           # client's
_REQ_TAIL, _RESP_HEAD, _SERVER_SLEEPING, _DETACHED = 128, 132, 136, 140  # daemon's

_FUTEX_WAIT, _FUTEX_WAKE = 0, 1  # shared (not FUTEX_PRIVATE): the peer is another process
_SYS_FUTEX = {"x86_64": 202, "aarch64": 98}.get(platform.machine())
_libc = ctypes.CDLL(None, use_errno=True)
_CODES = {c.value[0]: c for c in grpc.StatusCode}


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class RingError(RuntimeError):
    """An answer on the ring that is not OK: `code` is the daemon's status
    (a grpc.StatusCode, as on the Step stream), str() its message. The step
    that was open is rolled back, and the ring takes the next header."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code

    def details(self):
        return str(self)


def ring_bytes(slot_count, slot_bytes):
    return HEADER_BYTES + 2 * slot_count * slot_bytes


class Ring:
    """A request ring attached to the daemon.

    Ring(client, slot_count=8, slot_bytes=64 KiB, data_bytes=0, spin=0.0,
    timeout=300.0, memfd=False): creates the ring's shared-memory object
    (memfd: a memfd passed over the daemon's memfd socket, feature
    "host_regions_memfd"), registers it, attaches it; with data_bytes > 0
    also a region `data` of the same kind (HostRegion or MemfdRegion) for
    tensors.
    spin: seconds this thread polls for an answer before it sleeps on the
    futex (0 suits a host without a core to spare; see the README). close()
    detaches, unregisters and unlinks both. Use it as a context manager.
    """

    def __init__(self, client, slot_count=8, slot_bytes=64 << 10, data_bytes=0, spin=0.0,
                 timeout=300.0, memfd=False):
        if _SYS_FUTEX is None:
            raise RegionError(f"ring: no futex system call number for {platform.machine()}")
        if slot_count < 1 or slot_count > MAX_SLOTS or slot_count & (slot_count - 1):
            raise RegionError(f"ring: slot_count {slot_count}: expected a power of two in "
                              f"[1, {MAX_SLOTS}]")
        if slot_bytes % 64 or not MIN_SLOT_BYTES <= slot_bytes <= MAX_SLOT_BYTES:
            raise RegionError(f"ring: slot_bytes {slot_bytes}: expected a multiple of 64 in "
                              f"[{MIN_SLOT_BYTES}, {MAX_SLOT_BYTES}]")
        self.client = client
        self.slot_count, self.slot_bytes = slot_count, slot_bytes
        self.spin, self.timeout = float(spin), float(timeout)
        self._next = 0  # messages posted
        self._read = 0  # answers read
        self._pending = None  # an error answer read while posting, for the next await
        self._words = {}
        self.ring = None
        self.mem = None
        self.data = None
        # The ring's own host region: a shared-memory object, or with memfd
        # a memfd passed over the daemon's memfd socket.
        kind = MemfdRegion if memfd else HostRegion
        self.mem = kind(client, ring_bytes(slot_count, slot_bytes), name=f"ring-{os.getpid()}")
        self.region = self.mem.region
        try:
            self._buf = self.mem._buf()
            # A fresh object is zero-filled: every counter starts at 0.
            struct.pack_into("<4I", self._buf, 0, MAGIC, VERSION, slot_count, slot_bytes)
            for off in (_REQ_HEAD, _RESP_TAIL, _CLIENT_SLEEPING, _RESP_HEAD, _SERVER_SLEEPING,
                        _DETACHED):
                self._words[off] = ctypes.c_uint32.from_buffer(self._buf, off)
            resp = client._unary(client.stub.AttachRing,
                                 pb.AttachRingRequest(region=self.region, offset=0))
            self.ring, self.server_spin_us = resp.ring, resp.spin_us
            if data_bytes > 0:
                self.data = kind(client, data_bytes, name=f"ring-data-{os.getpid()}")
        except BaseException:
            self.close()
            raise

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def close(self):
        """Detaches the ring (the daemon rolls an open step back), then
        unregisters and releases its memory and the data region."""
        try:
            if self.ring is not None:
                ring, self.ring = self.ring, None
                try:
                    self.client._unary(self.client.stub.DetachRing,
                                       pb.DetachRingRequest(ring=ring))
                except grpc.RpcError as e:
                    if e.code() != grpc.StatusCode.NOT_FOUND:  # already detached
                        raise
        finally:
            self._words.clear()  # the ctypes views pin the mapping
            self._buf = None
            for attr in ("data", "mem"):
                region = getattr(self, attr)
                if region is not None:
                    setattr(self, attr, None)
                    region.close()
            self.region = None

    # ---- the doorbell (proto/ring_wire.h) -----------------------------------

    def _futex(self, off, op, val, timeout_ms=0):
        word = self._words[off]
        ts = None
        if op == _FUTEX_WAIT:
            ts = ctypes.byref(_Timespec(timeout_ms // 1000, (timeout_ms % 1000) * 1000000))
        _libc.syscall(_SYS_FUTEX, ctypes.byref(word), op, val, ts, None, 0)

    def _word(self, off):
        return self._words[off].value

    def _post(self, request):
        if self.ring is None or self._word(_DETACHED):
            raise StepClosedError("ring: detached by the daemon or closed")
        payload = request.SerializeToString()
        room = self.slot_bytes - SLOT_HEADER_BYTES
        if len(payload) > room:
            raise RegionError(f"request: {len(payload)} bytes exceed the ring's slot ({room} "
                              "bytes of payload); put the tensors in a region and reference them")
        # Room in both rings: every request has one answer, read in order.
        while self._next - self._read >= self.slot_count:
            try:
                self._read_one()
            except RingError as e:
                self._pending = self._pending or e
        k = self._next
        at = HEADER_BYTES + (k % self.slot_count) * self.slot_bytes
        struct.pack_into("<IiII", self._buf, at, len(payload), 0, k & 0xffffffff, 0)
        self._buf[at + SLOT_HEADER_BYTES:at + SLOT_HEADER_BYTES + len(payload)] = payload
        self._words[_REQ_HEAD].value = (k + 1) & 0xffffffff
        # Python cannot fence between that store and a load of
        # server_sleeping, so it always rings: FUTEX_WAKE with no sleeper is
        # a cheap system call, and the kernel's lock orders the store.
        self._futex(_REQ_HEAD, _FUTEX_WAKE, 0x7fffffff)
        self._next += 1
        return k

    def _wait(self, k):
        deadline = time.monotonic() + self.timeout
        spin_end = time.monotonic() + self.spin
        target = (k + 1) & 0xffffffff
        while ((self._word(_RESP_HEAD) - target) & 0xffffffff) >= (1 << 31):
            if self._word(_DETACHED):
                raise StepClosedError("ring: the daemon let go of the ring (DetachRing, or its "
                                      "region was unregistered or expired); the open step was "
                                      "rolled back")
            now = time.monotonic()
            if now >= deadline:
                raise TimeoutError(f"ring: no answer to message {k} within {self.timeout} s")
            if now < spin_end:
                continue
            seen = self._word(_RESP_HEAD)
            self._words[_CLIENT_SLEEPING].value = 1
            # FUTEX_WAIT compares the word under the kernel's lock, after
            # this thread's store above: the daemon either sees the flag or
            # its new resp_head fails the compare.
            self._futex(_RESP_HEAD, _FUTEX_WAIT, seen, timeout_ms=50)
            self._words[_CLIENT_SLEEPING].value = 0

    def _read_one(self):
        i = self._read
        self._wait(i)
        at = HEADER_BYTES + (self.slot_count + i % self.slot_count) * self.slot_bytes
        nbytes_, code, seq, _ = struct.unpack_from("<IiII", self._buf, at)
        payload = bytes(self._buf[at + SLOT_HEADER_BYTES:
                                     at + SLOT_HEADER_BYTES + min(nbytes_, self.slot_bytes)])
        self._read += 1
        self._words[_RESP_TAIL].value = self._read & 0xffffffff
        if nbytes_ > self.slot_bytes - SLOT_HEADER_BYTES or seq != (i & 0xffffffff):
            raise RingError(grpc.StatusCode.INTERNAL,
                            f"ring: answer {i} is malformed ({nbytes_} bytes, seq {seq})")
        if code != 0:
            raise RingError(_CODES.get(code, grpc.StatusCode.UNKNOWN),
                            payload.decode("utf-8", "replace"))
        return pb.StepResponse.FromString(payload)

    def _await(self, k):
        """Reads answers up to message k's; raises the first error among
        them (a header's error surfaces at the layer after it)."""
        last = None
        while self._read != k + 1:
            try:
                last = self._read_one()
            except RingError as e:
                self._pending = self._pending or e
        if self._pending is not None:
            e, self._pending = self._pending, None
            raise e
        return last

    # ---- steps ------------------------------------------------------------

    def step(self, sequences, request_id=""):
        """Opens a step over the ring: sequences as in Client.step,
        [(id, q_len[, create]), ...]. Returns a RingStep (a context manager)."""
        return RingStep(self, step_header(sequences, request_id))


class RingStep(_Step):
    """One step over a Ring, the StepSession interface: run_layer per layer,
    then commit. Leaving the block by an exception, or without commit(),
    aborts the step (StepAbort; the daemon rolls every sequence back). After
    an error answer (RingError) the step is closed: the daemon rolled it back
    already. Inline arrays must fit the ring's slot: pass references
    (ring.data.put) for anything larger."""

    def __init__(self, ring, header):
        self._ring = ring
        ring._post(pb.StepRequest(header=header))
        self._open = True

    def _exchange(self, request):
        if not self._open:
            raise StepClosedError("step: already committed, aborted or failed")
        try:
            return self._ring._await(self._ring._post(request))
        except (RingError, StepClosedError, TimeoutError):
            self._open = False
            raise

    def _close(self):
        self._open = False

    def commit(self):
        """Commits the step; returns the sequences' lengths in header order."""
        return self._commit()

    def abort(self):
        """Rolls the step back (StepAbort) and waits for the daemon's
        StepAborted: the sequences are usable again on return."""
        if not self._open:
            return
        self._open = False
        ring = self._ring
        if ring.ring is None or ring._word(_DETACHED):
            return  # detached: the daemon rolled the step back itself
        try:
            ring._await(ring._post(pb.StepRequest(abort=pb.StepAbort())))
        except RingError:
            pass  # the step was already rolled back by an earlier error
