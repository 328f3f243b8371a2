"""Child processes that end with the process that started them."""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


def end_with_parent(parent: int) -> None:
    """Have the kernel SIGKILL this process when ``parent`` dies (Linux only); run in the child.

    A parent killed outright (SIGKILL, the OOM killer) runs no shutdown code: a server's
    workers went on answering on its port, an audit's fold went on training with no audit to
    read it (and a resumed audit could start a second one into the same folder).
    """
    if sys.platform != "linux":
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL) != 0:
        log.warning("prctl(PR_SET_PDEATHSIG) failed (errno %d)", ctypes.get_errno())
    if os.getppid() != parent:  # it died before the line above, so no signal will come
        os._exit(1)
