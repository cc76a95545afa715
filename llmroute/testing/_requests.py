"""What the simulator checks of a request before answering it: a chat, completions or embeddings
body's required fields, what a profile's vendor refuses (unknown fields, a prefix without its
flag), and the reasoning a model that thinks by default streams first.
"""

from __future__ import annotations

import json
from typing import Any

import llmroute.testing._reply as _reply

from ._profile import Profile
from ._wire import error_body


def _validate(req: Any) -> str | None:
    if not isinstance(req, dict):
        return "The request body must be a JSON object."
    if not isinstance(req.get("model"), str) or not req["model"]:
        return "you must provide a model parameter"
    if not isinstance(req.get("messages"), list) or not req["messages"]:
        return "'messages' must be a non-empty array"
    if req.get("n") not in (None, 1):
        return "the simulator supports only n=1"
    for key in ("max_tokens", "max_completion_tokens"):
        value = req.get(key)
        if value is not None and (not isinstance(value, int) or value < 1):
            return f"'{key}' must be a positive integer"
    return None


def _vendor_refusal(profile: Profile, req: dict[str, Any]) -> tuple[int, bytes] | None:
    """The status and body a vendor of this profile answers a request it refuses: a field it
    does not know (Mistral's 422, pydantic's ``extra_forbidden``), or a trailing assistant
    message without the flag that marks a prefix (Mistral's 400)."""
    accepted = profile.accepted_fields
    unknown = [key for key in req if key not in accepted] if accepted else []
    if unknown:
        detail = [
            {
                "type": "extra_forbidden",
                "loc": ["body", key],
                "msg": "Extra inputs are not permitted",
                "input": req[key],
            }
            for key in unknown
        ]
        body = {
            "object": "error",
            "message": {"detail": detail},
            "type": "invalid_request_error",
            "param": None,
            "code": None,
        }
        return 422, json.dumps(body).encode()
    flag = profile.prefix_flag
    last = req["messages"][-1]
    if flag and isinstance(last, dict) and last.get("role") == "assistant" and not last.get(flag):
        message = (
            "Expected last role User or Tool (or Assistant with prefix True) for serving but "
            "got assistant"
        )
        return 400, error_body(message, "invalid_request_error")
    return None


def _reasoning_words(profile: Profile, req: dict[str, Any]) -> tuple[str, ...]:
    """The reasoning a model that thinks by default streams first (none when the request
    turns thinking off as the profile's vendor documents)."""
    if profile.reasoning_tokens <= 0:
        return ()
    off = profile.thinking_off
    if off and all(req.get(key) == value for key, value in off.items()):
        return ()
    seed = _reply.reply_seed("reasoning", req["messages"])
    return _reply.full_reply(seed, profile.reasoning_tokens)


def _validate_other(req: Any, field: str) -> str | None:
    """Check a completions (``prompt``) or embeddings (``input``) request."""
    if not isinstance(req, dict):
        return "The request body must be a JSON object."
    if not isinstance(req.get("model"), str) or not req["model"]:
        return "you must provide a model parameter"
    if req.get(field) is None:
        return f"'{field}' is a required property"
    if req.get("n") not in (None, 1):
        return "the simulator supports only n=1"
    value = req.get("max_tokens")
    if value is not None and (not isinstance(value, int) or value < 1):
        return "'max_tokens' must be a positive integer"
    return None
