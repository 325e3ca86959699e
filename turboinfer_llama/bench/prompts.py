"""The built-in prompt set: short and long, chatty and factual, so stall patterns vary."""

from __future__ import annotations

import json
from pathlib import Path

BUILTIN_PROMPTS: tuple[str, ...] = (
    "Explain in two sentences why the sky is blue.",
    "Write a haiku about a lighthouse in winter.",
    "List three practical tips for saving battery on a smartphone.",
    "Translate to French: The train leaves at seven tomorrow morning.",
)


class PromptsError(ValueError):
    """The prompts file cannot be used."""


def load_prompts(path: str | Path | None) -> list[str]:
    """Prompts from a file: a JSON list of strings, or one prompt per non-empty line."""
    if path is None:
        return list(BUILTIN_PROMPTS)
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PromptsError(f"prompts file not found: {p}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise PromptsError(f"cannot read prompts file {p}: {e}") from e
    if p.suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise PromptsError(f"{p}: invalid JSON ({e.msg} at line {e.lineno})") from e
        if not isinstance(data, list) or not all(isinstance(x, str) and x.strip() for x in data):
            raise PromptsError(f"{p}: expected a JSON list of non-empty strings")
        prompts = data
    else:
        prompts = [line.strip() for line in text.splitlines() if line.strip()]
    if not prompts:
        raise PromptsError(f"{p}: no prompts in file")
    return prompts
