"""Verifier adapters: the Hugging Face target (:mod:`.hf`) and the embedded default SmolLM2
target (:mod:`.smollm2`).

Importing this package does not import ``transformers`` (the optional extra ``hf``); the adapters
import it when a model is built.
"""
