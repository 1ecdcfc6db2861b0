"""What the trusted parent reads from a sandboxed worker: pickles decoded by an allow-list.

``multiprocessing.Connection.recv`` is ``pickle.loads``, and a pickle can call any importable
function while it is loaded. Solution code in the worker can write frames of its own on the
worker's pipe (its descriptor is on the command line; ``os.write`` raises no audit event), and
it knows the parent's multiprocessing authentication key (the worker needs it to fetch the
shared-memory descriptors of its arguments), so it can also talk to the parent's
``multiprocessing.resource_sharer`` listener, which loads whatever it receives. Either way a
plain ``loads`` would run the solution's code in the unsandboxed evaluator
(``evil/muon_newton_schulz/pipe_pickle.py`` got ``ok`` that way).

So the parent decodes everything a worker sends with :func:`loads`, whose unpickler resolves
only the globals an answer legitimately holds: torch.multiprocessing's tensor and storage
rebuilders (wrapped to check their arguments), the tensor, storage, size, device and dtype
types, NumPy scalars, and ``resource_sharer.DupFd`` restricted to listeners inside the worker's own folder
(a descriptor received that way must be a regular file at least as large as the storage that
maps it: a shorter one would raise SIGBUS in the parent). :func:`harden_resource_sharer`
makes the parent's listener decode its requests (a ``(key, pid)`` pair) with no globals at
all and stop waiting for a client that stalls.

Sources: pickle(3) "Restricting Globals"; multiprocessing/resource_sharer.py and
torch/multiprocessing/reductions.py of the installed versions.
"""

from __future__ import annotations

import io
import os
import pickle
import signal
import socket
import stat
import struct
import sys
import threading

# Imports inside functions: torch loads when the first tensor crosses the channel; the parent's CLI paths stay light.

#: torch.multiprocessing.reductions functions an answer may call (tensors, storages).
REBUILDERS = ("rebuild_tensor", "rebuild_storage_fd", "rebuild_storage_empty", "rebuild_cuda_tensor",
              "rebuild_typed_storage")
#: Builtin types that protocol 4/5 cannot express without naming them.
BUILTINS = {"complex": complex, "bytearray": bytearray, "set": set, "frozenset": frozenset, "slice": slice}
#: NumPy's scalar rebuilder and dtype (numpy 1.x and 2.x module names); arrays stay refused.
NUMPY_SCALARS = {("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"), ("numpy", "dtype")}
#: Seconds the parent's resource-sharer listener waits for a client's handshake and request.
SHARER_TIMEOUT_S = 10.0
#: Largest request (bytes) the parent's resource sharer reads.
_SHARER_MAX_BYTES = 1024


class UntrustedPickle(pickle.UnpicklingError):
    """A worker's frame asked for something outside the allow-list (a global, a persistent id,
    a descriptor from a foreign listener or of the wrong size)."""


def _storage_types():
    import torch

    return (torch.UntypedStorage, torch.TypedStorage)


def _check_cls(cls, allowed: tuple, what: str) -> None:
    if not (isinstance(cls, type) and cls in allowed):
        raise UntrustedPickle(f"{what} is {cls!r}, not one of {[c.__name__ for c in allowed]}")


class _Detached:
    """A descriptor already received, in the shape ``rebuild_storage_fd`` expects."""

    def __init__(self, fd: int):
        self.fd = fd

    def detach(self) -> int:
        return self.fd


def _make_dupfd(fd_dir: str) -> type:
    """``resource_sharer.DupFd`` that connects only to a listener under ``fd_dir``."""
    from multiprocessing.resource_sharer import DupFd

    root = os.path.realpath(fd_dir).rstrip(os.sep) + os.sep

    class CheckedDupFd(DupFd):
        def detach(self) -> int:
            ident = self.__dict__.get("_id")
            if not (isinstance(ident, tuple) and len(ident) == 2 and isinstance(ident[0], str)
                    and type(ident[1]) is int):
                raise UntrustedPickle(f"a descriptor's address is {ident!r}, not (listener path, key)")
            address = ident[0]
            try:
                is_socket = stat.S_ISSOCK(os.stat(address).st_mode)
            except (OSError, ValueError):
                is_socket = False
            if not (os.path.realpath(address).startswith(root) and is_socket):
                raise UntrustedPickle(f"a descriptor is offered by {address!r}, not by a listener in the worker's "
                                      f"folder {root}")
            return super().detach()

    return CheckedDupFd


