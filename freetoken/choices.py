"""The check of a field that takes one of a few names, in a root module without imports (the CLI, the engine and
the server call it without loading torch)."""


def check_one_of(value: str, choices: tuple[str, ...], field: str) -> str:
    """value if it is among choices; else a ValueError naming the field and the choices."""
    if value not in choices:
        raise ValueError(f"{field}: {value!r} is not one of {', '.join(choices)}")
    return value
