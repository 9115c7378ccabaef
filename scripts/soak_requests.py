"""The soak's requests (scripts/soak.py): HTTP/1.1 over tandemd's Unix socket by hand, the
catalogue of request kinds the clients draw from, and how one request is sent, read and judged.

Python 3 standard library only.
"""
import asyncio
import json
import re
import time


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
         {"messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "text", "frobnicate": 1}},
         {"messages": [{"role": "user", "content": "hi", "name": "ann"}], "max_tokens": 8}]  # nested keys too
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


UNKNOWN_FIELDS = ("frobnicate", "echo", "stream_options", "speculative", "response_format", "messages[0].name")


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