def _rebuild_storage_fd(cls, df, size):
    from torch.multiprocessing import reductions

    _check_cls(cls, _storage_types(), "a shared storage's type")
    if not (hasattr(df, "detach") and type(df).__name__ == "CheckedDupFd"):
        raise UntrustedPickle(f"a shared storage's descriptor is a {type(df).__name__}, not a DupFd")
    if type(size) is not int or size < 0:
        raise UntrustedPickle(f"a shared storage's size is {size!r}")
    fd = df.detach()
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size < size:
            raise UntrustedPickle(f"a shared storage of {size} bytes comes with a descriptor of "
                                  f"{st.st_size} bytes (mode {st.st_mode:o})")
    except BaseException:
        os.close(fd)
        raise
    return reductions.rebuild_storage_fd(cls, _Detached(fd), size)  # closes fd


def _rebuild_storage_empty(cls):
    from torch.multiprocessing import reductions

    _check_cls(cls, _storage_types(), "an empty storage's type")
    return reductions.rebuild_storage_empty(cls)


def _rebuild_tensor(cls, storage, metadata):
    import torch
    from torch.multiprocessing import reductions

    _check_cls(cls, (torch.Tensor,), "a tensor's type")
    if not isinstance(storage, _storage_types()):
        raise UntrustedPickle(f"a tensor's storage is a {type(storage).__name__}")
    return reductions.rebuild_tensor(cls, storage, metadata)


def _rebuild_typed_storage(storage, dtype):
    import torch
    from torch.multiprocessing import reductions

    if not isinstance(storage, torch.UntypedStorage) or not isinstance(dtype, torch.dtype):
        raise UntrustedPickle("a typed storage of something other than an untyped storage and a dtype")
    return reductions.rebuild_typed_storage(storage, dtype)


def _rebuild_cuda_tensor(tensor_cls, tensor_size, tensor_stride, tensor_offset, storage_cls, dtype, *rest):
    import torch
    from torch.multiprocessing import reductions

    _check_cls(tensor_cls, (torch.Tensor,), "a CUDA tensor's type")
    _check_cls(storage_cls, _storage_types(), "a CUDA tensor's storage type")
    if not isinstance(dtype, torch.dtype):
        raise UntrustedPickle(f"a CUDA tensor's dtype is {dtype!r}")
    return reductions.rebuild_cuda_tensor(tensor_cls, tensor_size, tensor_stride, tensor_offset, storage_cls,
                                          dtype, *rest)


_CHECKED = {"rebuild_tensor": _rebuild_tensor, "rebuild_storage_fd": _rebuild_storage_fd,
            "rebuild_storage_empty": _rebuild_storage_empty, "rebuild_cuda_tensor": _rebuild_cuda_tensor,
            "rebuild_typed_storage": _rebuild_typed_storage}


def _resolve(module: str, name: str, fd_dir: str | None):
    """The object a worker's frame may name as ``module.name``, or None."""
    import torch

    if module == "torch.multiprocessing.reductions" and name in REBUILDERS:
        return _CHECKED[name]
    if module == "multiprocessing.resource_sharer" and name == "DupFd" and fd_dir:
        return _make_dupfd(fd_dir)
    if module in ("torch", "torch._tensor") and name == "Tensor":
        return torch.Tensor
    if module in ("torch", "torch.storage") and name in ("UntypedStorage", "TypedStorage"):
        return getattr(torch, name)
    if module == "torch" and name in ("Size", "device"):
        return getattr(torch, name)
    if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
        return getattr(torch, name)
    if module == "builtins" and name in BUILTINS:
        return BUILTINS[name]
    if (module, name) in NUMPY_SCALARS:  # a NumPy scalar among a graph replay's arguments
        import numpy

        return numpy.dtype if name == "dtype" else getattr(getattr(numpy, module.split(".")[1]).multiarray, name)
    return None


class _Unpickler(pickle.Unpickler):
    def __init__(self, data: bytes, fd_dir: str | None, allow_globals: bool = True):
        super().__init__(io.BytesIO(data))
        self.fd_dir = fd_dir
        self.allow_globals = allow_globals

    def find_class(self, module: str, name: str):
        obj = _resolve(module, name, self.fd_dir) if self.allow_globals else None
        if obj is None:
            raise UntrustedPickle(f"the frame names {module}.{name}, which is not on the parent's allow-list")
        return obj

    def persistent_load(self, pid):
        raise UntrustedPickle(f"the frame holds a persistent id {str(pid)[:60]!r}")


