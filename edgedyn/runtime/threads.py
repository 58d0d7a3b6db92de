"""Per-thread state for executors whose runtime objects must not be shared between threads.

A portable arena and a TVM VM each hold the tensors of the call in flight: two threads calling one of them at once
overwrite each other's intermediates (wrong answers from the portable executor, TVM type errors and crashes).
`PerThread` builds one per calling thread, on that thread's first call, and keeps the one the loading thread
built at load time, so a damaged bundle still fails in `load()`, not in the first call.
Standard library only, Python 3.8 syntax.
"""
import threading
from typing import Callable, Generic, TypeVar

State = TypeVar("State")


class PerThread(Generic[State]):
    """`get()` returns this thread's state, built by `factory()` the first time this thread asks."""

    def __init__(self, factory: Callable[[], State]) -> None:
        self._factory = factory
        self._local = threading.local()
        self.get()  # the loading thread's state: building it is what checks the artifact

    def get(self) -> State:
        try:
            return self._local.state
        except AttributeError:
            # Note: threading.local drops a thread's state when the thread ends, so a pool that recycles threads
            # holds at most one state per live thread.
            self._local.state = self._factory()
            return self._local.state
