"""Quiet torch: the capture, the passes and the backends all call into torch, whose logs and warnings would bury
edgedyn's own explanation of what went wrong. Below every stage, so each can use it without importing another."""
import contextlib
import io
import logging
import os
import warnings
from typing import Iterator


@contextlib.contextmanager
def quiet_torch() -> Iterator[None]:
    """Silences torch.export's own log lines and FutureWarnings (we explain failures ourselves)."""
    if os.environ.get("EDGEDYN_DEBUG"):
        yield
        return
    # torch configures levels on many child loggers, so the parent's level alone does not silence them.
    loggers = [logging.getLogger(n) for n in list(logging.root.manager.loggerDict) if n.split(".")[0] == "torch"]
    levels = [(logger, logger.level) for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL)
    try:
        # torch.export also print()s the partial graph to stderr when it fails.
        with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        for logger, level in levels:
            logger.setLevel(level)
