"""Hugging Face models built from their configs, never a download, with example inputs sized
from the config: the library behind the command's ``hf:`` models.

``models`` builds a model from a config, ``inputs`` and the family modules (``tasks``,
``images``, ``audio``, ``media``, ``session``, ``parent``) size the inputs a forward takes,
``layers`` cuts a config to N blocks, ``needs`` reads which input a forward missed.
"""
