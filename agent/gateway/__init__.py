"""An OpenAI-compatible gateway in front of a trainable engine that records each episode token-exactly.

``Gateway`` (``server``) serves ``/v1/chat/completions`` per session; ``GatewaySession`` (``session``) turns one
episode's requests into rows of prompt / action / observation segments; ``wire`` checks requests, ``replies``
writes the answers, ``routes`` serves them over HTTP.
See docs/gateway.md.
"""

from sao.agent.gateway.server import CloseRequest, Gateway
from sao.agent.gateway.session import EngineCall, GatewayReply, GatewaySession, SessionLimits, SessionRecord
from sao.agent.gateway.wire import ChatRequest, RequestError, parse_request

__all__ = [
    "ChatRequest",
    "CloseRequest",
    "EngineCall",
    "Gateway",
    "GatewayReply",
    "GatewaySession",
    "RequestError",
    "SessionLimits",
    "SessionRecord",
    "parse_request",
]
