"""Why the batcher refused or gave up on a request."""


class BatcherError(Exception):
    """Base class: the request got no embedding."""


class Overloaded(BatcherError):
    """The queue is full (requests or tokens); the caller should fall back at once."""


class WouldMissDeadline(Overloaded):
    """Refused without computing: the learned batch cost says the answer would come after the
    request's deadline (at admission, or when its batch was cut)."""


class DeadlineExceeded(BatcherError):
    """The request's deadline passed before its batch started."""


class BatcherClosed(BatcherError):
    """The batcher is shutting down and takes no new work."""


class ModelUnavailable(BatcherError):
    """The model runs in another process that cannot be reached now (starting, restarting, gone)."""


class RemoteError(BatcherError):
    """The remote embedding engine failed the batch (unreachable, erroring, timed out), or its
    circuit breaker is open and nothing was sent."""


class TextTooLong(BatcherError):
    """The text is longer than `max_text_chars`: refused before the tokenizer sees it, so what one
    text costs to tokenize, ahead of everyone else's, is bounded."""
