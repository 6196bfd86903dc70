"""The very code a lesson teaches, shown in the notebook as a code block
(read from the running package, so it cannot drift from what the cells run)."""

from __future__ import annotations

import inspect
from typing import Any


def source(*objects: Any) -> Any:
    """These functions' or classes' source, one Python code block."""
    from IPython.display import Markdown

    code = "\n\n".join(inspect.getsource(o).rstrip() for o in objects)
    return Markdown(f"```python\n{code}\n```")
