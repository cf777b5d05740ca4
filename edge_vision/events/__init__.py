"""Events: what the inspection saw, told to other systems (docs/events.md).

* :mod:`.geometry`: zones (polygons), lines and a detection's anchor point, in fractions
  of the frame. Pure.
* :mod:`.rules`: a rule's filters and its kinds (``appear``, ``leave``, ``cross``,
  ``dwell``, ``every``), each a pure function over one track's history. Pure.
* :mod:`.session_rules`: one session's rules over its tracks, frame by frame, with the
  memory a resume carries on (the session record). Pure.
* :mod:`.event`: an event as JSON, for the WebSocket and the sinks.

The part sits above the session layer (it reads the frame path's results and the
session's settings) and below the shell (edge_vision.serve), which feeds it answered
frames in frame order and sends what it raises.
"""
