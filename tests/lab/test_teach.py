"""jobqueue.lab.teach: the code a lesson shows, and exercises that wait for the reader."""

from __future__ import annotations

from jobqueue.lab import locks, teach


class _Example:
    def method(self) -> int:
        return 1


def test_source_text_is_the_function_itself() -> None:
    text = teach.source_text(locks.advisory_lock, locks._unlock)
    blocks = text.split("\n\n```python\n")
    assert len(blocks) == 2
    assert text.startswith("```python\n@asynccontextmanager\nasync def advisory_lock(")
    assert "\nasync def _unlock(" in text
    assert text.endswith("return False\n```")
    assert "pg_advisory_unlock" in text  # the very body the lesson then calls


def test_source_text_unindents_a_method() -> None:
    assert teach.source_text(_Example.method) == (
        "```python\ndef method(self) -> int:\n    return 1\n```")


def test_source_renders_as_markdown() -> None:
    shown = teach.source(_Example.method)
    assert shown._repr_markdown_() == teach.source_text(_Example.method)


def test_verdict_waits_for_a_prediction() -> None:
    for blank in (None, ...):
        nudge = teach.verdict(blank, True, name="prediction")
        assert nudge == "fill in your prediction (prediction = …) and run this cell again"
        assert teach.verdict(blank, False, name="prediction") == nudge  # reveals nothing
    assert teach.verdict(True, True).startswith("right")
    wrong = teach.verdict((1, 2, 1), (1, 705_032_704, 1))
    assert wrong.startswith("not quite") and "(1, 705032704, 1)" in wrong
    assert teach.verdict(False, False).startswith("right")  # False is an answer, not a blank
