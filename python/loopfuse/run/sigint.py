"""SIGINT held while a driver binds a result that a donation made the only copy of the state (`SigintHold`)."""
import _signal    # `signal`'s own functions, without its enum conversions (7 us of every run, a handler set and reset)
import contextlib
import os
import signal
import sys
import threading


class SigintHold:
    """SIGINT held inside ``with`` blocks of it and delivered at their end; outside them, as before (a
    driver enters one per chunk: a plain context manager, as cheap as two attribute writes).

    Installed for the whole run (in the main thread, which alone receives signals, and only over a
    Python-level handler): a signal outside a block goes straight to the handler that was installed. Where
    CPython drops what that handler raises (a KeyboardInterrupt raised inside a gc callback, as jax's, or a
    finalizer: it goes to `sys.unraisablehook`), the signal is sent again, to land once that code returns; one
    that lands while it is being sent again is held like one inside a block, delivered at the next block's end
    or when the run ends.
    """

    def __init__(self):
        self.holding, self.pending, self.previous, self.unraisable = False, False, None, None
        self.resending = False

    def install(self) -> None:
        if threading.current_thread() is threading.main_thread() and _signal.getsignal(signal.SIGINT) is not None:
            self.previous = _signal.signal(signal.SIGINT, self._handle)
            self.unraisable, sys.unraisablehook = sys.unraisablehook, self._dropped

    def restore(self) -> None:
        if self.previous is not None:
            _signal.signal(signal.SIGINT, self.previous)
            sys.unraisablehook = self.unraisable
        if self.pending:
            self._deliver(None)

    def _dropped(self, info) -> None:
        if info.exc_type is not None and issubclass(info.exc_type, KeyboardInterrupt):
            self.resending = True       # a signal now would be raised inside this hook, and dropped again
            try:
                threading.Timer(0.001, os.kill, (os.getpid(), signal.SIGINT)).start()
            finally:
                self.resending = False
        else:
            self.unraisable(info)

    def _handle(self, signum, frame):
        if self.holding or self.resending:
            self.pending = True
        else:
            self._deliver(frame)

    def _deliver(self, frame):
        self.pending = False
        if callable(self.previous):
            self.previous(signal.SIGINT, frame)
        elif self.previous == signal.SIG_DFL:  # the default action: the process ends
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            signal.raise_signal(signal.SIGINT)

    @contextlib.contextmanager
    def ignored(self):
        """SIGINT held inside and dropped at the end: a run that a Ctrl-C is stopping already finishes its last
        state and checkpoint whatever more land meanwhile (as the first one asked)."""
        held, self.holding = self.holding, True
        try:
            yield
        finally:
            self.holding, self.pending = held, False

    def __enter__(self) -> "SigintHold":
        self.holding = True
        return self

    def __exit__(self, *exc) -> None:
        self.holding = False
        if self.pending:
            self._deliver(None)
