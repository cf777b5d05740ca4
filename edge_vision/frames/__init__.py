"""The frame path, in the order a frame travels: decode → batch → infer (and its
supervisor) → post → track → read. :mod:`.pipeline` drives one frame through it."""
