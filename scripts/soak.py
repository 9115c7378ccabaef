#!/usr/bin/env python3
"""The soak's load generator, sampler and judge (scripts/soak.sh starts tandemd and runs it).

Python 3 standard library only: asyncio clients speak HTTP/1.1 over tandemd's Unix socket by
hand. Phases: references (every deterministic request of the catalogue sent once, one at a
time, on the idle daemon), an idle snapshot, CLIENTS clients sending a weighted mix back to
back for MINUTES while a sampler reads /proc and /metrics every few seconds, a drain, a second
idle snapshot, then the goals. Writes DIR/samples.csv, DIR/result.json (everything
soak_report.py needs) and DIR/failures.txt; exits 1 when a hard goal fails.

Usage: soak.py --socket SOCK --pid PID --out DIR [--minutes N] [--clients C] [--seed S]
               [--latency-ratio R] [--max-requests N] [--sample-s S]
"""
import argparse
import asyncio
import csv
import json
import math
import os
import random
import re
import sys
import time

REQUEST_TIMEOUT_S = 180  # a request not answered by then is lost
IDLE_SETTLE_S = 30       # after the load: how long fds, threads and KV pages get to return to idle


# ---------------------------------------------------------------- HTTP/1.1 over the Unix socket

class http_error(Exception):
    pass


def encode_request(method, path, body=b"", keep_alive=True):
    head = "{} {} HTTP/1.1\r\nHost: tandem\r\n".format(method, path)
    if method == "POST":
        head += "Content-Type: application/json\r\nContent-Length: {}\r\n".format(len(body))
    if not keep_alive:
        head += "Connection: close\r\n"
    return head.encode() + b"\r\n" + body


async def read_head(reader):
    raw = await reader.readuntil(b"\r\n\r\n")
    lines = raw.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1."):
        raise http_error("bad status line: {!r}".format(lines[0]))
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            k, v = line.split(":", 1)
            headers[k.strip().lower()] = v.strip()
    return int(parts[1]), headers


async def body_pieces(reader, headers):
    """Yields the body as it arrives: de-chunked, or Content-Length bytes, or up to EOF."""
    if headers.get("transfer-encoding", "").lower() == "chunked":
        while True:
            size_line = await reader.readuntil(b"\r\n")
            n = int(size_line.split(b";")[0].strip(), 16)
            if n == 0:
                await reader.readuntil(b"\r\n")  # no trailers from tandemd: the last CRLF
                return
            data = await reader.readexactly(n + 2)
            if data[-2:] != b"\r\n":
                raise http_error("chunk without its CRLF")
            yield data[:-2]
    elif "content-length" in headers:
        n = int(headers["content-length"])
        if n:
            yield await reader.readexactly(n)
    else:
        while True:
            data = await reader.read(65536)
            if not data:
                return
            yield data


class connection:
    """One keep-alive connection; reopened after the daemon or we closed it."""

    def __init__(self, sock):
        self.sock = sock
        self.reader = self.writer = None

    async def open(self):
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_unix_connection(self.sock, limit=1 << 22)

    def drop(self):
        if self.writer is not None:
            self.writer.transport.abort()  # both directions at once: a client that went away
        self.reader = self.writer = None

    async def send(self, method, path, body=b"", keep_alive=True):
        await self.open()
        self.writer.write(encode_request(method, path, body, keep_alive))
        await self.writer.drain()

    async def exchange(self, method, path, body=b"", keep_alive=True):
        """A whole reply: (status, headers, body bytes)."""
        await self.send(method, path, body, keep_alive)
        status, headers = await read_head(self.reader)
        data = b"".join([p async for p in body_pieces(self.reader, headers)])
        if headers.get("connection", "").lower() == "close":
            self.drop()
        return status, headers, data


async def one_shot(sock, method, path, body=b""):
    c = connection(sock)
    try:
        return await c.exchange(method, path, body, keep_alive=False)  # the daemon closes its end at once
    finally:
        c.drop()


async def get_json(sock, path):
    status, _, data = await one_shot(sock, "GET", path)
    if status != 200:
        raise http_error("{} answered {}".format(path, status))
    return json.loads(data)


async def post_json(sock, path, obj):
    status, _, data = await one_shot(sock, "POST", path, json.dumps(obj).encode())
    return status, json.loads(data) if data else None


