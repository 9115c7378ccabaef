// The OpenAI Node SDK against tandemd: guided generation through response_format, tool
// calls with tool_choice "required", plain and streamed; beam search and prompt scoring;
// documents and citations. Run by scripts/sdk-check.sh (it needs the npm registry once, so it is not in CI).
import OpenAI from 'openai';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';

const client = new OpenAI({ baseURL: process.env.TANDEM_URL, apiKey: 'none' });
const schema = {
  type: 'object',
  properties: {
    title: { type: 'string', maxLength: 20 },
    year: { type: 'integer', minimum: 1900, maximum: 2100 },
    genres: { type: 'array', items: { enum: ['drama', 'comedy', 'horror'] }, maxItems: 3 },
  },
  required: ['title', 'year', 'genres'],
};

// The schema's own checks, written here: the daemon's output must meet them.
function check(v) {
  assert.equal(typeof v.title, 'string');
  assert.ok([...v.title].length <= 20, `title too long: ${v.title}`);
  assert.ok(Number.isInteger(v.year) && v.year >= 1900 && v.year <= 2100, `year ${v.year}`);
  assert.ok(Array.isArray(v.genres) && v.genres.length <= 3);
  for (const g of v.genres) assert.ok(['drama', 'comedy', 'horror'].includes(g), `genre ${g}`);
  assert.deepEqual(Object.keys(v).sort(), ['genres', 'title', 'year']);
}

const response_format = { type: 'json_schema', json_schema: { name: 'movie', schema, strict: true } };
// whitespace 'compact' (Tandem's extension, passed through by the SDK): the 260K-parameter demo
// model, free to write a line break and spaces between tokens (the default), pads until
// max_tokens; this checks the SDK's path, not the model's taste in layout.
const whitespace = 'compact';
const messages = [{ role: 'user', content: 'Describe a movie as JSON.' }];
let n = 0;
for (let seed = 1; seed <= 5; ++seed) {
  const r = await client.chat.completions.create({ model: 'stories260K', messages, response_format, whitespace, seed, max_tokens: 300 });
  assert.equal(r.choices[0].finish_reason, 'stop');
  check(JSON.parse(r.choices[0].message.content));
  ++n;

  const stream = await client.chat.completions.create({ model: 'stories260K', messages, response_format, whitespace, seed, max_tokens: 300, stream: true });
  let text = '';
  for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? '';
  assert.equal(text, r.choices[0].message.content, 'streamed and plain differ for one seed');
  ++n;
}

// Tool calls: with tool_choice "required" every reply is a call to an offered function whose
// arguments meet its parameters.
const tools = [
  { type: 'function', function: { name: 'get_weather', description: 'Weather now',
    parameters: { type: 'object', properties: { city: { type: 'string', maxLength: 16 },
      unit: { enum: ['c', 'f'] } }, required: ['city', 'unit'] } } },
  { type: 'function', function: { name: 'get_time', parameters: { type: 'object', properties: {} } } },
];
function checkCall(call) {
  assert.equal(call.type, 'function');
  assert.match(call.id, /^call_[A-Za-z0-9]{24}$/);
  const args = JSON.parse(call.function.arguments);
  if (call.function.name === 'get_weather') {
    assert.equal(typeof args.city, 'string');
    assert.ok([...args.city].length <= 16);
    assert.ok(['c', 'f'].includes(args.unit));
    assert.deepEqual(Object.keys(args).sort(), ['city', 'unit']);
  } else {
    assert.equal(call.function.name, 'get_time');
    assert.deepEqual(args, {});
  }
}
const ask = [{ role: 'user', content: 'What is the weather in Paris?' }];
let nCalls = 0;
for (let seed = 1; seed <= 4; ++seed) {
  const req = { model: 'stories260K', messages: ask, tools, tool_choice: 'required', parallel_tool_calls: false,
    seed, max_tokens: 200, temperature: 1 };
  const r = await client.chat.completions.create(req);
  assert.equal(r.choices[0].finish_reason, 'tool_calls');
  assert.equal(r.choices[0].message.tool_calls.length, 1);
  checkCall(r.choices[0].message.tool_calls[0]);
  ++nCalls;

  // Streamed, put together by the SDK's own accumulator.
  const stream = client.chat.completions.stream(req);
  const done = await stream.finalChatCompletion();
  assert.equal(done.choices[0].finish_reason, 'tool_calls');
  const call = done.choices[0].message.tool_calls[0];
  checkCall(call);
  assert.deepEqual(call.function, r.choices[0].message.tool_calls[0].function, 'streamed and plain differ for one seed');
  ++nCalls;

  // The call's result sent back: the history is accepted.
  const next = await client.chat.completions.create({ model: 'stories260K', max_tokens: 8, tools,
    messages: [...ask, r.choices[0].message, { role: 'tool', tool_call_id: call.id, content: '18 C' }] });
  assert.ok(['stop', 'length', 'tool_calls'].includes(next.choices[0].finish_reason));
}

// What cannot be honoured is a 400 naming it, which the SDK raises.
await assert.rejects(
  client.chat.completions.create({ model: 'stories260K', messages, max_tokens: 5,
    response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'array', uniqueItems: true } } } }),
  (e) => e.status === 400 && /uniqueItems/.test(e.message));
