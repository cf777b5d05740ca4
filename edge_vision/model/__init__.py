"""The model's contract, below the engines and the frame path that both use it.

What a model takes (:mod:`.spec`: the ONNX file, its input limits, normalisation and
fit; :mod:`.shape`: the per-frame input size and the letterbox) and what it gives
(:mod:`.heads`: every model head's raw outputs → ``(N, 6)`` detections in frame pixels).
"""
