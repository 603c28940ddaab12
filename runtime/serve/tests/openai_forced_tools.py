"""Constrained outputs through the official `openai` client: forced tool choices, as AgentScope's ReActAgent
sends them, and structured output parsed into a pydantic model.

    python openai_forced_tools.py --base-url http://127.0.0.1:PORT/v1

Sends `tool_choice="required"` and a named choice (whole and streamed) with two tools and checks that the client
parses `tool_calls` whose arguments are JSON objects matching the tools' parameters; then asks
`chat.completions.parse` for a pydantic model (`response_format` `json_schema`, strict) and checks that the client
builds the model from the reply. Prints one JSON object with what it received; any failed check raises (non-zero
exit).
"""

import argparse
import json

import openai
import pydantic

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                "required": ["city", "days"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "generate_response",
            "description": "Finish with a structured answer",
            "parameters": {
                "type": "object",
                "properties": {"answer": {"type": "boolean"}},
                "required": ["answer"],
            },
        },
    },
]


def check(name: str, arguments: str) -> dict:
    args = json.loads(arguments)
    if name == "get_weather":
        assert set(args) == {"city", "days"} and isinstance(args["city"], str), args
        assert isinstance(args["days"], int), args
    else:
        assert name == "generate_response", name
        assert set(args) == {"answer"} and isinstance(args["answer"], bool), args
    return {"name": name, "arguments": args}


class Forecast(pydantic.BaseModel):
    city: str
    days: int
    sunny: bool


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--base-url", required=True)
    args = parser.parse_args()
    client = openai.OpenAI(base_url=args.base_url, api_key="unused", timeout=120, max_retries=0)
    [model] = [m.id for m in client.models.list().data]
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    out = {}

    required = client.chat.completions.create(
        model=model, messages=messages, tools=TOOLS, tool_choice="required", n=2, seed=1, max_tokens=3000
    )
    calls = []
    for choice in required.choices:
        assert choice.finish_reason == "stop", choice
        assert choice.message.tool_calls, choice
        calls += [check(c.function.name, c.function.arguments) for c in choice.message.tool_calls]
    out["required"] = calls

    named = client.chat.completions.create(
        model=model,
        messages=messages,
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "generate_response"}},
        seed=2,
        max_tokens=3000,
    )
    [call] = named.choices[0].message.tool_calls
    out["named"] = check(call.function.name, call.function.arguments)

    stream = client.chat.completions.create(
        model=model, messages=messages, tools=TOOLS, tool_choice="required", seed=3, max_tokens=3000, stream=True
    )
    streamed, finish = {}, None
    for chunk in stream:
        for choice in chunk.choices:
            for delta in choice.delta.tool_calls or []:
                entry = streamed.setdefault(delta.index, {"name": "", "arguments": ""})
                entry["name"] += delta.function.name or ""
                entry["arguments"] += delta.function.arguments or ""
            finish = choice.finish_reason or finish
    assert finish == "tool_calls", finish
    assert streamed, "no streamed calls"
    out["streamed"] = [check(c["name"], c["arguments"]) for _, c in sorted(streamed.items())]

    # Older clients keep `parse` under `beta`.
    parse = getattr(client.chat.completions, "parse", None) or client.beta.chat.completions.parse
    parsed = parse(model=model, messages=messages, response_format=Forecast, seed=4, max_tokens=3000)
    forecast = parsed.choices[0].message.parsed
    assert isinstance(forecast, Forecast), parsed
    out["parsed"] = forecast.model_dump()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
