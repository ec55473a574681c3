"""Verifier adapters: the Hugging Face target (:mod:`.hf`), the embedded default SmolLM2 target
(:mod:`.smollm2`), tiny random Hugging Face targets for tests (:mod:`.tiny`) and the pure-torch
:class:`ToyTarget` of the runtime tests (:mod:`.toy`).

Importing this package does not import ``transformers`` (the optional extra ``hf``); the adapters
import it when a model is built.
"""

from draftsmith.runtime.targets.toy import ToyTarget

__all__ = ["ToyTarget"]
