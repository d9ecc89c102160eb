"""Child processes that must not outlive the process that started them."""

from __future__ import annotations

import ctypes
import os
import signal

_PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Called first thing in a child: the kernel sends it `sig` when its parent dies, however it
    dies (SIGKILL, the OOM killer), so no orphan keeps memory or a port. Linux only; elsewhere a
    no-op. The parent's thread that started the child must live as long as the parent (the
    kernel watches that thread): the event loop's, or the main thread."""
    parent = os.getppid()
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, sig)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died before the call: nobody would send it
        os.kill(os.getpid(), sig)
