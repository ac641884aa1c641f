"""Structured output and tool calling through the official `openai` Python client, against a real
`dpserve up --model-path ../shared/models/stories260k --dp-size 2` (the built-in model has no
byte vocabulary to constrain): `response_format` with a JSON Schema (and the client's own
`parse` with a pydantic model), `tools` with a forced `tool_choice`, streamed deltas assembled
as the openai docs show. Every finished output is validated with the `jsonschema` package.
Skips where ../shared is absent.

    python3 -m unittest discover -s tests/python -p 'test_openai_structured.py' -v
"""

import json
import os
import unittest

import jsonschema
import openai
import pydantic

import test_openai as base

STORIES = os.path.join(
    os.environ.get("DPSERVE_TEST_SHARED", os.path.join(base.ROOT, "..", "shared")),
    "models",
    "stories260k",
)
SERVER = {}

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "pets": {"type": "array", "items": {"enum": ["cat", "dog"]}, "maxItems": 2},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 12},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
        },
    },
}
NOW = {"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}}
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]


def setUpModule():
    if not os.path.exists(os.path.join(STORIES, "model.safetensors")):
        raise unittest.SkipTest(f"{STORIES} is absent (../shared beside the checkout)")
    base.start_server(SERVER, ["--model-path", STORIES])
    SERVER["client"] = openai.OpenAI(base_url=SERVER["url"] + "/v1", api_key="unused",
                                     max_retries=0, timeout=120)


def tearDownModule():
    base.stop_server(SERVER)


def client():
    return SERVER["client"]


class Person(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=12)
    age: int = pydantic.Field(ge=0, le=120)


class ResponseFormat(unittest.TestCase):
    def test_json_schema_outputs_validate_streamed_or_not(self):
        fmt = {"type": "json_schema", "json_schema": {"name": "person", "strict": True, "schema": PERSON}}
        r = client().chat.completions.create(model="m", messages=MESSAGES, max_tokens=150,
                                             temperature=1.0, seed=3, n=4, response_format=fmt)
        for choice in r.choices:
            self.assertEqual(choice.finish_reason, "stop", choice)
            jsonschema.validate(json.loads(choice.message.content), PERSON)
        stream = client().chat.completions.create(model="m", messages=MESSAGES, max_tokens=150,
                                                  temperature=0, stream=True, response_format=fmt)
        text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        jsonschema.validate(json.loads(text), PERSON)

    def test_the_client_s_own_parse_with_a_pydantic_model(self):
        parse = getattr(client().chat.completions, "parse", None) or client().beta.chat.completions.parse
        r = parse(model="m", messages=MESSAGES, max_tokens=150, temperature=0, response_format=Person)
        person = r.choices[0].message.parsed
        self.assertIsInstance(person, Person)
        self.assertIsInstance(person.age, int)

    def test_json_object(self):
        r = client().chat.completions.create(model="m", messages=MESSAGES, max_tokens=60, temperature=0,
                                             response_format={"type": "json_object"})
        if r.choices[0].finish_reason == "stop":
            self.assertIsInstance(json.loads(r.choices[0].message.content), dict)


class Tools(unittest.TestCase):
    def check_call(self, call):
        self.assertTrue(call.id.startswith("call_"))
        self.assertEqual(call.type, "function")
        args = json.loads(call.function.arguments)
        schema = {"get_weather": WEATHER, "now": NOW}[call.function.name]["function"]["parameters"]
        jsonschema.validate(args, schema)

    def test_a_named_function_s_arguments_validate(self):
        for seed in range(3):
            r = client().chat.completions.create(
                model="m", messages=MESSAGES, tools=[WEATHER, NOW], max_tokens=100, seed=seed,
                tool_choice={"type": "function", "function": {"name": "get_weather"}},
            )
            choice = r.choices[0]
            self.assertEqual(choice.finish_reason, "tool_calls")
            self.assertIsNone(choice.message.content)
            self.assertEqual([c.function.name for c in choice.message.tool_calls], ["get_weather"])
            self.check_call(choice.message.tool_calls[0])

    def test_required_calls_streamed_assemble_as_the_docs_show(self):
        stream = client().chat.completions.create(
            model="m", messages=MESSAGES, tools=[WEATHER, NOW], tool_choice="required",
            parallel_tool_calls=False, max_tokens=200, temperature=0, stream=True,
        )
        calls, finish = {}, None
        for chunk in stream:
            if not chunk.choices:
                continue
            delta = chunk.choices[0].delta
            for tc in delta.tool_calls or []:
                call = calls.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
                call["id"] = tc.id or call["id"]
                if tc.function and tc.function.name:
                    call["name"] += tc.function.name
                if tc.function and tc.function.arguments:
                    call["arguments"] += tc.function.arguments
            finish = chunk.choices[0].finish_reason or finish
        self.assertEqual(finish, "tool_calls")
        self.assertEqual(len(calls), 1)
        call = calls[0]
        self.assertTrue(call["id"].startswith("call_"))
        schema = {"get_weather": WEATHER, "now": NOW}[call["name"]]["function"]["parameters"]
        jsonschema.validate(json.loads(call["arguments"]), schema)

    def test_a_history_with_a_call_and_its_answer_continues(self):
        r = client().chat.completions.create(
            model="m", max_tokens=4, tools=[WEATHER], tool_choice="none",
            messages=MESSAGES + [
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_1", "type": "function",
                     "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "21 degrees"},
            ],
        )
        self.assertIsNone(r.choices[0].message.tool_calls)

    def test_auto_without_a_format_is_refused_by_name(self):
        with self.assertRaises(openai.BadRequestError) as e:
            client().chat.completions.create(model="m", messages=MESSAGES, tools=[WEATHER])
        self.assertIn("tool-call format", str(e.exception))


if __name__ == "__main__":
    unittest.main()
