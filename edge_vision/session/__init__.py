"""The session protocol without I/O: messages in (:mod:`.receive`) and out
(:mod:`.reply`), the version handshake (:mod:`.versions`), the per-connection core
(:mod:`.core`) and the runner that drives it over the frame path (:mod:`.runner`)."""
