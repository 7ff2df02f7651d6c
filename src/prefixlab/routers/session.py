"""``session``: sticky by session id. A session's requests all go to the replica a hash of
its id picks (consistent, so any number of router instances agree: SGLang router's
``consistent_hashing`` on a session key, llm-d's session affinity); a request without a
session is hashed by its index."""

from __future__ import annotations

from prefixlab.routers.base import SeededRouter, register, stable_hash


@register("session")
class Session(SeededRouter):
    """Sticky by session id: the replica a hash of the id picks."""

    depends_on = "request"

    def route(self, r: int, now: float) -> int:
        sid = self.fleet.trace.session_id[r]
        key = sid if sid is not None else f"#request{r}"
        return stable_hash(key, self.seed) % self.fleet.replicas
