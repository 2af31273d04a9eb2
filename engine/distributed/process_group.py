"""The tensor-parallel process group: rendezvous, backends, and the few collectives used.

Every rank meets at a TCP store: rank 0 hosts it on a socket it binds itself, to
loopback when every rank runs on this machine, so nothing of the rendezvous listens on
the network; over several machines to the address every node was given
(``dist_init_addr``, see ``Rendezvous.for_node``). Under torchrun the launcher's own
store is joined instead (its RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT, see
``Rendezvous.from_torchrun_env``). Two groups are made
on it, not registered with torch.distributed's global state (so several engines can
live in one process, one after another):

- the device group carries the model's collectives and the step's tensors: NCCL on
  CUDA, gloo on the CPU. Its timeout bounds how long a step may wait for a silent rank.
- the command group, always gloo on the CPU, carries the small header that tells the
  other ranks what comes next. Workers wait on it between steps for as long as the
  server is idle, so its timeout is long; a rank that dies closes its sockets, which
  ends any wait at once.

Only tensors cross between ranks: no pickled object is ever sent or received.
"""

from __future__ import annotations

import ipaddress
import socket
from datetime import timedelta
from typing import Any

import torch
from hetero_infer.engine.distributed.rendezvous import LOOPBACK, Rendezvous
from torch._C._distributed_c10d import (
    AllreduceOptions,
    BroadcastOptions,
    PrefixStore,
    ProcessGroupGloo,
    ReduceOp,
    Store,
    TCPStore,
)

# A step's collectives wait for the slowest rank's share of one layer: seconds at most.
# Past this a rank is taken for hung and the step fails rather than blocking for ever.
STEP_TIMEOUT = timedelta(minutes=5)
# Workers wait for the next step on the command group while the server is idle.
IDLE_TIMEOUT = timedelta(days=365)
# Starting the ranks: loading the model on each one comes after this.
RENDEZVOUS_TIMEOUT = timedelta(minutes=5)


def listen_on(host: str, port: int) -> socket.socket:
    """A listening socket for rank 0 to host the store on: at ``host``'s own address
    (the interface the other nodes reach it by, not every interface), ``port`` 0 for a
    free one. OSError when ``host`` is not this machine's or the port is taken."""
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
    )[0]
    sock = socket.socket(family, kind, proto)
    try:
        # A fixed port (a node's restart) must not wait out the last run's TIME_WAIT.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen()
    except OSError:
        sock.close()
        raise
    return sock


def connect_store(rendezvous: Rendezvous, listening: socket.socket | None = None) -> Store:
    """The rendezvous store: hosted on ``listening`` (rank 0 of the ranks the engine
    starts), which it takes over, or joined at the rendezvous address."""
    if listening is not None:
        host, port = listening.getsockname()[:2]
        store = TCPStore(
            host,  # the store's own client connects here: the address it listens on
            port,
            rendezvous.world_size,
            is_master=True,
            timeout=RENDEZVOUS_TIMEOUT,
            wait_for_workers=False,
            master_listen_fd=listening.fileno(),
        )
        listening.detach()  # the store owns the socket now; Python must not close it
        return store
    is_master = rendezvous.rank == 0 and not rendezvous.launcher_hosts_store
    return TCPStore(
        rendezvous.host,
        rendezvous.port,
        rendezvous.world_size,
        is_master=is_master,
        timeout=RENDEZVOUS_TIMEOUT,
        wait_for_workers=False,
    )


