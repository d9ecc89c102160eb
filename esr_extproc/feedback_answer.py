"""The router's own answer to a score posted to selection's feedback path (router/feedback.py):
authenticated, checked, folded into this process's corrections, recorded (where decision records
are on), acknowledged. Never routed."""

from __future__ import annotations

import json
import logging

from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from esr_extproc import replies
from esr_extproc.records import DecisionRecorder, score_record
from esr_extproc.serving import Serving
from esr_extproc.stream import RequestStream
from filters.builtin import openai_error
from filters.context import ImmediateReply
from router import metrics
from router.feedback import BadFeedback, Issued, parse_feedback
from router.selection import Feedback

log = logging.getLogger(__name__)

MAX_BODY = 4096  # a score is a few dozen bytes
_STATUS = {"unauthorized": 401, "bad_body": 400, "bad_id": 400, "expired": 410, "repeated": 409, "unattributed": 422, "off": 404,
           "too_large": 413, "encoded": 415}


def _refused(kind: str, message: str) -> pb.ProcessingResponse:
    metrics.FEEDBACK.labels(kind).inc()
    log.debug("selection feedback refused", extra={"outcome": kind})
    return replies.immediate(openai_error(_STATUS[kind], message, f"feedback_{kind}"), {}, details="semantic_router_feedback")


def refused_at_headers(stream: RequestStream, feedback, end_of_stream: bool) -> pb.ProcessingResponse | None:
    """A score refused before its body is read: no token, a declared length over MAX_BODY, or no
    body at all; None: read the body (feedback_answer)."""
    if not feedback.authorized(stream.headers.get("authorization", "")):
        return _refused("unauthorized", "Send the feedback token: Authorization: Bearer <token>.")
    if end_of_stream:
        return _refused("bad_body", 'Send {"selection_id": ..., "score": 0..1}.')
    declared = stream.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY:
        return _refused("too_large", f"A feedback body is at most {MAX_BODY} bytes.")
    return None


async def feedback_answer(stream: RequestStream, current: Serving | None,
                          records: DecisionRecorder | None = None) -> pb.ProcessingResponse:
    """The answer to a score whose headers refused_at_headers let through (the token checked there).
    In a pool, the model process takes each request's score once (Feedback.claim): the same id posted
    to two workers at once is accepted by one, refused (409) by the other."""
    feedback = current.engine.feedback if current is not None else None
    if current is None or feedback is None:  # off since the headers (a reload): nothing to fold it into
        return _refused("off", "Selection feedback is not on at this gateway.")
    if stream.encoding is not None:
        return _refused("encoded", "Send feedback uncompressed.")
    if stream.body_bytes > MAX_BODY:
        return _refused("too_large", f"A feedback body is at most {MAX_BODY} bytes.")
    try:
        try:
            body = json.loads(b"".join(stream.body))
        except ValueError:
            raise BadFeedback("bad_body", "the body is not JSON") from None
        selection_id, score = parse_feedback(body)
        issued = feedback.ids.read(selection_id)
        # Answered by the request's deadline, before Envoy's message timeout would pass it on unanswered.
        deadline = stream.started + current.settings.deadline_s
        if feedback.claim is not None and await feedback.claim(issued.key, selection_id, score, deadline) is False:
            raise BadFeedback("repeated", "this selection_id was scored already (at another worker)")
        feedback.take(issued, score)
    except BadFeedback as bad:
        return _refused(bad.kind, f"Feedback refused: {bad}")
    if records is not None:  # beside its request's record: select-fit --records learns from both
        records.record(score_record(issued.key, issued.route, issued.model, issued.selected, score))
    correction = _counted(feedback, issued, "accepted")
    answer = json.dumps({"accepted": True, "route": issued.route, "model": issued.model, "selected": issued.selected,
                         "correction": round(correction, 4)}).encode()
    return replies.immediate(ImmediateReply(200, answer), {}, details="semantic_router_feedback")


def shared_score(feedback: Feedback, selection_id: str, score: float) -> None:
    """A score another worker of the pool accepted (passed on by the model process): folded in here
    too, verified as a posted one is; one already folded (this worker's own, back after a reconnect)
    is dropped."""
    try:
        issued = feedback.fold(selection_id, score)
    except BadFeedback as bad:
        metrics.FEEDBACK.labels(f"shared_{bad.kind}").inc()
        return
    _counted(feedback, issued, "shared")


def _counted(feedback: Feedback, issued: Issued, outcome: str) -> float:
    correction = feedback.book.correction(issued.route, issued.model)
    metrics.CORRECTION.labels(issued.route, issued.model).set(correction)
    metrics.FEEDBACK.labels(outcome).inc()
    return correction
