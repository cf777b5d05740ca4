"""The HTTP/WebSocket shell: the aiohttp app and its endpoints (:mod:`.server`), one
connection's I/O (:mod:`.connection`), worker processes (:mod:`.workers`,
:mod:`.balance`), admission limits and authentication (:mod:`.limits`, :mod:`.auth`)."""
