"""Several daemons behind one client (README "Several daemons").

Each sequence belongs to one daemon, chosen from its id by rendezvous
(highest random weight) hashing: adding a daemon to n moves only the
~1/(n+1) of the sequences the new one wins; removing one moves only its
own. The hash is the C++ client's (client/include/indexer/routing.h), so
both route an id to the same daemon given the same address list.

RoutedClient.step groups a batch by daemon and runs one step per daemon,
the daemons in parallel (one thread each). Atomicity is per daemon: each
daemon's step commits or rolls back as a whole, but one daemon's failure
does not undo another's commit; every part reports its own outcome.
"""

import concurrent.futures
import dataclasses

from .client import Client, seq_id

_MASK = (1 << 64) - 1
_FNV_OFFSET = 0xcbf29ce484222325
_FNV_PRIME = 0x100000001b3


def _fnv1a(h, data):
    for b in data:
        h = ((h ^ b) * _FNV_PRIME) & _MASK
    return h


def _mix(z):
    z = ((z ^ (z >> 30)) * 0xbf58476d1ce4e5b9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94d049bb133111eb) & _MASK
    return z ^ (z >> 31)


def _key(sequence):
    sid = seq_id(sequence)
    if sid.WhichOneof("id") == "num":
        return b"#" + str(sid.num).encode()
    return b"$" + sid.name.encode()


def rendezvous_weight(daemon, sequence):
    """The weight of daemon (its address string) for a sequence id: FNV-1a
    over the address, a 0 byte and the id's key ("#<num>" or "$<name>"),
    then the splitmix64 finalizer."""
    h = _fnv1a(_fnv1a(_FNV_OFFSET, daemon.encode()), b"\0")
    return _mix(_fnv1a(h, _key(sequence)))


def pick_daemon(daemons, sequence):
    """Index in daemons of the one owning sequence: the highest weight, ties
    to the lower index."""
    if not daemons:
        raise ValueError("daemons: expected at least one address")
    best, best_w = 0, -1
    for i, d in enumerate(daemons):
        w = rendezvous_weight(d, sequence)
        if w > best_w:
            best, best_w = i, w
    return best


@dataclasses.dataclass
class Part:
    """One daemon's share of a routed step.

    daemon: index of the daemon; sequences: indices into the batch (batch
    order; its rows are theirs, in that order); error: None when committed,
    else the exception (the part was rolled back); results: the LayerResult
    of each layer run; committed: lengths after the step, in `sequences`
    order.
    """
    daemon: int
    sequences: list
    error: object = None
    results: list = dataclasses.field(default_factory=list)
    committed: list = None


class RoutedClient:
    """Clients of several daemons, sequences routed by id.

    addresses: "host:port" strings (e.g. a StatefulSet's stable names);
    client_kwargs go to each Client (client_id, TLS, timeouts).
    """

    def __init__(self, addresses, **client_kwargs):
        addresses = list(addresses)
        if not addresses:
            raise ValueError("addresses: expected at least one daemon address")
        for i, a in enumerate(addresses):
            if addresses.index(a) != i:
                raise ValueError(f"addresses[{i}]: {a!r} is listed twice; expected each daemon once")
        self.addresses = addresses
        self.clients = [Client(a, **client_kwargs) for a in addresses]

    def close(self):
        for c in self.clients:
            c.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def daemon_for(self, sequence):
        return pick_daemon(self.addresses, sequence)

    def step(self, sequences, layers, build, request_id=""):
        """One step over sequences = [(id, q_len[, create]), ...] spread over
        the daemons: a step per daemon over its sequences, every layer of
        `layers` in order, each request's keyword arguments (k, q, weights,
        q_scale, k_dtype, q_dtype, topk_out: as StepSession.run_layer) from
        build(daemon, sequence_indices, layer), then commit. build runs on
        the parts' threads, concurrently. Returns the Parts in daemon order.
        """
        groups = {}
        for i, s in enumerate(sequences):
            groups.setdefault(self.daemon_for(s[0]), []).append(i)
        parts = [Part(daemon=d, sequences=idx) for d, idx in sorted(groups.items())]

        def run(part):
            try:
                sub = [sequences[i] for i in part.sequences]
                with self.clients[part.daemon].step(sub, request_id=request_id) as s:
                    for layer in layers:
                        part.results.append(
                            s.run_layer(layer, **build(part.daemon, part.sequences, layer)))
                    part.committed = s.commit()
            except Exception as e:  # reported per part: the others stand
                part.error = e
            return part

        if len(parts) == 1:
            return [run(parts[0])]
        with concurrent.futures.ThreadPoolExecutor(max_workers=len(parts)) as pool:
            return list(pool.map(run, parts))

    def release(self, ids):
        """Releases each id on its daemon; returns the pages released."""
        by_daemon = {}
        for i in ids:
            by_daemon.setdefault(self.daemon_for(i), []).append(i)
        return sum(self.clients[d].release(group) for d, group in sorted(by_daemon.items()))
