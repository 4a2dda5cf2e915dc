"""The scripted OpenAI-compatible server that other tests rely on."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from tests.support.scripted_openai import ScriptedOpenAIServer, ScriptedReply, echo_last_user


def test_models_queue_default_and_records() -> None:
    with ScriptedOpenAIServer(
        [ScriptedReply(content="first"), ScriptedReply(body="not json", status=200)],
        default=echo_last_user,
        model_ids=["m1"],
    ) as srv:
        assert srv.base_url.startswith("http://127.0.0.1:")
        models = httpx.get(f"{srv.base_url}/models").json()
        assert [m["id"] for m in models["data"]] == ["m1"]

        body = {"model": "m1", "messages": [{"role": "user", "content": "echo me"}]}
        first = httpx.post(f"{srv.base_url}/chat/completions", json=body).json()
        assert first["choices"][0]["message"]["content"] == "first"
        assert first["usage"] == {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}
        assert httpx.post(f"{srv.base_url}/chat/completions", json=body).text == "not json"
        # Queue empty: the default echoes; the path without /v1 works too.
        root = srv.base_url.removesuffix("/v1")
        echoed = httpx.post(f"{root}/chat/completions", json=body).json()
        assert echoed["choices"][0]["message"]["content"] == "echo me"

        tagged = httpx.post(f"{srv.base_url}/chat/completions", json=body, headers={"X-A": "1"})
        assert tagged.status_code == 200
        srv.enqueue(ScriptedReply(status=503, content="down", headers={"Retry-After": "2"}))
        down = httpx.post(f"{srv.base_url}/chat/completions", json=body)
        assert down.status_code == 503
        assert down.headers["retry-after"] == "2"
        assert down.json()["error"]["message"] == "down"

        assert [r.method for r in srv.requests] == ["GET", "POST", "POST", "POST", "POST", "POST"]
        assert len(srv.chat_requests) == 5
        assert srv.chat_requests[0].json == body
        assert srv.chat_requests[3].headers["x-a"] == "1"


def test_stop_wakes_delayed_handlers_and_joins_threads() -> None:
    before = set(threading.enumerate())
    srv = ScriptedOpenAIServer([ScriptedReply(delay_s=60)]).start()
    url = srv.base_url
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{url}/chat/completions", json={"messages": []}, timeout=0.3)
    # stop() joins every handler thread: it returns only once the handler sleeping in its
    # 60 s delay has been woken. The 30 s join is a hang guard, not a measurement.
    stopper = threading.Thread(target=srv.stop, name="stop-scripted-server")
    stopper.start()
    stopper.join(timeout=30)
    assert not stopper.is_alive(), "stop() did not wake the handler sleeping in delay_s"
    assert set(threading.enumerate()) - before == set()
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{url}/models", timeout=1)


def test_a_held_reply_waits_for_its_event_and_stop_wakes_it() -> None:
    hold = threading.Event()
    before = set(threading.enumerate())
    srv = ScriptedOpenAIServer(
        [ScriptedReply(content="held", hold=hold), ScriptedReply(hold=threading.Event())]
    ).start()
    url = f"{srv.base_url}/chat/completions"
    answers: list[str] = []

    def ask() -> None:
        reply = httpx.post(url, json={"messages": []}, timeout=30).json()
        answers.append(reply["choices"][0]["message"]["content"])

    first = threading.Thread(target=ask, name="held-request")
    first.start()
    for _ in range(600):  # bounded: the request reaches the server and waits there
        if srv.holding == 1:
            break
        time.sleep(0.05)
    assert srv.holding == 1 and answers == [] and len(srv.chat_requests) == 1
    hold.set()
    first.join(timeout=30)
    assert answers == ["held"] and srv.holding == 0
    # A reply whose event is never set: stop() wakes its handler, which drops the connection.
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(url, json={"messages": []}, timeout=0.3)
    assert srv.holding == 1
    stopper = threading.Thread(target=srv.stop, name="stop-scripted-server")
    stopper.start()
    stopper.join(timeout=30)
    assert not stopper.is_alive(), "stop() did not wake the handler waiting on its hold"
    assert srv.holding == 0
    assert set(threading.enumerate()) - before == set()
