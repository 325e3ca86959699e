"""The OpenAI-compatible server: llama-cpp-python's server serving our ``Llama``.

Start it with ``turboinfer serve --model model.gguf`` or
``python -m turboinfer_llama.server --model model.gguf``. Only ``adapter`` touches
llama-cpp-python's server internals.
"""
