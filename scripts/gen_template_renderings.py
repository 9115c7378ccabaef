#!/usr/bin/python3
"""Expected renderings of the chat templates in ../shared/data/templates/ (tests/data/templates/*.json).

Renders each template with Debian's python3-jinja2 configured as transformers' apply_chat_template
does (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols, the generation tag,
its tojson, raise_exception and strftime_now), for the conversations below. strftime_now reads a
fixed clock (FIXED_NOW, UTC) so that renderings do not change with the day; test_jinja sets the
engine's clock to the same instant. A template Jinja2 refuses is recorded with its error, and the
test requires Tandem to refuse it too. Run once after adding a template; the output is committed.

    scripts/gen_template_renderings.py [TEMPLATE_DIR] [OUT_DIR]

It also writes tests/data/jinja_language.json: the outputs (or errors) of LANGUAGE_CASES, one
construct of the language each, for test_jinja's unit tests.
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

LANGUAGE_CASES = [
 # (template, context): one construct each; the output or Jinja2's error goes to
 # tests/data/jinja_language.json
 # statements
 ("{% if x %}a{% elif y %}b{% else %}c{% endif %}", {"x": 0, "y": 1}),
 ("{% for i in [1,2,3] %}{{ loop.index0 }}{{ loop.index }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.revindex }};{% endfor %}", {}),
 ("{% for i in 'abc' %}{{ loop.previtem }}-{{ i }}-{{ loop.nextitem }},{% endfor %}", {}),
 ("{% for i in [] %}x{% else %}empty{% endfor %}", {}),
 ("{% for i in range(10) if i is odd %}{{ i }}{% endfor %}", {}),
 ("{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i == 5 %}{% break %}{% endif %}{{ i }}{% endfor %}", {}),
 ("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}", {"d": {"b": 1, "a": 2}}),
 ("{% for k, v in d | items %}{{ k }}={{ v }};{% endfor %}{% for k in d %}{{ k }}{% endfor %}", {"d": {"b": 1, "a": 2}}),
 ("{% for m in ms | selectattr('role', 'equalto', 'user') %}{{ m.content }}{% endfor %}", {"ms": [{"role": "user", "content": "u1"}, {"role": "system", "content": "s"}, {"role": "user", "content": "u2"}]}),
 ("{% set x = 1 %}{% for i in [1] %}{% set x = 2 %}{{ x }}{% endfor %}{{ x }}", {}),
 ("{% set x = 1 %}{% if true %}{% set x = 2 %}{% endif %}{{ x }}", {}),
 ("{% set ns = namespace(n=0, s='') %}{% for i in range(3) %}{% set ns.n = ns.n + i %}{% set ns.s = ns.s ~ i %}{% endfor %}{{ ns.n }} {{ ns.s }}", {}),
 ("{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set t = (3, 4) %}{{ t }}", {}),
 ("{% set body %}  Hi {{ name }}  {% endset %}[{{ body }}]{% set b2 | trim | upper %}  x  {% endset %}[{{ b2 }}]", {"name": "Bo"}),
 ("{% macro greet(who, punct='!') %}Hello {{ who }}{{ punct }}{% endmacro %}{{ greet('A') }} {{ greet('B', punct='?') }} {{ greet(who='C') }}", {}),
 ("{% macro wrap() %}[{{ caller() }}]{% endmacro %}{% call wrap() %}inner{% endcall %}", {}),
 ("{% macro rec(n) %}{% if n > 0 %}{{ n }}{{ rec(n - 1) }}{% endif %}{% endmacro %}{{ rec(3) }}", {}),
 ("{% filter upper %}abc {{ x }}{% endfilter %}", {"x": "def"}),
 ("{% raw %}{{ not }} {% if %}{% endraw %}", {}),
 ("{% generation %}gen {{ 1 }}{% endgeneration %}", {}),
 ("{% with a = 5 %}{{ a }}{% endwith %}{{ a }}", {}),
 # whitespace
 ("<\n{% if true %}\n  x\n{% endif %}\n>", {}),
 ("<\n    {% if true %}\n    y\n    {% endif %}\n>", {}),
 ("a  {{- ' b ' -}}  c", {}),
 ("a\n  {%- if true -%}\n  b  \n{%- endif %}c", {}),
 ("a\n  {%+ if true %}b{% endif +%}\nc", {}),
 ("x {# comment #}\ny\n  {# c2 #}\nz", {}),
 ("a\r\nb\r\n{% if true %}\r\nc{% endif %}\n", {}),
 ("{{ 'x' }}\n{{ 'y' }}\n", {}),
 ("  {{ 'v' }}  {% if true %}  t{% endif %}", {}),
 # expressions
 ("{{ [1, 2, 3][1:] }} {{ 'hello'[::-1] }} {{ [1,2,3,4][-2:] }} {{ 'abcdef'[1:4] }} {{ [1,2,3][:-1] }}", {}),
 ("{{ {'a': 1}['a'] }} {{ d.a }} {{ d['b'] }} {{ l[0] }} {{ l[-1] }}", {"d": {"a": 1, "b": [1, "x"]}, "l": [7, 8]}),
 ("{{ 'a' in 'cat' }} {{ 2 in [1, 2] }} {{ 'k' in {'k': 1} }} {{ 3 not in [1] }}", {}),
 ("{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }} {{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 'ab' * 3 }} {{ 1.5 + 1 }}", {}),
 ("{{ 1 < 2 }} {{ 'a' < 'b' }} {{ 1 == 1.0 }} {{ [1, 2] == [1, 2] }} {{ none == none }} {{ 1 != 2 }} {{ 3 >= 3 }}", {}),
 ("{{ true and 'x' }} {{ false or 'y' }} {{ not 0 }} {{ 'a' if false else 'b' }} {{ 'c' if true }}", {}),
 ("{{ 'a' ~ 1 ~ none ~ true }} {{ 1 ~ 2.5 }} {{ 0.1 + 0.2 }} {{ 1e20 }} {{ 1.0 }} {{ 1e-7 }} {{ 100.0 / 3 }}", {}),
 ("{{ x is defined }} {{ y is defined }} {{ y is undefined }} {{ none is none }} {{ 'a' is string }} {{ 1 is number }} {{ {} is mapping }} {{ [] is iterable }} {{ [] is sequence }} {{ true is boolean }} {{ 3 is divisibleby 3 }} {{ 1 is in [1] }} {{ 2 is equalto 2 }} {{ x is not none }}", {"x": 1}),
 ("{{ [1, 'a', {'k': [true, none, 1.5]}] }} {{ {'a': 'it\\'s'} }} {{ ('x',) }}", {}),
 ("{{ '%s and %s' % ('a', 'b') }} {{ '%d%%' % 5 }} {{ 'x=%s' % 3 }}", {}),
 ("{{ -x }} {{ -(1) }} {{ x|abs }}", {"x": -4}),
 # filters
 ("[{{ '  a b  ' | trim }}] {{ 'abc' | length }} {{ [1,2] | length }} {{ 'Grüße' | length }} {{ {'a':1} | count }}", {}),
 ("{{ {'b': 1, 'a': [1, 'é', none, true]} | tojson }}|{{ x | tojson(indent=2) }}|{{ {'b': 1, 'a': 2} | tojson(sort_keys=true) }}|{{ [] | tojson(indent=2) }}", {"x": {"k": [1, {"z": "q"}], "e": {}}}),
 ("{{ 'Hello World' | lower }} {{ 'abc' | upper }} {{ 'hello wORLD-foo bar' | title }} {{ 'hELLO' | capitalize }} {{ 'aaa' | replace('a', 'b', 2) }}", {}),
 ("{{ ['a', 'b'] | join(', ') }} {{ [1, 2] | join }} {{ ms | map(attribute='n') | join('+') }} {{ [1,2,3] | first }} {{ [1,2,3] | last }} {{ 'abc' | first }}", {"ms": [{"n": 1}, {"n": 2}]}),
 ("{{ x | default('d') }} {{ '' | default('e', true) }} {{ 0 | default('f') }} {{ none | default('g') }}", {}),
 ("{{ [3, 1, 2] | sort }} {{ ['b', 'A', 'c'] | sort }} {{ [3,1,2] | sort(reverse=true) }} {{ {'b': 1, 'a': 2} | dictsort }} {{ ms | sort(attribute='n') | map(attribute='n') | list }}", {"ms": [{"n": 2}, {"n": 1}]}),
 ("{{ [1, 2, 1, 3] | unique | list }} {{ ['a', 'A', 'b'] | unique | list }} {{ 'ab' | list }} {{ [1, 0, 2] | select | list }} {{ [1, 2, 3, 4] | reject('odd') | list }} {{ ms | rejectattr('x') | list }}", {"ms": [{"x": 1}, {"x": 0}]}),
 ("{{ '42' | int }} {{ 'x' | int }} {{ '3.7' | int }} {{ 3.9 | int }} {{ '2.5' | float }} {{ 2 | float }} {{ 2.567 | round(2) }} {{ 2.5 | round }} {{ 3.5 | round }} {{ -3 | abs }} {{ 2.4 | round(0, 'ceil') }}", {}),
 ("{{ 'a\nb\n\nc' | indent(2) }}|{{ 'a\nb' | indent(2, true) }}|{{ 'a\n\nb' | indent(4, blank=true) }}|{{ 'x' | safe }}|{{ '<a href=\"x\">&' | e }}|{{ 'one two  three' | wordcount }}", {}),
 ("{{ [1,2,3,4,5] | batch(2) | list }} {{ [1,2,3] | sum }} {{ [3,1,2] | min }} {{ [3,1,2] | max }} {{ [1,2,3] | reverse | list }} {{ 'abc' | reverse }} {{ 5 | string }} {{ [1,2] | string }}", {}),
 ("{{ '%s-%s' | format('a', 'b') }} {{ [1, 2, 3] | map('string') | join }} {{ ['a b', 'c'] | map('upper') | list }}", {}),
 # methods
 ("[{{ '  x  '.strip() }}][{{ 'xxhixx'.strip('x') }}][{{ '  x '.lstrip() }}][{{ ' x  '.rstrip() }}]", {}),
 ("{{ 'a,b,,c'.split(',') }} {{ ' a  b '.split() }} {{ 'a,b,c'.split(',', 1) }} {{ 'a,b,c'.rsplit(',', 1) }} {{ 'l1\nl2'.splitlines() }}", {}),
 ("{{ 'hello'.startswith('he') }} {{ 'hello'.endswith(('x', 'lo')) }} {{ 'a-b'.replace('-', '+') }} {{ 'ab'.upper() }} {{ 'AB'.lower() }} {{ 'hello world'.title() }} {{ 'hELLO'.capitalize() }}", {}),
 ("{{ '{} is {}'.format('x', 1) }} {{ '{0}{1}{0}'.format('a', 'b') }} {{ '{name}!'.format(name='N') }} {{ 'banana'.count('a') }} {{ 'banana'.find('n') }} {{ 'banana'.find('z') }} {{ 'héllo'.find('l') }}", {}),
 ("{{ d.get('a') }} {{ d.get('z') }} {{ d.get('z', 5) }} {{ d.keys() | list }} {{ d.values() | list }} {{ d.items() | list }} {{ [1, 2, 2].count(2) }} {{ [1, 2].index(2) }}", {"d": {"a": 1, "b": 2}}),
 ("{{ strftime_now('%Y-%m-%d %H:%M %B %A %d %b') }}", {}),
 ("{{ ', '.join(['a', 'b']) }} {{ 'ab'.isalpha() }} {{ '12'.isdigit() }}", {}),
 # undefined
 ("[{{ x }}][{{ x | length }}][{% for i in x %}no{% endfor %}][{{ x ~ 'a' }}][{{ x is none }}][{{ x == none }}][{% if not x %}f{% endif %}][{{ x | list }}]", {}),
 ("[{{ d.missing }}][{{ d['missing'] }}][{{ l[5] }}][{{ none.x }}]", {"d": {}, "l": []}),
 # errors (Jinja2 refuses)
 ("{{ x.y }}", {}),
 ("{{ x['y'] }}", {}),
 ("{{ x + 1 }}", {}),
 ("{{ 'a' + 1 }}", {}),
 ("{{ raise_exception('custom failure') }}", {}),
 ("{% set l = [] %}{{ l.append(1) }}", {}),
 ("{% set d = {} %}{{ d.update({'a': 1}) }}", {}),
 ("{{ ''.__class__ }}", {}),
 ("{{ x() }}", {}),
 ("{% for a, b in [[1, 2, 3]] %}{% endfor %}", {}),
 ("{{ 1 / 0 }}", {}),
 ("{{ none | tojson }}{{ x | tojson }}", {}),
 ("{% set x = 1 %}{% set x.y = 2 %}", {}),
 # idioms of real templates
 ("{% set content = m['content'] if m['content'] is string else m['content'] | map(attribute='text') | join('') %}{{ content }}", {'m': {'content': [{'type': 'text', 'text': 'a'}, {'type': 'text', 'text': 'b'}]}}),
 ("{{ (ms | selectattr('role', 'equalto', 'system') | list | length) > 0 }}", {'ms': [{'role': 'system'}]}),
 ("{{ c.split('</think>')[-1].lstrip('\\n') }}", {'c': '<think>x</think>\n\nanswer'}),
 ("{{ m.get('tool_calls') }} {{ m.get('content', 'd') }}", {'m': {'content': None}}),
 ('{%- for t in tools %}{{ t.function.parameters.properties | items | list | length }}{% endfor %}', {'tools': [{'function': {'parameters': {'properties': {'a': 1, 'b': 2}}}}]}),
 ("{{ 'x' if not (y is defined) }}{{ not y is defined }}", {}),
 ("{{ tools | selectattr('type', 'in', ['function', 'x']) | list | length }}", {'tools': [{'type': 'function'}, {'type': 'y'}]}),
 ("{{ '{:.2f}'.format(1.234) }}", {}),
 ("{{ '%.1f' % 2.25 }}", {}),
 ('{{ x | tojson(indent=4) }}', {'x': {'a': [1, 2], 'b': 'c'}}),
 ("{{ 'a\xa0' | trim }}|{{ ' \u3000x' | trim }}|", {}),
 ("{% for i in range(3) %}{{ loop.cycle('odd', 'even') }}{% endfor %}", {}),
 ("{% set d = {'a': 1} %}{{ d | length }}{{ d.a is number }}{{ 'a' in d }}", {}),
 ("{{ [1, 2] | map('int') | sum }}{{ ['x', 'y'] | join(attribute=none) }}", {}),
 ("{{ none is defined }}{{ none | default('x') }}{{ none | default('x', true) }}", {}),
 ("{{ ms[-1]['role'] }}{{ ms | last | attr('role') }}", {'ms': [{'role': 'user'}]}),
 ("{{ 'abc' is lower }}{{ 5 is even }}{{ x is iterable }}", {'x': 's'}),
 ("{{ ['b', 'a'] | sort | first }}{{ {'b': 1, 'a': 2} | dictsort(by='value') | first }}", {}),
 ('{{ messages | length }}{{ messages[0].content | wordcount }}', {'messages': [{'content': 'hi there you'}]}),
 ('{% if x is string and x | length > 2 %}long{% endif %}', {'x': 'abcd'}),
 ('{{ 1 if true else 2 if false else 3 }}{{ (1, 2) | list }}{{ [1, [2, 3]] | tojson }}', {}),
 ('{{ x.content.strip() }}', {'x': {'content': None}}),
 ('{{ 10 / 4 }} {{ 10 // 4 }} {{ 2 ** -1 }} {{ 7.0 // 2 }} {{ -7.5 % 2 }} {{ 1e3 | int }}', {}),
 ('{% macro m(a, b=2) %}{{ a }}{{ b }}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(1, 3, 4) }}', {}),
 ("{{ 'hello world'.split(' ', 1)[1] }}{{ 'A,B'.lower().split(',') }}", {}),
 ('{{ "it\'s" }} {{ \'say "hi"\' }} {{ [\'it\\\'s\'] }} {{ ["a\\"b"] }}', {}),
 ("{{ '\\u2019' }}{{ 'tab\\there' }}", {}),
 ("{{ '{:>5}|{:<5}|{:^6}|{:05d}|{:+.1f}|{:.3}|{:x}|{:.1%}'.format('ab', 'ab', 'ab', 42, 3.14159, 'abcdef', 255, 0.25) }}", {}),
 ("{{ '%5s|%-5s|%05.1f|%x|%r|%3d|%.2e' % ('a', 'b', 3.14159, 255, 'q', 7, 12345.678) }}", {}),
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
    language = []
    for source, ctx in LANGUAGE_CASES:
        entry = {"template": source, "context": ctx}
        try:
            entry["expected"] = env.from_string(source).render(**ctx)
        except Exception as e:
            entry["error"] = f"{type(e).__name__}: {e}"
        language.append(entry)
    with open(os.path.join(out, "..", "jinja_language.json"), "w", encoding="utf-8") as f:
        json.dump(language, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"jinja_language.json: {len(language)} cases")


if __name__ == "__main__":
    main()
