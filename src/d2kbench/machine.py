"""Which running machine recorded something: the identity under which a process id means
something.

Hostnames repeat across machines (device machines and CI containers are often all called ``vm``),
so a pid recorded with the hostname alone may name an unrelated process of another machine after
a store is merged. The boot id (``/proc/sys/kernel/random/boot_id``) is drawn afresh at every
boot: a pid recorded under ``hostname/boot id`` names a process of this kernel instance, and
checking or killing it is only done when :func:`host_id` matches.
"""

from __future__ import annotations

import socket
from functools import cache
from pathlib import Path

#: The Linux kernel's random id of the current boot.
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


@cache
def host_id() -> str:
    """``"<hostname>/<first 8 hex digits of the boot id>"``; the hostname alone where the boot id
    cannot be read (not Linux)."""
    name = socket.gethostname()
    try:
        boot = BOOT_ID.read_text().strip().replace("-", "")[:8]
    except OSError:
        return name
    return f"{name}/{boot}" if boot else name
