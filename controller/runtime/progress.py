"""What a call in progress is waiting for, per job, for clients that follow it."""

from __future__ import annotations


class Progress:
    """The last thing each job's reserve, apply or repair said it waits for."""

    def __init__(self) -> None:
        self._messages: dict[str, str] = {}

    def say(self, job: str, message: str) -> None:
        self._messages[job] = message

    def clear(self, job: str) -> None:
        self._messages.pop(job, None)

    def of(self, job: str) -> str:
        return self._messages.get(job, "")