// Beam search as extra body fields: the choices best first, each with its score; streamed,
// the same choices (sent when the search ends). Prompt scoring: echo, logprobs, max_tokens 0.
const beamReq = { model: 'stories260K', prompt: 'Once upon a time', max_tokens: 12, n: 2, best_of: 4,
  use_beam_search: true, length_penalty: 1.0, early_stopping: true };
const beams = await client.completions.create(beamReq);
assert.equal(beams.choices.length, 2);
assert.ok(beams.choices.every((c) => typeof c.score === 'number' && c.cumulative_logprob < 0));
assert.ok(beams.choices[0].score >= beams.choices[1].score);
const texts = ['', ''];
for await (const chunk of await client.completions.create({ ...beamReq, stream: true }))
  for (const c of chunk.choices) texts[c.index] += c.text;
assert.deepEqual(texts, beams.choices.map((c) => c.text), 'streamed beams differ');
const scored = await client.completions.create({ model: 'stories260K', prompt: 'Once upon a time', max_tokens: 0,
  echo: true, logprobs: 1 });
assert.equal(scored.choices[0].text, 'Once upon a time');
assert.equal(scored.choices[0].logprobs.token_logprobs[0], null);
assert.ok(scored.choices[0].logprobs.token_logprobs.slice(1).every((x) => x < 0));
await assert.rejects(client.completions.create({ ...beamReq, temperature: 0.8 }),
  (e) => e.status === 400 && /temperature/.test(e.message));

// Grounding: documents as an extra body field, citations read from the raw response.
const story = (await client.completions.create({ model: 'stories260K', prompt: 'Once upon a time', max_tokens: 120,
  temperature: 0 })).choices[0].text;
const grounded = await client.chat.completions.create({ model: 'stories260K', max_tokens: 120, seed: 2,
  messages: [{ role: 'user', content: 'Tell me the story.' }], documents: [{ id: 'story', text: story }],
  citation_options: { min_tokens: 3 } });
const { citations } = grounded.choices[0].message;
assert.ok(Array.isArray(citations) && citations.length > 0, 'no citations');
const content = [...grounded.choices[0].message.content];
for (const c of citations) {
  assert.equal(content.slice(c.start, c.end).join(''), c.text);
  assert.equal(c.document_id, 'story');
}

// Embeddings: the SDK asks for base64 by default and decodes it; float as asked. Both are unit
// vectors, the same to float32 precision.
const inputs = ['Once upon a time', 'The dog ran to the park.'];
const emb = await client.embeddings.create({ model: 'stories260K', input: inputs });
const embFloat = await client.embeddings.create({ model: 'stories260K', input: inputs, encoding_format: 'float' });
assert.equal(emb.data.length, 2);
assert.equal(emb.usage.prompt_tokens, emb.usage.total_tokens);
for (let i = 0; i < 2; ++i) {
  const v = emb.data[i].embedding, w = embFloat.data[i].embedding;
  assert.equal(emb.data[i].index, i);
  assert.equal(v.length, w.length);
  assert.ok(Math.abs(v.reduce((s, x) => s + x * x, 0) - 1) < 1e-5, 'not a unit vector');
  assert.ok(v.every((x, j) => Math.abs(x - w[j]) < 1e-6), 'base64 and float differ');
}
await assert.rejects(client.embeddings.create({ model: 'stories260K', input: 'x', dimensions: 8 }),
  (e) => e.status === 400 && /dimensions/.test(e.message));

// Context limits: a prompt past the context is a 400 the SDK raises with the daemon's message;
// truncate_prompt_tokens (vLLM's field, passed through) keeps the last tokens, and the usage the
// SDK returns keeps truncated_prompt_tokens, plain and in a streamed usage chunk.
const long = 'Lily saw a dog. '.repeat(600);
await assert.rejects(client.completions.create({ model: 'stories260K', prompt: long, max_tokens: 4 }),
  (e) => e.status === 400 && e.code === 'context_length_exceeded' && /more than the 2047/.test(e.message));
const cut = await client.completions.create({ model: 'stories260K', prompt: long, max_tokens: 4, temperature: 0,
  truncate_prompt_tokens: 64 });
assert.equal(cut.usage.prompt_tokens, 64);
assert.ok(cut.usage.truncated_prompt_tokens > 2000, 'no truncated_prompt_tokens');
let cutUsage = null;
for await (const chunk of await client.chat.completions.create({ model: 'stories260K', max_tokens: 4,
  messages: [{ role: 'user', content: long }], truncate_prompt_tokens: 64, stream: true,
  stream_options: { include_usage: true } }))
  if (chunk.usage) cutUsage = chunk.usage;
assert.equal(cutUsage.prompt_tokens, 64);
assert.ok(cutUsage.truncated_prompt_tokens > 2000);

const { version } = JSON.parse(readFileSync(new URL('./node_modules/openai/package.json', import.meta.url)));
console.log(`openai ${version}: ${n} schema-valid replies and ${nCalls} valid tool calls (plain and streamed), ` +
  `${beams.choices.length} beams with scores (plain and streamed), a scored prompt, ` +
  `${citations.length} citations, ${emb.data.length} embeddings (base64 and float), prompts cut by ` +
  `truncate_prompt_tokens (plain and streamed), and the 400s`);
