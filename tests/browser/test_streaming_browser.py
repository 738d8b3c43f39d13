"""In headless Chromium: a page shows a streaming step's tokens as they are stored, through the
Server-Sent Events endpoint and the browser's own ``EventSource`` (as a chat UI would)."""

from __future__ import annotations

import json

from tests.browser.test_admin_browser import log_in

#: A chat-like page: every chunk event appends its token, with when it arrived.
CHAT = """(url) => {
  document.body.innerHTML = '<main id="chat"><p id="answer"></p><p id="state">open</p></main>';
  window.arrivals = [];
  const source = new EventSource(url);
  source.addEventListener('chunk', (event) => {
    document.getElementById('answer').textContent += JSON.parse(event.data);
    window.arrivals.push({id: event.lastEventId, at: performance.now()});
  });
  source.addEventListener('end', (event) => {
    document.getElementById('state').textContent = 'ended ' + JSON.parse(event.data).status;
    source.close();
  });
}"""


def test_tokens_arrive_live_in_the_browser_then_the_stream_ends(site, page):
    run_id = int(site.shell(
        "import queuety\n"
        "from tests import streaming_steps as s\n"
        "print(queuety.workflow('browser_chat').wait_for_signal('go').then(s.Tokens)"
        ".dispatch({'token': 'browser', 'n': 12, 'pause': 0.4}))").strip().splitlines()[-1])
    log_in(page, site, "/admin/")
    # Opened before the step starts: the stream waits for it.
    page.evaluate(CHAT, f"/queuety/api/runs/{run_id}/steps/Tokens/chunks/stream/")
    site.shell(f"import queuety; queuety.signal({run_id}, 'go')")

    # Part of the answer is on the page while the step is still streaming the rest.
    page.wait_for_function("document.getElementById('answer').textContent.includes('t2 ')",
                           timeout=30_000)
    partial = page.inner_text("#answer")
    assert "t11" not in partial and page.inner_text("#state") == "open"

    page.wait_for_function("document.getElementById('state').textContent.startsWith('ended')",
                           timeout=30_000)
    assert page.inner_text("#state") == "ended completed"
    assert page.inner_text("#answer") == "".join(f"t{i} " for i in range(12)).strip()
    arrivals = page.evaluate("window.arrivals")
    assert [a["id"] for a in arrivals] == [str(i) for i in range(12)]
    # Paced 0.4 s apart by the step: they came over seconds, not in one burst at the end.
    assert arrivals[-1]["at"] - arrivals[0]["at"] > 2500, json.dumps(arrivals)
