"""What an error says, in one line: the product quotes other libraries' errors (TVM, ONNX Runtime, a
vendor's SDK) inside its own, and those put the cause on their message's last line, after a
traceback or context of their own."""

from __future__ import annotations


def last_line(error: BaseException | str, default: str | None = None) -> str:
    """The last non-empty line of ``error``'s message; else ``default``, else the error's type name."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    if lines:
        return lines[-1]
    if default is not None:
        return default
    return type(error).__name__ if isinstance(error, BaseException) else ""


def with_type(error: BaseException) -> str:
    """``"TypeName: last line"``: an error told across a process boundary, where its type is lost."""
    return f"{type(error).__name__}: {last_line(error, '')}"
