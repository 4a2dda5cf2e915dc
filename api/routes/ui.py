"""The Keel console (``/ui``): one static page and its script and style, served by the API.

The page holds no data: its script calls this API with the bearer token the person
entered in its settings (browser local storage, never a URL), so the console needs no
authorisation of its own and shows only what the token may read. The files are read
once, at import; there is no build step and nothing is fetched from elsewhere, which the
Content-Security-Policy below also enforces.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import RedirectResponse, Response

from api.errors import ApiError

router = APIRouter(tags=["console"], include_in_schema=False)

UI_DIR = Path(__file__).resolve().parent.parent / "ui"

_ASSETS: dict[str, tuple[str, bytes]] = {
    "console.js": ("text/javascript; charset=utf-8", (UI_DIR / "console.js").read_bytes()),
    "console.css": ("text/css; charset=utf-8", (UI_DIR / "console.css").read_bytes()),
}
_PAGE = (UI_DIR / "index.html").read_bytes()

# Only this origin's own script, style and API; no inline code, no framing.
_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


@router.get("/ui")
async def console_page() -> Response:
    """The console page."""
    return Response(_PAGE, media_type="text/html; charset=utf-8", headers=_HEADERS)


@router.get("/ui/")
async def console_slash() -> RedirectResponse:
    return RedirectResponse("/ui")


@router.get("/ui/assets/{name}")
async def console_asset(name: str) -> Response:
    """The console's script or style."""
    if name not in _ASSETS:
        raise ApiError(404, "not_found", f"no console asset {name!r}")
    media_type, body = _ASSETS[name]
    return Response(body, media_type=media_type, headers=_HEADERS)
