#!/usr/bin/python3
"""Expected renderings of the chat templates in ../shared/data/templates/ (tests/data/templates/*.json).

Renders each template with Debian's python3-jinja2 configured as transformers' apply_chat_template
does (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols, the generation tag,
its tojson, raise_exception and strftime_now), for the conversations below. strftime_now reads a
fixed clock (FIXED_NOW, UTC) so that renderings do not change with the day; test_jinja sets the
engine's clock to the same instant. A template Jinja2 refuses is recorded with its error, and the
test requires Tandem to refuse it too. Run once after adding a template; the output is committed.

    scripts/gen_template_renderings.py [TEMPLATE_DIR] [OUT_DIR]
"""
import json
import os
import sys
from datetime import datetime, timezone

import jinja2
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

FIXED_NOW = datetime(2026, 7, 26, 12, 0, 0, tzinfo=timezone.utc)


class GenerationTracker(Extension):
    """transformers' AssistantTracker: {% generation %} renders its body."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render", []), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def make_env():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return FIXED_NOW.strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationTracker, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "The city's name"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}}
SEARCH = {"type": "function", "function": {
    "name": "search", "description": "Searches the web.",
    "parameters": {"type": "object", "properties": {"query": {"type": "string"}, "n": {"type": "integer"}},
                   "required": ["query"]}}}

CALL = {"id": "call12345", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}

CASES = [
    ("system_user", {"messages": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Hello!"}], "add_generation_prompt": True}),
    ("user_only_no_prompt", {"messages": [
        {"role": "user", "content": "What is 2+2?"}], "add_generation_prompt": False}),
    ("multi_turn", {"messages": [
        {"role": "user", "content": "Hi there"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Tell me a joke about \"quotes\" & <tags>."}], "add_generation_prompt": True}),
    ("system_multi_turn_closed", {"messages": [
        {"role": "system", "content": "Answer briefly.\nUse plain text."},
        {"role": "user", "content": "Grüße aus München 🌍"},
        {"role": "assistant", "content": "  Hallo!  "}], "add_generation_prompt": False}),
    ("tools", {"messages": [
        {"role": "user", "content": "What's the weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "call12345", "name": "get_weather", "content": "{\"temp\": 22, \"sky\": \"clear\"}"},
        {"role": "assistant", "content": "It is 22 degrees and clear in Paris."},
        {"role": "user", "content": "Thanks."}], "tools": [WEATHER, SEARCH], "add_generation_prompt": True}),
    ("tools_offered", {"messages": [
        {"role": "system", "content": "You can call tools."},
        {"role": "user", "content": "Search for cats."}], "tools": [SEARCH], "add_generation_prompt": True}),
    ("reasoning", {"messages": [
        {"role": "user", "content": "Is 17 prime?"},
        {"role": "assistant", "content": "Yes, 17 is prime.", "reasoning_content": "17 has no divisors but 1 and 17."},
        {"role": "user", "content": "And 21?"}], "add_generation_prompt": True}),
    ("thinking_off", {"messages": [
        {"role": "user", "content": "Quick answer: capital of France?"}], "add_generation_prompt": True,
        "enable_thinking": False}),
]

COMMON = {"bos_token": "<s>", "eos_token": "</s>"}


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    src = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "..", "..", "shared", "data", "templates")
    out = sys.argv[2] if len(sys.argv) > 2 else os.path.join(here, "..", "tests", "data", "templates")
    os.makedirs(out, exist_ok=True)
    env = make_env()
    for name in sorted(os.listdir(src)):
        if not name.endswith(".jinja"):
            continue
        with open(os.path.join(src, name), encoding="utf-8") as f:
            source = f.read()
        doc = {"template": name, "jinja2": jinja2.__version__, "now": FIXED_NOW.isoformat(), "cases": []}
        try:
            tmpl = env.from_string(source)
        except Exception as e:  # refused at load: every case expects an error
            tmpl = None
            load_error = f"{type(e).__name__}: {e}"
        for case, ctx in CASES:
            context = dict(COMMON, **ctx)
            entry = {"name": case, "context": context}
            if tmpl is None:
                entry["error"] = load_error
            else:
                try:
                    entry["expected"] = tmpl.render(**context)
                except Exception as e:
                    entry["error"] = f"{type(e).__name__}: {e}"
            doc["cases"].append(entry)
        stem = name[: -len(".jinja")]
        with open(os.path.join(out, stem + ".json"), "w", encoding="utf-8") as f:
            json.dump(doc, f, ensure_ascii=False, indent=1)
            f.write("\n")
        n_err = sum("error" in c for c in doc["cases"])
        print(f"{stem}: {len(doc['cases']) - n_err} rendered, {n_err} refused")


if __name__ == "__main__":
    main()
