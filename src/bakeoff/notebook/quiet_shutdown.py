"""The kernel manager bakeoff's notebooks run under: no SIGINT to a kernel that is being shut down.

jupyter_client's ``shutdown_kernel`` interrupts the kernel before it asks it to shut down
(``_async_shutdown_kernel``: interrupt, then ``shutdown_request``), and the interrupt is a
SIGINT to the kernel's whole process group. nbclient shuts the kernel down after the last
cell, so every notebook bakeoff executes ended with a SIGINT nobody sent: a kernel still
inside a message handler then logged ``[IPKernelApp] ERROR | KeyboardInterrupt caught in
kernel`` on bakeoff's terminal in a run nobody interrupted, and anything the notebook had
started in the kernel's group got the SIGINT too. The interrupt only matters for a kernel
busy running code; bakeoff's kernels are idle by then (the notebook ran to its end or
raised), and one that is not is interrupted by :mod:`.kernelrun` itself, then killed.

Imported only where a notebook is executed: jupyter_client comes with the ``report`` extra.
"""

from __future__ import annotations

from jupyter_client.manager import AsyncKernelManager


class QuietShutdownKernelManager(AsyncKernelManager):
    """An ``AsyncKernelManager`` whose shutdown asks the kernel to stop without interrupting it first.

    An explicit ``interrupt_kernel`` (a cell timeout) still interrupts; only the one inside
    ``shutdown_kernel`` is left out. If the kernel does not stop on the request,
    jupyter_client kills it after its shutdown wait, as before.
    """

    async def _async_interrupt_kernel(self) -> None:
        if self.shutting_down:
            return
        await super()._async_interrupt_kernel()
