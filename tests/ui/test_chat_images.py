"""Images on the chat page: attached, pasted or dropped, sent as image_url parts.

The test server's tiny model reads text only, so an image is refused with a 400; what
is checked is the request the page sent (the image part ahead of the text), that the
refusal is shown in words, and that an image taken off before sending is not sent.
"""

from __future__ import annotations

import base64
import io
from pathlib import Path
from typing import Any

from PIL import Image

from tests.server.conftest import LiveServer
from tests.ui.test_chat_page import open_chat, send, set_controls, wait_answer

# Builds a File from base64 PNG bytes and fires a paste or drop carrying it, as the
# browser does for a real clipboard image or a file dragged from the desktop.
DISPATCH_FILE = """([kind, b64]) => {
  const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
  const data = new DataTransfer();
  data.items.add(new File([bytes], `${kind}.png`, { type: "image/png" }));
  const init = { bubbles: true, cancelable: true };
  const event = kind === "paste"
    ? new ClipboardEvent("paste", { ...init, clipboardData: data })
    : new DragEvent("drop", { ...init, dataTransfer: data });
  (kind === "paste" ? document.getElementById("prompt") : document.body).dispatchEvent(event);
}"""


def png_bytes(color: tuple[int, int, int]) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (8, 8), color).save(out, format="PNG")
    return out.getvalue()


def data_url(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode()


def attachments_gone(page: Any) -> bool:
    """The composer's thumbnail row is out of the layout, not only empty."""
    return (
        page.evaluate("getComputedStyle(document.getElementById('attachments')).display") == "none"
    )


def test_an_attached_image_goes_before_the_text_and_a_text_only_model_says_no(
    page: Any, ui_server: LiveServer, output_dir: Path
):
    bodies = open_chat(page, ui_server)
    set_controls(page, max_tokens="8")
    png = png_bytes((200, 30, 30))
    page.set_input_files(
        "#image-file", files=[{"name": "red.png", "mimeType": "image/png", "buffer": png}]
    )
    page.locator("#attachments img").wait_for()
    assert page.get_attribute("#attachments img", "src") == data_url(png)

    send(page, "What is in this picture?")
    alert = page.locator(".msg.error[role=alert]")
    alert.wait_for()
    words = alert.text_content()
    assert "Error 400" in words and "this model takes no image input" in words
    assert "remove the image" in words

    assert bodies[-1]["json"]["messages"] == [
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": data_url(png)}},
                {"type": "text", "text": "What is in this picture?"},
            ],
        }
    ]
    # The refused turn comes back to the composer, image and text, to change and resend.
    assert page.locator(".msg.user").count() == 0
    assert page.input_value("#prompt") == "What is in this picture?"
    assert page.get_attribute("#attachments img", "src") == data_url(png)
    page.screenshot(path=str(output_dir / "chat-image.png"))  # for a person to look at


def test_pasted_and_dropped_images_can_be_removed_before_sending(page: Any, ui_server: LiveServer):
    bodies = open_chat(page, ui_server)
    set_controls(page, temperature="0", max_tokens="6")
    pasted, dropped = png_bytes((30, 200, 30)), png_bytes((30, 30, 200))
    page.evaluate(DISPATCH_FILE, ["paste", base64.b64encode(pasted).decode()])
    page.evaluate(DISPATCH_FILE, ["drop", base64.b64encode(dropped).decode()])
    thumbs = page.locator("#attachments img")
    thumbs.nth(1).wait_for()
    assert [thumbs.nth(i).get_attribute("src") for i in range(2)] == [
        data_url(pasted),
        data_url(dropped),
    ]

    page.click("#attachments .remove >> nth=0")
    assert thumbs.count() == 1 and thumbs.get_attribute("src") == data_url(dropped)
    page.click("#attachments .remove")
    assert thumbs.count() == 0 and attachments_gone(page)

    send(page, "No picture after all.")
    assert wait_answer(page)
    assert page.locator(".msg.error").count() == 0
    assert page.locator(".msg.user img").count() == 0
    assert bodies[-1]["json"]["messages"] == [{"role": "user", "content": "No picture after all."}]


def test_a_sent_image_shows_in_the_message(page: Any, ui_server: LiveServer):
    """A vision model's answer, played by the test: the page keeps the image in the turn."""
    answer = 'data: {"choices": [{"index": 0, "delta": {"content": "A dot."}}]}\n\ndata: [DONE]\n\n'
    page.route(
        "**/v1/chat/completions",
        lambda route: route.fulfill(
            status=200, headers={"Content-Type": "text/event-stream"}, body=answer
        ),
    )
    bodies = open_chat(page, ui_server)
    png = png_bytes((120, 120, 0))
    page.set_input_files(
        "#image-file", files=[{"name": "dot.png", "mimeType": "image/png", "buffer": png}]
    )
    page.locator("#attachments img").wait_for()
    send(page, "And this?")
    assert wait_answer(page) == "A dot."
    assert page.get_attribute(".msg.user img", "src") == data_url(png)
    assert attachments_gone(page)
    # The next turn sends the conversation with the image still in its place.
    send(page, "Thanks")
    wait_answer(page)
    messages = bodies[-1]["json"]["messages"]
    assert messages[0]["content"][0] == {"type": "image_url", "image_url": {"url": data_url(png)}}
    assert messages[1:] == [
        {"role": "assistant", "content": "A dot."},
        {"role": "user", "content": "Thanks"},
    ]
