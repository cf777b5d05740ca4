"""The overlay page against a node with authentication on (docs/security.md): with a token
in the URL fragment it streams and draws boxes; without one it says "not authorised" (the
server's own reason, not a guess); the token leaves the address bar and no log line."""

from __future__ import annotations

import re
from pathlib import Path

from edge_vision.serve import auth

from ..support.browser import SERVER_DOWN_NOISE, LoggedServerProcess, PageOpener, wait_for_hud

SECRET = b"browser-test-secret-" + b"x" * 24
BOXES_SHOWN = "h.state === 'open' && h.boxes >= 2"
REFUSED_401 = re.compile(r"^Failed to load resource: the server responded with a status of 401")


def test_the_page_streams_with_a_token_and_names_a_refusal_without_one(
    open_page: PageOpener, tmp_path: Path, screenshots: Path
) -> None:
    secret = tmp_path / "token.secret"
    secret.write_bytes(SECRET)
    log = tmp_path / "server.log"
    server = LoggedServerProcess(
        "auth.enabled=true", f"auth.token_secret_file={secret}", log_path=log
    ).start()
    token = auth.mint_token(SECRET, "browser", 600, ["stream"])
    try:
        server.wait_ready_blocking()
        page, console = open_page(f"{server.url}/#token={token}")
        hud = wait_for_hud(page, BOXES_SHOWN)
        assert hud.state == "open"
        assert token not in page.evaluate("location.href")  # out of the address bar
        page.screenshot(path=screenshots / "auth-token-streaming.png")
        console.assert_clean()

        bare, bare_console = open_page(server.url + "/")
        with bare_console.expect_server_down((*SERVER_DOWN_NOISE, REFUSED_401)):
            refused = wait_for_hud(bare, "h.state === 'refused'")
        assert "not authorised" in refused.connection_text
        assert "credentials required" in refused.connection_text  # the server's words
        bare_console.assert_clean()
    finally:
        open_page.close_all()
        server.stop()
    assert token not in log.read_text(errors="replace")