def loads(data: bytes, fd_dir: str | None) -> object:
    """Decode one frame a worker sent: plain data, tensors and storages (shared memory from a
    listener under ``fd_dir``, the worker's folder, or CUDA IPC handles).

    Raises:
        UntrustedPickle: the frame needs anything outside the allow-list.
        Exception: whatever a malformed pickle or a refused storage raises while loading.
    """
    return _Unpickler(bytes(data), fd_dir).load()


def recv(conn, fd_dir: str | None) -> object:
    """:func:`loads` of the next frame on the multiprocessing connection ``conn``."""
    return loads(conn.recv_bytes(), fd_dir)


def _serve(self) -> None:  # pragma: no cover - runs in the resource sharer's thread
    """``multiprocessing.resource_sharer._ResourceSharer._serve`` with requests decoded without
    globals (a ``(key, pid)`` pair of ints, or None to stop) and clients that do not finish their
    handshake and request within :data:`SHARER_TIMEOUT_S` dropped.

    Each worker's request is served in its own thread, so that one client that stalls (a solution
    that connects and sends nothing, or a worker starved of CPU on a loaded machine) cannot hold
    back the other workers of the evaluation, or of concurrent evaluations in this process. The
    stop request comes from this process itself (``_ResourceSharer.stop``), identified by the
    socket's peer PID, which the kernel reports: it is served here and ends the loop."""
    from multiprocessing import util

    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
    while True:
        try:
            raw = self._listener._listener.accept()  # not yet authenticated
            with socket.socket(fileno=os.dup(raw.fileno())) as s:
                peer = struct.unpack("3i", s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[0]  # host pid
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", int(SHARER_TIMEOUT_S), 0))
                s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack("ll", int(SHARER_TIMEOUT_S), 0))
        except Exception as e:  # noqa: BLE001 - a failed accept must not stop the listener
            if util.is_exiting():
                break
            print(f"d2k: resource sharer could not accept a client: {e!r}", file=sys.stderr)
            continue
        if peer == os.getpid():
            if _serve_client(self, raw, peer) == "stop":
                break
        else:
            threading.Thread(target=_serve_client, args=(self, raw, peer), daemon=True,
                             name=f"d2k-resource-sharer-{peer}").start()


def _serve_client(sharer, raw, peer: int) -> str:  # pragma: no cover - runs in a resource-sharer thread
    """Authenticate one client, read its request and send the descriptor it names; ``"stop"``
    for the stop request. A refused request is recorded against the peer PID; no exception
    leaves this function."""
    from multiprocessing import connection, util

    try:
        with raw as conn:
            connection.deliver_challenge(conn, sharer._listener._authkey)
            connection.answer_challenge(conn, sharer._listener._authkey)
            msg = _Unpickler(conn.recv_bytes(_SHARER_MAX_BYTES), None, allow_globals=False).load()
            if msg is None:
                return "stop"
            if not (isinstance(msg, tuple) and len(msg) == 2 and all(type(v) is int for v in msg)):
                raise UntrustedPickle(f"resource request {str(msg)[:60]!r} is not (key, pid)")
            key, destination_pid = msg
            send, close = sharer._cache.pop(key)
            try:
                send(conn, destination_pid)
            finally:
                close()
    except Exception as e:  # noqa: BLE001 - one bad client must not stop the listener
        if util.is_exiting():
            return "served"
        if isinstance(e, UntrustedPickle):
            _record_refusal(peer, f"the parent's resource-sharer listener refused a request: {e}")
        print(f"d2k: resource sharer refused a client (pid {peer}): {e!r}", file=sys.stderr)
    return "served"


_hardened = threading.Lock()
_refusals: list[tuple[int, str]] = []  # (peer pid in this process's PID namespace, evidence)


def _record_refusal(pid: int, evidence: str) -> None:
    with _hardened:
        _refusals.append((pid, evidence))
        del _refusals[:-100]


def refusals_from(pids) -> list[str]:
    """Evidence of requests the resource-sharer listener refused from any of ``pids`` (host PIDs
    of one worker's sandbox), removed from the record."""
    pids = set(pids)
    with _hardened:
        mine = [e for p, e in _refusals if p in pids]
        _refusals[:] = [(p, e) for p, e in _refusals if p not in pids]
    return mine


def harden_resource_sharer() -> None:
    """Make this process's ``multiprocessing.resource_sharer`` listener (the one workers fetch
    their arguments' shared-memory descriptors from) decode requests without globals and drop
    stalled clients. Idempotent; call before the listener starts (the first tensor sent)."""
    from multiprocessing import resource_sharer

    with _hardened:
        resource_sharer._ResourceSharer._serve = _serve  # type: ignore[attr-defined]  # private class, no stub
