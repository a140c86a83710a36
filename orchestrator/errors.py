"""One error type for everything a user can fix.

Every CLI entry point catches `OrchError` and prints its message on one line with exit
status 2, so bad input never shows a traceback and the message always names the fix.
"""


class OrchError(Exception):
    """A problem the user can fix; the message names the field/file and the fix."""

    exit_code = 2

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(message.split()))