class TensorParallelGroup:
    """This rank's place in the group and the collectives the model and the step use.
    Collectives block until done (the device's stream, on CUDA)."""

    def __init__(self, rendezvous: Rendezvous, store: Store, device: torch.device) -> None:
        self.rank = rendezvous.rank
        self.world_size = rendezvous.world_size
        self.device = device
        bind = _gloo_device(rendezvous)
        self.command_group = _gloo_group(
            PrefixStore("hetero_infer/command", store), rendezvous, bind, IDLE_TIMEOUT
        )
        if device.type == "cuda":
            self.device_group = _nccl_group(PrefixStore("hetero_infer/device", store), rendezvous)
        else:
            self.device_group = _gloo_group(
                PrefixStore("hetero_infer/device", store), rendezvous, bind, STEP_TIMEOUT
            )
        self._store = store  # the groups keep using it
        self._sum = _reduce_options(ReduceOp.SUM)  # made once: all_reduce runs 2 per layer

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum ``x`` over the ranks, in place; every rank gets the same sum."""
        self.device_group.allreduce([x], self._sum).wait()
        return x

    def all_reduce_min(self, value: int) -> int:
        """The smallest of every rank's ``value`` (e.g. KV blocks each rank has room for)."""
        tensor = torch.tensor([value], dtype=torch.long)
        self.command_group.allreduce([tensor], _reduce_options(ReduceOp.MIN)).wait()
        return int(tensor.item())

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        """Every rank's ``x`` side by side along the last dimension, in rank order."""
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(self.world_size)]
        self.device_group.allgather([parts], [x]).wait()
        return torch.cat(parts, dim=-1)

    def broadcast(self, x: torch.Tensor) -> torch.Tensor:
        """Rank 0's ``x`` into every rank's ``x`` (same shape and dtype), on the device."""
        self.device_group.broadcast([x], _from_rank_0()).wait()
        return x

    def broadcast_command(self, x: torch.Tensor) -> torch.Tensor:
        """Rank 0's CPU tensor ``x`` into every rank's: the header of what comes next."""
        self.command_group.broadcast([x], _from_rank_0()).wait()
        return x

    def abort(self) -> None:
        """Break a collective blocked on a rank that is gone (NCCL waits for its timeout
        otherwise; gloo notices the closed connection by itself)."""
        if self.device.type == "cuda":
            self.device_group.abort()


def _reduce_options(op: ReduceOp) -> AllreduceOptions:
    opts = AllreduceOptions()
    opts.reduceOp = op
    return opts


def _from_rank_0() -> BroadcastOptions:
    opts = BroadcastOptions()
    opts.rootRank = 0
    opts.rootTensor = 0
    return opts


def _gloo_device(rendezvous: Rendezvous) -> ProcessGroupGloo.Device:
    """Where gloo's connections bind: the interface GLOO_SOCKET_IFNAME names, if set;
    else the address this machine reaches the rendezvous host from (loopback when the
    ranks meet there, all on this machine; across machines the interface the route to
    node 0 leaves by, which the other machines reach too). Gloo's own default, the
    address the machine's host name resolves to, is 127.0.1.1 on many systems."""
    if rendezvous.gloo_interface:
        return ProcessGroupGloo.create_device(interface=rendezvous.gloo_interface)
    address = _address_towards(rendezvous.host, rendezvous.port)
    if address is None:
        return ProcessGroupGloo.create_default_device()
    if ipaddress.ip_address(address).is_loopback:
        address = LOOPBACK
    return ProcessGroupGloo.create_device(hostname=address)


def _address_towards(host: str, port: int) -> str | None:
    """This machine's address on the route to ``host`` (None if it does not resolve
    or no route leads there). Connecting a UDP socket sends nothing: it only picks
    the route and so the source address."""
    try:
        family, _, _, _, address = socket.getaddrinfo(host, port or 1, type=socket.SOCK_DGRAM)[0]
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect(address)
            return probe.getsockname()[0]
    except OSError:
        return None


def _gloo_group(
    store: Store, rendezvous: Rendezvous, bind: ProcessGroupGloo.Device, timeout: timedelta
) -> ProcessGroupGloo:
    options = ProcessGroupGloo._Options()
    options._devices = [bind]
    options._timeout = timeout
    return ProcessGroupGloo(store, rendezvous.rank, rendezvous.world_size, options)


def _nccl_group(store: Store, rendezvous: Rendezvous) -> Any:
    """NCCL's group (a ProcessGroupNCCL: only CUDA builds of torch have the class)."""
    from torch._C._distributed_c10d import ProcessGroupNCCL

    options = ProcessGroupNCCL.Options()
    options._timeout = STEP_TIMEOUT
    return ProcessGroupNCCL(store, rendezvous.rank, rendezvous.world_size, options)
