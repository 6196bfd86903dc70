"""What every lesson does besides running SQL: show the code it teaches, and
let the reader predict before PostgreSQL answers.

    teach.source(locks.advisory_lock)           # the function itself, as a code block
    answer = None                                # the reader's prediction, left open
    print(teach.verdict(answer, what_ran))       # "fill in …" until they predict

`source` reads the very function the lesson then calls (`inspect.getsource`),
so the text cannot drift from the code: change the function and the lesson's
checked output changes with it. `verdict` never reveals the answer to a
reader who has not predicted yet; the lesson's reference answer follows in a
cell of its own.
"""

from __future__ import annotations

import inspect
import textwrap
from typing import Any

#: What a reader's prediction holds before they fill it in.
UNANSWERED = (None, ...)


def source_text(*objects: Any) -> str:
    """The source of each object (function, class, method), one Markdown
    code block each, in the order given."""
    blocks = []
    for obj in objects:
        code = textwrap.dedent(inspect.getsource(obj)).rstrip()  # a method: unindented
        blocks.append(f"```python\n{code}\n```")
    return "\n\n".join(blocks)


def source(*objects: Any) -> Any:
    """`source_text` as a rendered Markdown cell output (IPython)."""
    from IPython.display import Markdown

    return Markdown(source_text(*objects))


def verdict(prediction: Any, actual: Any, *, name: str = "answer") -> str:
    """The exercise's answer to the reader: a nudge while `prediction` is
    still open (None or ...), else whether PostgreSQL agreed.

    The nudge does not depend on `actual`, so an exercise left open prints
    the same line on every run (the notebooks are checked as committed)."""
    if any(prediction is blank for blank in UNANSWERED):
        return f"fill in your prediction ({name} = …) and run this cell again"
    if prediction == actual:
        return f"right: PostgreSQL says {actual!r} too"
    return (f"not quite: you said {prediction!r}, PostgreSQL says {actual!r} "
            "(the reference answer below explains why)")
