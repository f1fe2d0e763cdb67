"""The official ``openai`` Python client against the server: what its typed models parse is what an
OpenAI-compatible server must send (completions, chat, streaming with usage, logprobs, errors)."""

from __future__ import annotations

import pytest

from .test_http import server  # noqa: F401  (the module's running server fixture)
from .test_scheduler import recompute

openai = pytest.importorskip("openai")


@pytest.fixture(scope="module")
def client(server):  # noqa: F811
    s = server("qwen3")
    return s, openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0)  # its connection stays open


def test_models_and_completions(client, model):
    s, c = client
    assert [m.id for m in c.models.list().data] == [s.model_name]
    ids = s.text.encode("Hello there")
    r = c.completions.create(model=s.model_name, prompt="Hello there", max_tokens=5, temperature=0, logprobs=2,
                             extra_body={"ignore_eos": True})
    assert r.choices[0].text == s.text.decode(recompute(model("qwen3"), ids, 5))
    assert len(r.choices[0].logprobs.tokens) == 5 and len(r.choices[0].logprobs.top_logprobs[0]) == 2
    assert r.usage.completion_tokens == 5 and r.usage.prompt_tokens == len(ids)


def test_streams_parse_and_add_up(client):
    s, c = client
    kw = dict(model=s.model_name, max_tokens=6, temperature=0, extra_body={"ignore_eos": True})
    whole = c.completions.create(prompt="Once", **kw).choices[0].text
    chunks = list(c.completions.create(prompt="Once", stream=True, stream_options={"include_usage": True}, **kw))
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == whole
    assert chunks[-1].usage.completion_tokens == 6
    msgs = [{"role": "user", "content": "Hi"}]
    reply = c.chat.completions.create(messages=msgs, logprobs=True, top_logprobs=1, **kw).choices[0]
    assert reply.message.role == "assistant" and len(reply.logprobs.content) == 6
    parts = [ch.choices[0].delta.content or "" for ch in c.chat.completions.create(messages=msgs, stream=True, **kw) if ch.choices]
    assert "".join(parts) == reply.message.content


def test_errors_raise_the_clients_exceptions(client):
    s, c = client
    with pytest.raises(openai.BadRequestError, match="temperature"):
        c.completions.create(model=s.model_name, prompt="x", temperature=5)
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        c.completions.create(model="another-model", prompt="x")


def test_the_client_sends_its_api_key(client):
    s, _ = client
    s.api_key = "k-123"
    try:
        c = openai.OpenAI(base_url=s.url + "/v1", api_key="k-123", max_retries=0)
        assert c.models.list().data[0].id == s.model_name
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=s.url + "/v1", api_key="wrong", max_retries=0).models.list()
        c.close()
    finally:
        s.api_key = None
