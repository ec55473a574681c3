"""Verifier adapters: the Hugging Face target (:mod:`.hf`; its static key/value cache in
:mod:`.hf_cache`, its row-stable GEMM in :mod:`.hf_gemm`, loading and checking a transformers
model in :mod:`.hf_model`) and the embedded default SmolLM2 target (:mod:`.smollm2`).

Importing this package does not import ``transformers`` (the optional extra ``hf``); the adapters
import it when a model is built.
"""