def parse_metrics(text):
    """Prometheus text to {'name{labels}': value}."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        try:
            out[key] = float(value)
        except ValueError:
            pass
    return out


async def metrics(sock):
    status, _, data = await one_shot(sock, "GET", "/metrics")
    if status != 200:
        raise http_error("/metrics answered {}".format(status))
    return parse_metrics(data.decode())


def requests_by_route(m):
    """tandem_requests_total as {(route, status): n}."""
    out = {}
    for k, v in m.items():
        if k.startswith("tandem_requests_total{"):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', k))
            out[(labels.get("route", ""), int(labels.get("status", "0")))] = int(v)
    return out


# ---------------------------------------------------------------- the request catalogue

STORY_OPENINGS = [
    "Once upon a time, there was a little girl named Lily.",
    "One day, a big dog found a red ball in the park.",
    "Tom and his mom went to the store to buy some milk.",
    "The sun was shining and the birds were singing.",
    "Sam had a toy car that he loved very much.",
    "There was a small cat who liked to play in the garden.",
    "Anna wanted to bake a cake for her friend.",
    "The old man sat on the bench and looked at the sky.",
]
STORY_FILLER = ("Lily and Ben played in the park. They saw a big tree and a little bird. The bird sang a "
                "happy song. Ben wanted to climb the tree, but his mom said no. ")
DOCUMENT = ("The lighthouse stood on the rock for a hundred years. Its lamp was first fuelled by whale oil, "
            "then by kerosene, and at last by electricity. The keeper climbed one hundred and twelve steps "
            "every evening to light it.")
PERSON_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "happy": {"type": "boolean"},
    },
    "required": ["name", "age", "happy"],
}
ANSWER_REGEX = r"(yes|no|maybe), [a-z]{2,10}( [a-z]{2,10}){0,3}\."
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 16}},
                   "required": ["city"]}}}


def long_prompt(i, n_words):
    words = (STORY_FILLER * (n_words // 20 + 2)).split()[:n_words]
    return "Story {}: {} {}".format(i, STORY_OPENINGS[i % len(STORY_OPENINGS)], " ".join(words))


class kind:
    """A family of requests: its variants are fixed bodies, so a deterministic one has one reference."""

    def __init__(self, name, route, weight, variants, stream=None, deterministic=True, expect=200, check=None):
        self.name, self.route, self.weight, self.variants = name, route, weight, variants
        self.stream = stream            # None: never streamed; a float: the share streamed
        self.deterministic = deterministic
        self.expect = expect            # the status every request of the kind must get
        self.check = check              # extra check of a 200 reply: f(variant body, reply) -> error or None


def catalogue(info):
    """The kinds, sized from the daemon's limits (info: n_ctx, max_prompt_tokens, max_body_bytes, n_vocab)."""
    ks = []
    comp, chat = "/v1/completions", "/v1/chat/completions"
    spec_off = {"speculative": {"method": "off"}}

    v = []
    for i, p in enumerate(STORY_OPENINGS):
        body = {"prompt": p, "max_tokens": (16, 48, 96)[i % 3], "temperature": 0}
        if i % 2:
            body.update(spec_off)  # the daemon drafts by default (draft_tokens): half say off
        if i % 4 == 3:
            body["priority"] = 5
        v.append(body)
    ks.append(kind("completion", comp, 14, v, stream=0.5))

    v = []
    for i, p in enumerate(STORY_OPENINGS[:6]):
        body = {"messages": [{"role": "user", "content": p}], "max_tokens": (24, 64)[i % 2], "temperature": 0}
        if i % 2:
            body.update(spec_off)
        v.append(body)
    ks.append(kind("chat", chat, 12, v, stream=0.5))

    # cancelled mid-stream: the client closes after a few events; what came must be the reference's prefix
    v = [{"prompt": p, "max_tokens": 400, "temperature": 0, "ignore_eos": True}
         for p in STORY_OPENINGS[:4]]
    ks.append(kind("cancel", comp, 8, v, stream=1.0))

    # long prompts: the pool cannot hold many at once, so they force preemption
    words = max(40, (info["n_ctx"] * 2 // 3) // 2)  # about 2 tokens a word: some 2/3 of the context
    v = [{"prompt": long_prompt(i, words), "max_tokens": 64, "temperature": 0, "ignore_eos": True}
         for i in range(4)]
    ks.append(kind("long_prompt", comp, 6, v, stream=0.3))

    # n > 1 and best_of, seeded: each choice is reproducible
    v = [{"prompt": STORY_OPENINGS[i], "max_tokens": 32, "temperature": 0.8, "seed": 100 + i, "n": 3}
         for i in range(4)]
    v.append({"prompt": STORY_OPENINGS[5], "max_tokens": 24, "temperature": 0.7, "seed": 7, "n": 2, "best_of": 4})
    ks.append(kind("n_sampled", comp, 6, v, stream=None))
    v = [{"messages": [{"role": "user", "content": STORY_OPENINGS[i]}], "max_tokens": 32, "temperature": 0.9,
          "seed": 200 + i, "n": 2} for i in range(3)]
    ks.append(kind("chat_n", chat, 4, v, stream=0.5))

    # sampled without a seed: only the shape can be checked
    v = [{"prompt": p, "max_tokens": 40, "temperature": 1.0, "top_p": 0.9} for p in STORY_OPENINGS[:3]]
    ks.append(kind("sampled", comp, 4, v, stream=0.5, deterministic=False))

    v = [{"prompt": p, "max_tokens": 64, "temperature": 0, "ignore_eos": True,
          "speculative": {"method": "ngram", "num_tokens": 4}} for p in
         [long_prompt(10, 60), "the cat sat on the mat. the cat sat on the mat. the cat sat on the"]]
    ks.append(kind("speculative", comp, 4, v, stream=0.5))

    v = [{"prompt": STORY_OPENINGS[i], "max_tokens": 20, "temperature": 0, "use_beam_search": True,
          "n": 2, "best_of": 3} for i in range(3)]
    ks.append(kind("beam", comp, 3, v, stream=0.3))

    v = [{"messages": [{"role": "user", "content": "Describe a person: " + p}], "max_tokens": 96, "temperature": 0,
          "response_format": {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON_SCHEMA}}}
         for p in STORY_OPENINGS[:3]]
    ks.append(kind("json_schema", chat, 4, v, stream=0.5, check=check_person))

    v = [{"prompt": "Question: " + p + " Answer: ", "max_tokens": 48, "temperature": 0,
          "structured_outputs": {"regex": ANSWER_REGEX}} for p in STORY_OPENINGS[:3]]
    ks.append(kind("regex", comp, 3, v, stream=0.5, check=check_regex))

    v = [{"messages": [{"role": "user", "content": "What is the weather like? " + p}], "max_tokens": 64,
          "temperature": 0, "tools": [WEATHER_TOOL], "tool_choice": "required"} for p in STORY_OPENINGS[:3]]
    ks.append(kind("tools", chat, 3, v, check=check_tool_call))

    v = [{"messages": [{"role": "user", "content": q}], "max_tokens": 48, "temperature": 0,
          "documents": [{"id": "lighthouse", "text": DOCUMENT}]} for q in
         ["What fuelled the lamp?", "How many steps did the keeper climb?"]]
    ks.append(kind("grounding", chat, 3, v, stream=0.5, check=check_citations))

    v = [{"input": [p, STORY_OPENINGS[(i + 1) % 8]]} for i, p in enumerate(STORY_OPENINGS[:3])]
    ks.append(kind("embeddings", "/v1/embeddings", 2, v))

    # mistakes: each must get its error, the connection (or its successor) serving on
    v = [b'{"prompt": "Once upon", "max_tokens": 8', b'{"prompt": "x", "max_tokens": 8,}', b"not json",
         b'["prompt"]', b'{"prompt": "\xff\xfe", "max_tokens": 4}']
    ks.append(kind("malformed", comp, 3, v, expect=400, check=check_error_400))
    v = [{"prompt": "Once upon a time", "max_tokens": 8, "frobnicate": 1},
         {"prompt": "Once", "max_tokens": 8, "stream_options": {"include_usage": True, "extra": 1}, "stream": True},
         {"prompt": "Once", "max_tokens": 8, "speculative": {"method": "ngram", "frobnicate": 2}}]
    ks.append(kind("unknown_field", comp, 2, v, expect=400, check=check_unknown_field))
    v = [{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "frobnicate": 0.5},
         {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "echo": True},  # a completions field
         {"messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "text", "frobnicate": 1}}]
    ks.append(kind("unknown_field_chat", chat, 2, v, expect=400, check=check_unknown_field))
    v = [b'{"prompt": "' + b"a" * (info["max_body_bytes"] + 1024) + b'", "max_tokens": 4}']
    ks.append(kind("oversized", comp, 1, v, expect=413))
    n_long = info["max_prompt_tokens"] + 17
    v = [{"prompt": [(7 + i) % info["n_vocab"] for i in range(n_long)], "max_tokens": 4},
         {"prompt": [1] + [100] * (n_long - 1), "max_tokens": 4, "stream": True}]
    ks.append(kind("too_long_prompt", comp, 2, v, expect=400, check=check_too_long(n_long, info["max_prompt_tokens"])))
    v = [{"prompt": "Once", "max_tokens": info["max_tokens_limit"] + 1}]
    ks.append(kind("max_tokens_too_big", comp, 1, v, expect=400))
    return ks


# ---------------------------------------------------------------- checks of replies

def out_text(c):
    """A choice's output: completions' text or chat's content."""
    return (c.get("text") or "") + (c.get("content") or "")


def check_person(body, reply):
    for c in reply["choices"]:
        if c.get("finish_reason") != "stop":
            continue  # cut by max_tokens: a prefix of a valid object
        try:
            o = json.loads(out_text(c))
        except ValueError as e:
            return "json_schema: the content does not parse: {!r} ({})".format(out_text(c), e)
        if not isinstance(o, dict) or set(o) != {"name", "age", "happy"}:
            return "json_schema: not the schema's object: {!r}".format(o)
        if not (isinstance(o["name"], str) and len(o["name"]) <= 12 and isinstance(o["happy"], bool)
                and isinstance(o["age"], int) and not isinstance(o["age"], bool) and 0 <= o["age"] <= 120):
            return "json_schema: a property breaks the schema: {!r}".format(o)
    return None


def check_regex(body, reply):
    for c in reply["choices"]:
        if c.get("finish_reason") == "stop" and not re.fullmatch(ANSWER_REGEX, out_text(c)):
            return "regex: {!r} does not match".format(out_text(c))
    return None


def check_tool_call(body, reply):
    for c in reply["choices"]:
        calls = c.get("tool_calls") or []
        if c.get("finish_reason") == "length":
            continue
        if c.get("finish_reason") != "tool_calls" or not calls:
            return "tools: no call with tool_choice required: {!r}".format(c)
        for call in calls:
            if call["function"]["name"] != "get_weather":
                return "tools: a call to {!r}".format(call["function"]["name"])
            try:
                args = json.loads(call["function"]["arguments"])
            except ValueError:
                return "tools: arguments do not parse: {!r}".format(call["function"]["arguments"])
            if not isinstance(args, dict) or not isinstance(args.get("city"), str):
                return "tools: arguments break the schema: {!r}".format(args)
    return None


def check_citations(body, reply):
    for c in reply["choices"]:
        content = out_text(c)
        for cit in c.get("citations") or []:
            if content[cit["start"]:cit["end"]] != cit["text"] or cit["document_index"] != 0:
                return "grounding: a citation that is not the reply's text: {!r}".format(cit)
    return None


def check_error_400(body, reply):
    e = reply.get("error") if isinstance(reply, dict) else None
    if not isinstance(e, dict) or not e.get("message") or e.get("type") != "invalid_request_error":
        return "no OpenAI error object: {!r}".format(reply)
    return None


UNKNOWN_FIELDS = ("frobnicate", "echo", "stream_options", "speculative", "response_format")


def check_unknown_field(body, reply):
    err = check_error_400(body, reply)
    if err:
        return err
    param = reply["error"].get("param") or ""
    if not any(param == f or param.startswith(f + ".") for f in UNKNOWN_FIELDS):
        return "unknown field: param is {!r}, not the field".format(param)
    return None


def check_too_long(n, limit):
    def check(body, reply):
        err = check_error_400(body, reply)
        if err:
            return err
        e = reply["error"]
        if e.get("code") != "context_length_exceeded" or str(n) not in e["message"] or str(limit) not in e["message"]:
            return "prompt too long: the error does not give {} and {}: {!r}".format(n, limit, e)
        return None
    return check


# ---------------------------------------------------------------- one request

def sse_events(buf):
    """Splits complete `data: ...` events off buf: (events, rest)."""
    events = []
    while True:
        i = buf.find(b"\n\n")
        if i < 0:
            return events, buf
        ev, buf = buf[:i], buf[i + 2:]
        for line in ev.split(b"\n"):
            if line.startswith(b"data: "):
                events.append(line[6:])


def empty_choice():
    return {"text": "", "content": "", "finish_reason": None, "tool_calls": [], "citations": None}


def choices_of(reply, route):
    """A plain reply's choices as {index: {text/content, finish_reason, ...}}."""
    out = {}
    for c in reply.get("choices", []):
        d = empty_choice()
        d["finish_reason"] = c.get("finish_reason")
        if route == "/v1/chat/completions":
            m = c.get("message") or {}
            d["content"] = m.get("content") or ""
            d["tool_calls"] = m.get("tool_calls") or []
            d["citations"] = m.get("citations")
        else:
            d["text"] = c.get("text", "")
        out[c["index"]] = d
    return out


class outcome:
    def __init__(self, kind_name, variant, stream, cancel_after):
        self.kind, self.variant, self.stream, self.cancel_after = kind_name, variant, stream, cancel_after
        self.t_sent = self.t_first = self.t_done = None
        self.status = None
        self.reply = None       # parsed JSON of a plain reply
        self.choices = None     # {index: choice}, plain or assembled from a stream
        self.ids = set()        # response ids seen
        self.cancelled = False  # we closed after cancel_after events
        self.error = None       # what went wrong, or None


async def perform(conn, k, variant, stream, cancel_after):
    """Sends one request of kind k on conn and reads its answer into an outcome."""
    o = outcome(k.name, variant, stream, cancel_after)
    body = k.variants[variant]
    if isinstance(body, dict):
        b = dict(body)
        if stream:
            b["stream"] = True
            if k.route != "/v1/embeddings":
                b["stream_options"] = {"include_usage": True}
        data = json.dumps(b).encode()
    else:
        data = body
    o.t_sent = time.monotonic()
    try:
        await conn.send("POST", k.route, data)
        status, headers = await read_head(conn.reader)
        o.status = status
        o.t_first = time.monotonic()
        if status == 200 and headers.get("content-type", "").startswith("text/event-stream"):
            await read_stream(conn, k, headers, o)
        else:
            raw = b"".join([p async for p in body_pieces(conn.reader, headers)])
            o.t_done = time.monotonic()
            try:
                o.reply = json.loads(raw)
            except ValueError:
                o.error = "the reply is not JSON: {!r}".format(raw[:200])
            if isinstance(o.reply, dict) and "id" in o.reply:
                o.ids.add(o.reply["id"])
            if stream and status == 200:
                o.error = "asked to stream, got a plain 200"
        if headers.get("connection", "").lower() == "close" or status == 413:
            conn.drop()
    except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, http_error, ValueError) as e:
        conn.drop()
        o.error = o.error or "{}: {}".format(type(e).__name__, e)
    if o.t_done is None:
        o.t_done = time.monotonic()
    return o


async def read_stream(conn, k, headers, o):
    chat = k.route == "/v1/chat/completions"
    choices, buf, n_events, done, usage_seen = {}, b"", 0, False, False
    o.t_first = None
    async for piece in body_pieces(conn.reader, headers):
        events, buf = sse_events(buf + piece)
        for ev in events:
            if done:
                o.error = "an event after [DONE]"
                return
            if ev == b"[DONE]":
                done = True
                continue
            j = json.loads(ev)
            o.ids.add(j.get("id"))
            if j.get("usage"):
                usage_seen = True
            for c in j.get("choices", []):
                d = choices.setdefault(c["index"], empty_choice())
                if d["finish_reason"] is not None:
                    o.error = "a chunk for choice {} after its finish_reason".format(c["index"])
                    return
                if chat:
                    delta = c.get("delta") or {}
                    d["content"] += delta.get("content") or ""
                    if c.get("citations") is not None:
                        d["citations"] = c["citations"]
                else:
                    d["text"] += c.get("text", "")
                if c.get("finish_reason"):
                    d["finish_reason"] = c["finish_reason"]
                if o.t_first is None and (d["text"] or d["content"]):
                    o.t_first = time.monotonic()
            n_events += 1
            if o.cancel_after and n_events >= o.cancel_after:
                o.cancelled = True
                o.choices = choices
                conn.drop()  # the client goes away mid-stream
                return
    o.t_done = time.monotonic()
    o.choices = choices
    if not done:
        o.error = "the stream ended without [DONE]"
    elif not usage_seen:
        o.error = "no usage chunk with include_usage"
    elif any(c["finish_reason"] is None for c in choices.values()):
        o.error = "a choice without its finish_reason"
    if o.t_first is None:
        o.t_first = o.t_done


def judge(k, o, ref):
    """None when o is a correct answer to its request, else why not."""
    if o.error:
        return o.error
    if o.status != k.expect:
        return "status {} (expected {}): {!r}".format(o.status, k.expect, o.reply)
    if o.status != 200:
        return k.check(k.variants[o.variant], o.reply) if k.check else None
    if o.choices is None:
        if not isinstance(o.reply, dict):
            return "no JSON object"
        if k.route == "/v1/embeddings":
            return compare_embeddings(o.reply, ref) if ref is not None else None
        o.choices = choices_of(o.reply, k.route)
    got = o.choices
    if len(o.ids) != 1:
        return "response ids {!r}: not one".format(sorted(map(str, o.ids)))
    if ref is not None:
        want = ref["choices"]
        if o.cancelled:
            for i, c in got.items():
                w = want.get(i)
                if w is None or not (w["text"] + w["content"]).startswith(c["text"] + c["content"]):
                    return "cancelled stream, choice {}: {!r} is not a prefix of the reference".format(
                        i, c["text"] + c["content"])
            return None
        if sorted(got) != sorted(want):
            return "choices {} (reference {})".format(sorted(got), sorted(want))
        for i in want:
            g, w = got[i], want[i]
            if (g["text"], g["content"], g["finish_reason"]) != (w["text"], w["content"], w["finish_reason"]):
                return "choice {}: {!r} ({}) differs from the idle daemon's {!r} ({})".format(
                    i, g["text"] + g["content"], g["finish_reason"], w["text"] + w["content"], w["finish_reason"])
            if [t["function"] for t in g["tool_calls"]] != [t["function"] for t in w["tool_calls"]]:
                return "choice {}: tool calls {!r} differ from the idle daemon's".format(i, g["tool_calls"])
            if g["citations"] != w["citations"]:
                return "choice {}: citations {!r} differ from the idle daemon's {!r}".format(
                    i, g["citations"], w["citations"])
    if k.check and not o.cancelled:
        return k.check(k.variants[o.variant], {"choices": [dict(c, index=i) for i, c in got.items()]})
    return None


def compare_embeddings(reply, ref):
    got = [d["embedding"] for d in reply.get("data", [])]
    if len(got) != len(ref["vectors"]):
        return "embeddings: {} vectors, the reference has {}".format(len(got), len(ref["vectors"]))
    for a, b in zip(got, ref["vectors"]):
        if len(a) != len(b) or max(abs(x - y) for x, y in zip(a, b)) > 1e-5:
            return "embeddings: a vector differs from the idle daemon's"
    return None


# ---------------------------------------------------------------- /proc

def proc_tree(pid):
    """{name: pid} of the daemon and its worker processes (named by their --worker role)."""
    out = {"daemon": pid}
    kids = []
    try:
        for tid in os.listdir("/proc/{}/task".format(pid)):  # each thread lists the children it started
            with open("/proc/{}/task/{}/children".format(pid, tid)) as f:
                kids += [int(x) for x in f.read().split()]
    except OSError:
        pass
    for kid in kids:
        try:
            with open("/proc/{}/cmdline".format(kid), "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        name = "child{}".format(kid)
        if b"--worker" in argv:
            i = argv.index(b"--worker")
            if i + 1 < len(argv):
                name = argv[i + 1].decode()
        out[name] = kid
    return out


def proc_stats(pid):
    """RSS, its shared-memory part (the KV pool), fds and threads of one process, or None when gone."""
    try:
        st = {}
        with open("/proc/{}/status".format(pid)) as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("VmRSS", "RssShmem", "RssAnon", "RssFile", "Threads"):
                    st[key] = int(rest.split()[0])
        fds = len(os.listdir("/proc/{}/fd".format(pid)))
        return {"rss_kb": st["VmRSS"], "shmem_kb": st.get("RssShmem", 0), "anon_kb": st.get("RssAnon", 0),
                "private_kb": st["VmRSS"] - st.get("RssShmem", 0), "fds": fds, "threads": st["Threads"]}
    except (OSError, KeyError):
        return None


def snapshot_procs(pid):
    return {name: proc_stats(p) for name, p in proc_tree(pid).items()}


def pct(values, q):
    """Nearest-rank percentile (q in 0..100), None for no values."""
    if not values:
        return None
    s = sorted(values)
    return s[max(0, min(len(s) - 1, math.ceil(q / 100 * len(s)) - 1))]


# ---------------------------------------------------------------- the run

class soak:
    def __init__(self, args):
        self.a = args
        self.sock = args.socket
        self.rng = random.Random(args.seed)
        self.kinds = []
        self.refs = {}          # (kind, variant) -> reference
        self.done = []          # outcomes of the load phase
        self.failures = []      # (t, kind, variant, stream, why)
        self.samples = []
        self.sent = 0
        self.ids_seen = set()   # every response id of the load
        self.died = False       # the sampler saw the daemon or a worker gone
        self.stop_at = None
        self.t0 = None

    # the daemon's limits, and the references on the idle daemon
    async def setup(self):
        st = await get_json(self.sock, "/v1/tandem/status")
        models = await get_json(self.sock, "/v1/models")
        meta = models["data"][0].get("meta", {})
        lim = st["limits"]
        self.info = {"n_ctx": meta["n_ctx"], "n_vocab": meta["n_vocab"], "max_prompt_tokens": lim["max_prompt_tokens"],
                     "max_body_bytes": lim["max_body_bytes"], "max_tokens_limit": lim["max_tokens"],
                     "max_running": lim["max_running"], "kv_pages_total": st["kv_pages_total"],
                     "kv_page_size": st["kv_page_size"], "placement": st.get("placement"),
                     "model": models["data"][0]["id"]}
        self.kinds = catalogue(self.info)
        self.kind_by_name = {k.name: k for k in self.kinds}
        t = time.monotonic()
        conn = connection(self.sock)
        for k in self.kinds:
            if k.expect != 200 or not k.deterministic:
                continue
            for v in range(len(k.variants)):
                o = await perform(conn, k, v, False, 0)
                if o.error or o.status != 200:
                    raise SystemExit("soak: the reference for {} #{} failed: status {}, {} {!r}".format(
                        k.name, v, o.status, o.error, o.reply))
                if k.route == "/v1/embeddings":
                    self.refs[(k.name, v)] = {"vectors": [d["embedding"] for d in o.reply["data"]]}
                else:
                    self.refs[(k.name, v)] = {"choices": choices_of(o.reply, k.route)}
                    err = k.check(k.variants[v], o.reply | {"choices": [dict(c, index=i) for i, c in
                                                             self.refs[(k.name, v)]["choices"].items()]}) \
                        if k.check else None
                    if err:
                        raise SystemExit("soak: the idle daemon's reply to {} #{} fails its check: {}".format(
                            k.name, v, err))
        conn.drop()
        self.ref_seconds = time.monotonic() - t
        # speculation and plain decoding agree (greedy): the same prompt with and without drafts
        sp = self.kind_by_name["completion"]
        for v in range(2):
            body = dict(sp.variants[v])
            body["speculative"] = {"method": "off"} if "speculative" not in body else {"method": "ngram"}
            status, reply = await post_json(self.sock, "/v1/completions", body)
            want = self.refs[("completion", v)]["choices"][0]["text"]
            if status != 200 or reply["choices"][0]["text"] != want:
                raise SystemExit("soak: speculative decoding changes the greedy text of {!r}".format(body["prompt"]))
        await self.warm_lazy_paths(st)
        print("soak: {} references in {:.1f} s".format(len(self.refs), self.ref_seconds), file=sys.stderr)

    async def warm_lazy_paths(self, st):
        """What the workers build on first use, built before the idle baseline: a decode step of
        max_running x (1 + drafts) rows, 64 or more, runs on oneDNN, whose OpenMP threads start
        then (seen: the decode worker's threads 3 -> 4 and +1.9 MiB a minute into a run). One
        request of max_running prompts that share a cached prefix, each with that many tokens of
        its own, is such a step."""
        own = 1 + (st.get("speculative") or {}).get("draft_tokens", 0)
        page = self.info["kv_page_size"]
        prefix = [1] + [(i * 7) % (self.info["n_vocab"] - 40) + 30 for i in range(4 * page - 1)]
        prompts = [prefix + [(j * 11 + t) % (self.info["n_vocab"] - 40) + 30 for t in range(own)]
                   for j in range(self.info["max_running"])]
        for body in ({"prompt": [prefix], "max_tokens": 1}, {"prompt": prompts, "max_tokens": 2}):
            status, reply = await post_json(self.sock, "/v1/completions", dict(body, temperature=0))
            if status != 200:
                raise SystemExit("soak: the warm-up request failed: {} {!r}".format(status, reply))

    async def idle_snapshot(self):
        procs = snapshot_procs(self.a.pid)  # before this snapshot's own connection opens
        try:
            m = await metrics(self.sock)
        except (OSError, http_error, asyncio.IncompleteReadError):
            m = {}  # a dead daemon: every count unknown, every goal on them fails
        return {"procs": procs, "kv_pages_used": m.get("tandem_kv_pages_used"),
                "kv_pages_cached": m.get("tandem_kv_pages_cached"), "kv_tokens_stored": m.get("tandem_kv_tokens_stored"),
                "running": m.get("tandem_requests_running"), "waiting": m.get("tandem_requests_waiting"),
                "requests": requests_by_route(m), "metrics": m}

    # one client: requests back to back until the deadline
    async def client(self, cid):
        rng = random.Random(self.a.seed * 1000 + cid)
        conn = connection(self.sock)
        weights = [k.weight for k in self.kinds]
        while time.monotonic() < self.stop_at and self.sent < self.a.max_requests:
            self.sent += 1
            k = rng.choices(self.kinds, weights)[0]
            variant = rng.randrange(len(k.variants))
            stream = k.stream is not None and rng.random() < k.stream
            cancel_after = rng.randint(2, 12) if k.name == "cancel" else 0
            try:
                o = await asyncio.wait_for(perform(conn, k, variant, stream, cancel_after), REQUEST_TIMEOUT_S)
            except asyncio.TimeoutError:
                conn.drop()
                o = outcome(k.name, variant, stream, cancel_after)
                o.t_sent = o.t_first = o.t_done = time.monotonic()
                o.error = "no answer within {} s (lost)".format(REQUEST_TIMEOUT_S)
            why = judge(k, o, self.refs.get((k.name, variant)))
            for rid in o.ids:  # a reply seen twice (here, or on another connection) is a duplicate
                if rid in self.ids_seen:
                    why = why or "response id {} came twice".format(rid)
                self.ids_seen.add(rid)
            o.failed = why is not None
            if o.status is None:
                await asyncio.sleep(0.1)  # no daemon to answer: do not spin
            o.reply = None  # keep the memory flat over a long run
            o.choices = None
            self.done.append(o)
            if why:
                self.failures.append((round(o.t_sent - self.t0, 1), k.name, variant, stream, why))
        conn.drop()

    async def sampler(self):
        period = self.a.sample_s
        last = 0
        while True:
            t = time.monotonic()
            try:
                m = await metrics(self.sock)
            except (OSError, http_error, asyncio.IncompleteReadError) as e:
                m = {}
                self.failures.append((round(t - self.t0, 1), "sampler", 0, False, "/metrics: {}".format(e)))
            window = self.done[last:]
            last = len(self.done)
            gen = [o for o in window if o.status == 200 and not o.failed and not o.cancelled]
            ttft = [(o.t_first - o.t_sent) * 1000 for o in gen if o.stream]
            total = [(o.t_done - o.t_sent) * 1000 for o in gen]
            s = {"t": round(t - self.t0, 2), "procs": snapshot_procs(self.a.pid),
                 "kv_pages_used": m.get("tandem_kv_pages_used"), "kv_pages_cached": m.get("tandem_kv_pages_cached"),
                 "running": m.get("tandem_requests_running"), "waiting": m.get("tandem_requests_waiting"),
                 "preemptions": m.get("tandem_preemptions_total"), "worker_restarts": m.get("tandem_worker_restarts_total"),
                 "done": len(window), "failed": sum(o.failed for o in window),
                 "ttft_p50_ms": pct(ttft, 50), "ttft_p99_ms": pct(ttft, 99),
                 "total_p50_ms": pct(total, 50), "total_p99_ms": pct(total, 99),
                 "kinds": {}}
            for o in window:
                s["kinds"][o.kind] = s["kinds"].get(o.kind, 0) + 1
            self.samples.append(s)
            gone = [n for n, p in s["procs"].items() if p is None]
            if gone and not self.died:  # a crash: stop the load, judge what there is
                self.died = True
                self.failures.append((s["t"], "daemon", 0, False, "{} is gone (pid {})".format(
                    ", ".join(gone), self.a.pid if "daemon" in gone else "a worker's")))
                self.stop_at = t
            if t >= self.stop_at:
                return
            await asyncio.sleep(max(0.1, period - (time.monotonic() - t)))

    async def wait_idle(self, before=None):
        """Polls every 0.5 s until the daemon is idle and its counts are back to `before`'s, or, without
        `before`, the same twice in a row; gives up after IDLE_SETTLE_S. Returns the last snapshot."""
        def counts(snap):
            return ({n: (p["fds"], p["threads"]) if p else None for n, p in snap["procs"].items()},
                    snap["kv_pages_used"], snap["kv_tokens_stored"], snap["running"], snap["waiting"])
        deadline = time.monotonic() + IDLE_SETTLE_S
        last = None
        while True:
            snap = await self.idle_snapshot()
            idle = snap["running"] == 0 and snap["waiting"] == 0
            want = counts(before) if before else (counts(last) if last else None)
            if (idle and counts(snap) == want) or time.monotonic() > deadline:
                return snap
            last = snap
            await asyncio.sleep(0.5)

    async def wait_ready(self):
        """Until /health answers 200 (the model is loaded); exits 2 if the daemon dies or takes 2 minutes."""
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if (await one_shot(self.sock, "GET", "/health"))[0] == 200:
                    return
            except (OSError, http_error, asyncio.IncompleteReadError):
                pass
            if proc_stats(self.a.pid) is None:
                break
            await asyncio.sleep(0.1)
        raise SystemExit("soak: tandemd did not get ready")

    async def run(self):
        self.load_average = "{:.2f}, {:.2f}, {:.2f}".format(*os.getloadavg())  # the machine's, as we start
        await self.wait_ready()
        await self.setup()
        self.before = await self.wait_idle()  # the references' connections closed, all steady
        self.t0 = time.monotonic()
        self.stop_at = self.t0 + self.a.minutes * 60
        sampler = asyncio.create_task(self.sampler())
        await asyncio.gather(*[self.client(i) for i in range(self.a.clients)])
        self.load_s = time.monotonic() - self.t0
        self.stop_at = time.monotonic()
        await sampler
        t = time.monotonic()
        self.after = await self.wait_idle(self.before) if not self.died else await self.idle_snapshot()
        self.settle_s = time.monotonic() - t


# ---------------------------------------------------------------- goals

def goals(s):
    """[{name, ok, hard, measured, bound}] from a finished run."""
    out = []
    a = s.a
    T = s.load_s
    warm = min(300.0, 0.2 * T)          # warm-up: 20% of the run, at most 5 minutes
    win = warm                          # the latency windows: as long as the warm-up
    steady = [x for x in s.samples if x["t"] >= warm]

    def goal(name, ok, measured, bound, hard=True):
        out.append({"name": name, "ok": bool(ok), "hard": hard, "measured": measured, "bound": bound})

    n = len(s.done)
    lost = sum(1 for o in s.done if o.error and ("lost" in o.error or o.status is None))
    goal("every request answered correctly", not s.failures and n > 0,
         "{} requests, {} failed ({} without an answer)".format(n, len(s.failures), lost), "0 failed")

    # the daemon's own count of each reply equals ours: none lost, none duplicated
    routes = {k.route for k in s.kinds} | {"other"}
    ours = {}
    for o in s.done:
        if o.status is None:
            continue
        st = 499 if o.cancelled else o.status
        r = s.kind_by_name[o.kind].route if st != 413 else "other"  # refused before routing
        ours[(r, st)] = ours.get((r, st), 0) + 1
    b, e = s.before["requests"], s.after["requests"]
    theirs = {key: e[key] - b.get(key, 0) for key in e if key[0] in routes and e[key] != b.get(key, 0)}
    # a stream we closed may have finished (200) before the daemon saw us go: count the pair together
    def fold(d):
        f = {}
        for (r, st), v in d.items():
            key = (r, 200 if st in (200, 499) else st)
            f[key] = f.get(key, 0) + v
        return f
    mismatch = {"{} {}".format(*k): (fold(ours).get(k, 0), fold(theirs).get(k, 0))
                for k in set(fold(ours)) | set(fold(theirs)) if fold(ours).get(k, 0) != fold(theirs).get(k, 0)}
    goal("the daemon counted every reply once (tandem_requests_total)", not mismatch,
         "match" if not mismatch else "ours/daemon's: {}".format(mismatch), "equal per route and status")

    ran = {o.kind for o in s.done if not o.failed}
    missing = [k.name for k in s.kinds if k.name not in ran]
    pre = (s.after["metrics"].get("tandem_preemptions_total", 0) - s.before["metrics"].get("tandem_preemptions_total", 0))
    cancels = sum(1 for o in s.done if o.cancelled)
    goal("every kind of request ran; the load preempted", not missing and pre > 0 and cancels > 0,
         "{} kinds, {} preemptions, {} cancelled streams{}".format(len(ran), int(pre), cancels,
                                                                   ", missing: " + ", ".join(missing) if missing else ""),
         "all kinds, preemptions > 0")

    restarts = (s.after["metrics"].get("tandem_worker_restarts_total", 0)
                - s.before["metrics"].get("tandem_worker_restarts_total", 0))
    gone = [n for n, p in s.after["procs"].items() if p is None] + \
           [n for n in s.before["procs"] if n not in s.after["procs"]]
    goal("no process died", restarts == 0 and not gone,
         "{} worker restarts{}".format(int(restarts), ", gone: " + ", ".join(gone) if gone else ""), "0")

    # RSS less its shared-memory part (the KV pool, mapped by all three), per process, after warm-up
    rss_rows = []
    ok = True
    first = [x for x in steady if x["t"] < warm + win]
    last = [x for x in steady if x["t"] >= T - win]
    for name in s.before["procs"]:
        def peak(rows):
            v = [x["procs"][name]["private_kb"] for x in rows if x["procs"].get(name)]
            return max(v) if v else None
        p0, p1 = peak(first), peak(last)
        if p0 is None or p1 is None:
            ok = False
            rss_rows.append("{}: no samples".format(name))
            continue
        growth = (p1 - p0) / p0
        ok = ok and growth < 0.05
        rss_rows.append("{} {:.1f} -> {:.1f} MiB ({:+.1f}%)".format(name, p0 / 1024, p1 / 1024, 100 * growth))
    goal("RSS growth after warm-up under 5%", ok, "; ".join(rss_rows), "< 5% per process")

    for what in ("fds", "threads"):
        rows, ok = [], True
        for name, p0 in s.before["procs"].items():
            p1 = s.after["procs"].get(name)
            v0, v1 = p0[what] if p0 else None, p1[what] if p1 else None
            during = [x["procs"][name][what] for x in steady if x["procs"].get(name)]
            ok = ok and v0 is not None and v0 == v1
            rows.append("{} {} -> {} (load: {}-{})".format(name, v0, v1, min(during) if during else "?",
                                                          max(during) if during else "?"))
        goal("{} flat: idle before the load = idle after it".format("open fds" if what == "fds" else "threads"),
             ok, "; ".join(rows), "equal (0 tolerance)")

    def window_p99(lo, hi, f):
        v = [f(o) for o in s.done if lo <= o.t_sent - s.t0 < hi and o.status == 200 and not o.failed
             and not o.cancelled]
        return pct([x for x in v if x is not None], 99), len(v)
    rows, ok = [], True
    for label, f in (("total", lambda o: (o.t_done - o.t_sent) * 1000),
                     ("TTFT", lambda o: (o.t_first - o.t_sent) * 1000 if o.stream else None)):
        p0, n0 = window_p99(warm, warm + win, f)
        p1, n1 = window_p99(T - win, T + 1, f)
        if p0 and p1:
            ratio = p1 / p0
            ok = ok and ratio <= a.latency_ratio
            rows.append("{} P99 {:.0f} -> {:.0f} ms ({:.2f}x; {} and {} requests)".format(label, p0, p1, ratio, n0, n1))
        else:
            ok = False
            rows.append("{}: no requests in a window".format(label))
    goal("P99 latency stable: last window / first window after warm-up", ok, "; ".join(rows),
         "<= {:g}x".format(a.latency_ratio), hard=a.latency_ratio_hard)

    kv_ok = (s.after["kv_pages_used"] == s.before["kv_pages_used"] and s.after["running"] == 0
             and s.after["waiting"] == 0 and s.after["kv_tokens_stored"] == s.before["kv_tokens_stored"])
    goal("KV pages back to idle after the load", kv_ok,
         "pages used {} -> {}, tokens stored {} -> {}, prefix cache keeps {} -> {} free pages, "
         "running {}, waiting {} ({:.1f} s after the load)".format(*[
             "?" if v is None else int(v) for v in (
                 s.before["kv_pages_used"], s.after["kv_pages_used"], s.before["kv_tokens_stored"],
                 s.after["kv_tokens_stored"], s.before["kv_pages_cached"], s.after["kv_pages_cached"],
                 s.after["running"], s.after["waiting"])], s.settle_s),
         "pages used and tokens stored = idle before; nothing running or waiting")
    return out, warm, win


def write_outputs(s, out_dir):
    g, warm, win = goals(s)
    os.makedirs(out_dir, exist_ok=True)
    names = sorted(s.before["procs"])
    with open(os.path.join(out_dir, "samples.csv"), "w", newline="") as f:
        w = csv.writer(f)
        cols = ["t_s"]
        for n in names:
            cols += ["{}_{}".format(n, c) for c in ("rss_kb", "private_kb", "shmem_kb", "fds", "threads")]
        cols += ["kv_pages_used", "kv_pages_cached", "running", "waiting", "preemptions", "done", "failed",
                 "ttft_p50_ms", "ttft_p99_ms", "total_p50_ms", "total_p99_ms"]
        w.writerow(cols)
        for x in s.samples:
            row = [x["t"]]
            for n in names:
                p = x["procs"].get(n) or {}
                row += [p.get(c) for c in ("rss_kb", "private_kb", "shmem_kb", "fds", "threads")]
            row += [x[c] for c in cols[1 + 5 * len(names):]]
            w.writerow(row)
    per_kind = {}
    for o in s.done:
        d = per_kind.setdefault(o.kind, {"requests": 0, "failed": 0, "streamed": 0, "cancelled": 0})
        d["requests"] += 1
        d["failed"] += o.failed
        d["streamed"] += o.stream
        d["cancelled"] += o.cancelled
    gen = [o for o in s.done if o.status == 200 and not o.failed and not o.cancelled]
    result = {
        "load_average": s.load_average, "minutes": s.a.minutes, "clients": s.a.clients, "seed": s.a.seed, "sample_s": s.a.sample_s,
        "latency_ratio": s.a.latency_ratio, "daemon": s.info, "references": len(s.refs),
        "reference_s": round(s.ref_seconds, 1), "load_s": round(s.load_s, 1), "settle_s": round(s.settle_s, 1),
        "warmup_s": round(warm, 1), "window_s": round(win, 1), "requests": len(s.done),
        "failed": len(s.failures), "kinds": per_kind,
        "latency_ms": {"ttft_p50": pct([(o.t_first - o.t_sent) * 1000 for o in gen if o.stream], 50),
                       "ttft_p99": pct([(o.t_first - o.t_sent) * 1000 for o in gen if o.stream], 99),
                       "total_p50": pct([(o.t_done - o.t_sent) * 1000 for o in gen], 50),
                       "total_p99": pct([(o.t_done - o.t_sent) * 1000 for o in gen], 99)},
        "idle_before": {k: v for k, v in s.before.items() if k not in ("metrics", "requests")},
        "idle_after": {k: v for k, v in s.after.items() if k not in ("metrics", "requests")},
        "goals": g, "samples": s.samples,
        "failures": [list(f) for f in s.failures[:200]],
    }
    with open(os.path.join(out_dir, "result.json"), "w") as f:
        json.dump(result, f, indent=1)
    with open(os.path.join(out_dir, "failures.txt"), "w") as f:
        for t, kname, v, stream, why in s.failures:
            f.write("{:8.1f} s  {} #{}{}: {}\n".format(t, kname, v, " (stream)" if stream else "", why))
    return g


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--socket", required=True)
    ap.add_argument("--pid", type=int, required=True, help="tandemd's pid (its workers are found as its children)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--minutes", type=float, default=30)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--sample-s", type=float, default=5)
    ap.add_argument("--max-requests", type=int, default=2_000_000)
    ap.add_argument("--latency-ratio", type=float, default=1.5)
    ap.add_argument("--latency-soft", dest="latency_ratio_hard", action="store_false",
                    help="report the latency goal, do not fail on it")
    a = ap.parse_args()
    s = soak(a)
    asyncio.run(s.run())
    g = write_outputs(s, a.out)
    bad = 0
    for x in g:
        mark = "ok  " if x["ok"] else ("FAIL" if x["hard"] else "warn")
        print("soak: {} {}: {} (bound: {})".format(mark, x["name"], x["measured"], x["bound"]), file=sys.stderr)
        bad += x["hard"] and not x["ok"]
    for f in s.failures[:10]:
        print("soak: failure at {} s: {} #{}{}: {}".format(f[0], f[1], f[2], " (stream)" if f[3] else "", f[4]),
              file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
