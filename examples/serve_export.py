"""A small recommendation service over an export: top-K for a known user, or for a new one folded in from its items.

    fedrecgel export runs/default --out exports/default --include-user-embeddings --include-seen-items
    pip install fastapi uvicorn
    uvicorn examples.serve_export:app      # EXPORT=exports/default by default

    curl 'localhost:8000/users/7/recommendations?k=5'
    curl -X POST localhost:8000/recommendations -H 'content-type: application/json' -d '{"items": ["12", "40"]}'

A new user's items are folded into a user row against the frozen shared model inside this process
(:func:`fedrecgel_secure.foldin.fold_in`) and are not kept. Item and user ids are the data file's, as ``items.txt``
writes them; a score is the model's logit (higher ranks first). Bad input (an unknown user or item, a bad k) is
HTTP 422 with the library's one-line message.
"""

from __future__ import annotations

import os
from pathlib import Path

from fastapi import FastAPI, HTTPException
from pydantic import BaseModel, Field

from fedrecgel_secure.errors import BadInputError
from fedrecgel_secure.serving import Served, open_served


class NewUser(BaseModel):
    items: list[str] = Field(min_length=1, description="The new user's items, by their ids in the data file.")
    k: int = 10
    exclude: list[str] = []
    candidates: list[str] | None = None


class Recommendation(BaseModel):
    item: str
    score: float  # the model's logit


def create_app(export: Path) -> FastAPI:
    """The service over ``export`` (read once, at start-up)."""
    served: Served = open_served(export)
    app = FastAPI(title="fedrecgel recommendations", description=f"Top-K from {export}")

    def answer(ranked) -> list[Recommendation]:
        return [Recommendation(item=item, score=score) for item, score in ranked]

    @app.get("/users/{user}/recommendations")
    def known_user(user: str, k: int = 10) -> list[Recommendation]:
        try:
            return answer(served.recommend_known(user, k))
        except BadInputError as e:
            raise HTTPException(status_code=422, detail=str(e)) from None

    @app.post("/recommendations")
    def new_user(request: NewUser) -> list[Recommendation]:
        try:
            ranked = served.recommend_new([request.items], request.k, request.exclude, request.candidates)
        except BadInputError as e:
            raise HTTPException(status_code=422, detail=str(e)) from None
        return answer(ranked[0])

    return app


if os.environ.get("EXPORT") or Path("exports/default").is_dir():  # `uvicorn examples.serve_export:app`
    app = create_app(Path(os.environ.get("EXPORT", "exports/default")))
