"""Drafter training: the reproducible prompt recipe, target-response distillation data and the
DeepSpec-style objective. Sits beside ``cli`` at the top of the layer graph (imports every layer).
"""
