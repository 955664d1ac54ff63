"""`POST /v1/feedback`: ratings that arrive later, from people, users, verifiers or other teams' graders.

The body is one `Feedback` (schemas.py) as a JSON object, or `{"feedback": [...]}` with up to
MAX_PER_REQUEST of them. Each is decoded strictly (the wire contract: no field outside the schema,
exact types, exactly one of `reward`, `preference`, `label`); the first bad one is a 400 naming its
field, and nothing of the request is published. The team is the caller's key, never a field: the
ratings go to `<ns>.feedback.<team>`, keyed by the (first) rated id, each acknowledged by the
broker before the answer. Stream ops join them with the trajectories they rate (issue 31).

A user's rating of a served completion (`gateway.mode: serve`) may be the short form
`{"completion_id": ID, "rating": R}` (optional `rater`, `comment`): a `Feedback` of `target`
completion, `reward` R, `source` user.
"""
from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from streamrft.producers.gateway.groups import GatewayError
from streamrft.schemas import Feedback, first_error

MAX_PER_REQUEST = 1000


def parse_feedback(body: dict) -> list[Feedback]:
    """The ratings of a request body (a GatewayError 400 naming the first bad field)."""
    batch = set(body) == {"feedback"}
    items: Any = body["feedback"] if batch else [body]
    if not isinstance(items, list) or not 1 <= len(items) <= MAX_PER_REQUEST:
        raise GatewayError(400, f"`feedback` must be a list of 1-{MAX_PER_REQUEST} ratings", param="feedback")
    out = []
    for i, item in enumerate(items):
        at = f"feedback[{i}]." if batch else ""
        if not isinstance(item, dict):
            raise GatewayError(400, "a rating must be a JSON object", param=at.rstrip(".") or None)
        if item.get("kind", "feedback") != "feedback":
            raise GatewayError(400, "`kind` must be 'feedback'", param=f"{at}kind")
        if "completion_id" in item:
            item = _short_form(item, at)
        try:
            out.append(Feedback.model_validate(item, strict=True))
        except ValidationError as e:
            field, problem = first_error(e)
            raise GatewayError(400, problem, param=at + field) from None
    return out


SHORT_FORM = {"completion_id", "rating", "rater", "comment"}


def _short_form(item: dict, at: str) -> dict:
    """`{completion_id, rating[, rater, comment]}` as the `Feedback` it stands for."""
    extra = set(item) - SHORT_FORM
    if extra:
        raise GatewayError(400, f"the short form takes {sorted(SHORT_FORM)}; not {sorted(extra)}",
                           param=at + sorted(extra)[0])
    rating = item.get("rating")
    if isinstance(rating, bool) or not isinstance(rating, (int, float)):
        raise GatewayError(400, "`rating` must be a number", param=f"{at}rating")
    return {"target": "completion", "target_id": item["completion_id"], "reward": float(rating), "source": "user",
            "rater": item.get("rater", "user"), **({"comment": item["comment"]} if "comment" in item else {})}
