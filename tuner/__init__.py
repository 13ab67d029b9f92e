"""spec-tuner: measure and tune speculative decoding for vLLM."""

import logging

__version__ = "0.1.0"


class _VllmLinesToDebug(logging.Handler):
    """vLLM logs a few lines while it is imported (the CPU build: "Triton is installed, but
    doesn't include CPU backend. Disabling Triton."), before anything configures its logging,
    so Python's last-resort handler would print them on stderr: a second line beside a
    command's one-line error, or among its results. In tuner's own process (spaces checked
    against vLLM's config, its argument parser, its proposers replayed) they are debug lines,
    shown by `tuner -v`; engines write theirs to their own logs. Once vLLM configures its own
    logging, its handler replaces this one."""

    def emit(self, record: logging.LogRecord) -> None:
        logging.getLogger("tuner.vllm").debug("vLLM: %s", record.getMessage())


logging.getLogger("vllm").addHandler(_VllmLinesToDebug())
