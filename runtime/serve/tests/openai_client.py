"""Drives trinity's serve mode with the official `openai` client, as an agent would.

    python openai_client.py --base-url http://127.0.0.1:PORT/v1 [--tools-url http://127.0.0.1:PORT2/v1]

`--base-url` serves one model; `--tools-url` (the base URL when left out) serves a tool model that emits a fixed
`get_weather` call by construction. Each server's model name is the one its /v1/models lists. The n = 2 chat and
the streamed one continue a started assistant reply (`continue_final_message`), so even the tool model samples
them from its spread distribution. The script checks what the client sees, sends rewards to /feedback, commits,
and prints one JSON object on stdout: every response's id with, per choice, the token ids and logprobs the client
received, and the /commit reports (`tools_commit` only for a second server). The Rust tests compare those with
the experiences the server committed. Any failed check raises (non-zero exit).

Used by `runtime/serve`'s tests (two in-process servers) and by `tests/it/serve.rs` (`trinity run` in mode
serve, one server).
"""

import argparse
import json
import urllib.error
import urllib.request

import openai


def post(base_url: str, path: str, body: dict) -> dict:
    root = base_url.rsplit("/v1", 1)[0]
    request = urllib.request.Request(
        root + path, data=json.dumps(body).encode(), headers={"content-type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


def extra(obj, name):
    """A field vLLM adds to OpenAI's objects (kept by the client's models as extra attributes)."""
    value = getattr(obj, name, None)
    if value is None and obj.model_extra:
        value = obj.model_extra.get(name)
    return value


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--tools-url")
    args = parser.parse_args()
    one_server = args.tools_url is None or args.tools_url == args.base_url
    args.tools_url = args.tools_url or args.base_url
    client = openai.OpenAI(base_url=args.base_url, api_key="unused", timeout=60, max_retries=0)
    tools_client = openai.OpenAI(base_url=args.tools_url, api_key="unused", timeout=60, max_retries=0)
    out = {"responses": {}}

    [model] = [m.id for m in client.models.list().data]
    [tools_model] = [m.id for m in tools_client.models.list().data]

    # n = 2 with logprobs, and vLLM's return_token_ids.
    chat = client.chat.completions.create(
        model=model,
        messages=[
            {"role": "system", "content": "You play a game."},
            {"role": "user", "content": "Your move?"},
            {"role": "assistant", "content": "I play"},
        ],
        n=2,
        max_tokens=8,
        seed=7,
        logprobs=True,
        top_logprobs=2,
        extra_body={"return_token_ids": True, "continue_final_message": True, "add_generation_prompt": False},
    )
    assert chat.object == "chat.completion" and len(chat.choices) == 2, chat
    choices = []
    for i, choice in enumerate(chat.choices):
        assert choice.index == i
        token_ids = extra(choice, "token_ids")
        content = choice.logprobs.content
        assert len(content) == len(token_ids) > 0, (content, token_ids)
        assert all(len(entry.top_logprobs) == 2 for entry in content)
        assert choice.finish_reason in ("stop", "length")
        choices.append({"token_ids": token_ids, "logprobs": [entry.logprob for entry in content]})
    assert chat.usage.completion_tokens == sum(len(c["token_ids"]) for c in choices)
    out["responses"][chat.id] = {"prompt_token_ids": extra(chat, "prompt_token_ids"), "choices": choices}

    # A streamed completion: content deltas, per-token logprobs and ids, usage at the end.
    stream = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Tell me a story."}, {"role": "assistant", "content": "Once"}],
        max_tokens=12,
        logprobs=True,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"return_token_ids": True, "continue_final_message": True, "add_generation_prompt": False},
    )
    stream_id, text, token_ids, logprobs, finish, usage = None, "", [], [], None, None
    for chunk in stream:
        assert chunk.object == "chat.completion.chunk"
        stream_id = stream_id or chunk.id
        assert chunk.id == stream_id
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            text += choice.delta.content or ""
            token_ids += extra(choice, "token_ids") or []
            if choice.logprobs is not None and choice.logprobs.content:
                logprobs += [entry.logprob for entry in choice.logprobs.content]
            finish = choice.finish_reason or finish
    assert finish in ("stop", "length"), finish
    assert len(token_ids) == len(logprobs) == usage.completion_tokens > 0, (token_ids, logprobs, usage)
    out["responses"][stream_id] = {"text": text, "choices": [{"token_ids": token_ids, "logprobs": logprobs}]}

    # A legacy completion.
    completion = client.completions.create(model=model, prompt="abc", max_tokens=5, logprobs=1)
    assert len(completion.choices[0].logprobs.token_logprobs) == completion.usage.completion_tokens

    # Errors map to the client's exception classes.
    try:
        client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
        raise AssertionError("an unknown model must fail")
    except openai.NotFoundError as error:
        assert error.status_code == 404 and "gpt-4o" in error.message, error
    try:
        client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "hi"}], extra_body={"max_token": 3}
        )
        raise AssertionError("an unknown argument must fail")
    except openai.BadRequestError as error:
        assert error.status_code == 400 and "max_token" in error.message, error

    # A tool call, parsed from the tool model's output.
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Weather in a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            },
        }
    ]
    call = tools_client.chat.completions.create(
        model=tools_model,
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=tools,
        logprobs=True,
        extra_body={"return_token_ids": True},
    )
    choice = call.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    [tool_call] = choice.message.tool_calls
    assert tool_call.type == "function" and tool_call.function.name == "get_weather", tool_call
    assert json.loads(tool_call.function.arguments) == {"city": "Paris"}, tool_call
    out["responses"][call.id] = {
        "choices": [
            {"token_ids": extra(choice, "token_ids"), "logprobs": [e.logprob for e in choice.logprobs.content]}
        ]
    }
    # The same call streamed: the client sees a tool-call delta.
    streamed_calls = []
    for chunk in tools_client.chat.completions.create(
        model=tools_model, messages=[{"role": "user", "content": "Weather?"}], tools=tools, stream=True
    ):
        for c in chunk.choices:
            streamed_calls += c.delta.tool_calls or []
    assert [c.function.name for c in streamed_calls] == ["get_weather"], streamed_calls

    # Rewards: per choice for the n = 2 response; the stream and the tool call are one task's two runs.
    assert post(args.base_url, "/feedback", {"msg_ids": [f"{chat.id}#0"], "reward": 1.0})["updated"] == 1
    assert post(args.base_url, "/feedback", {"msg_ids": [f"{chat.id}#1"], "reward": 0.0})["updated"] == 1
    post(args.base_url, "/feedback", {"msg_ids": [stream_id], "reward": 0.5, "task_id": "game-1", "run_id": 0})
    post(args.tools_url, "/feedback", {"msg_ids": [call.id], "reward": 1.0, "task_id": "game-1", "run_id": 1})
    try:
        post(args.base_url, "/feedback", {"msg_ids": ["chatcmpl-unknown"], "reward": 1.0})
        raise AssertionError("an unknown id must fail")
    except urllib.error.HTTPError as error:
        assert error.code == 404, error
    out["commit"] = post(args.base_url, "/commit", {})
    if not one_server:
        out["tools_commit"] = post(args.tools_url, "/commit", {})
    print(json.dumps(out))


if __name__ == "__main__":
    main()
