"""Input errors: a clear one-line message and exit code 2, never a traceback."""


class InputError(Exception):
    """A problem with what the user gave us (a file, a setting, an argument).

    The message is one line naming the file, the field or byte offset, and what was expected.
    """

    exit_code = 2

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split()))
