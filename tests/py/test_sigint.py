"""`SigintHold` delivers a SIGINT that lands while a gc callback runs (jax registers one for every collection)."""
import gc
import os
import signal
import time

import pytest

from loopfuse.run.sigint import SigintHold


def test_a_sigint_inside_a_gc_callback_is_delivered_after_it(sigint_raises):
    """CPython reports and drops an exception raised in a gc callback: a KeyboardInterrupt raised there would be
    lost, and the run it should end would go on to its last step."""
    def callback(phase, info):
        if phase == "start":
            os.kill(os.getpid(), signal.SIGINT)     # handled at one of the next instructions, in this callback
            for _ in range(100):
                pass
    hold = SigintHold()
    hold.install()
    gc.callbacks.append(callback)
    with pytest.raises(KeyboardInterrupt):
        try:
            gc.collect()
            time.sleep(1.0)                          # the signal again, outside the callback
        finally:
            gc.callbacks.remove(callback)
            hold.restore()                           # or here, where it landed while being sent again
