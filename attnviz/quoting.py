"""What a message quotes from outside attnviz, on one short line: a name a file holds (``short``: a key, a
member of an archive, a file name) and an exception's cause (``reason``: a library's error, its heading
skipped). The standard library only.
"""

from __future__ import annotations

#: how many characters of one key a message shows
KEY_CHARS = 80


def short(text: str, limit: int = KEY_CHARS) -> str:
    """A name from a file as a message shows it: at most ``limit`` characters."""
    text = str(text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def reason(exc: BaseException, limit: int = 160) -> str:
    """An exception's message as one short line for an error message. A first line that ends in a colon is a
    heading whose cause follows (huggingface_hub's "Class validation error for validator 'validate_architecture':",
    torch's "Error(s) in loading state_dict for BertModel:"): the cause is given, the exception it was raised from
    or the heading and the next line, never the heading alone."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = lines[0] if lines else type(exc).__name__
    if text.endswith(":") and exc.__cause__ is not None and exc.__cause__ is not exc:
        cause = reason(exc.__cause__, limit)
        return cause if cause.endswith("...") else cause.removesuffix(".")  # the message closes the sentence
    if text.endswith(":") and len(lines) > 1:
        text = f"{text} {lines[1]}"
    return text if len(text) <= limit else text[: limit - 3] + "..."
