// The Anthropic TypeScript SDK against tandemd (stories260K): messages.create plain and
// streamed (text identical to Chat Completions' greedy text), a tool use round trip,
// count_tokens, and an error in Anthropic's shape. Run by scripts/sdk-check.sh.
import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import assert from 'node:assert/strict';

const base = process.env.TANDEM_URL.replace(/\/v1$/, '');
const client = new Anthropic({ baseURL: base, apiKey: 'none' });
const openai = new OpenAI({ baseURL: process.env.TANDEM_URL, apiKey: 'none' });
const model = 'stories260K';
const messages = [{ role: 'user', content: 'Once upon a time' }];

const chat = await openai.chat.completions.create({ model, messages, max_tokens: 16, temperature: 0 });
const want = chat.choices[0].message.content;

const m = await client.messages.create({ model, messages, max_tokens: 16, temperature: 0 });
assert.equal(m.type, 'message');
assert.equal(m.content[0].type, 'text');
assert.equal(m.content[0].text, want, 'messages.create and chat.completions differ');
assert.equal(m.stop_reason, 'max_tokens');
assert.equal(m.usage.input_tokens, chat.usage.prompt_tokens);

// streamed: the SDK's accumulator gives the same message
const stream = client.messages.stream({ model, messages, max_tokens: 16, temperature: 0 });
let text = '';
stream.on('text', (t) => { text += t; });
const final = await stream.finalMessage();
assert.equal(text, want);
assert.equal(final.content[0].text, want);
assert.equal(final.stop_reason, 'max_tokens');

// count_tokens
const counted = await client.messages.countTokens({ model, messages });
assert.equal(counted.input_tokens, m.usage.input_tokens);

// tool use: a call (tool_choice any), then its result sent back
const tools = [{ name: 'get_weather', description: 'Weather now',
  input_schema: { type: 'object', properties: { city: { type: 'string', maxLength: 12 } }, required: ['city'] } }];
const call = await client.messages.create({ model, messages, tools, tool_choice: { type: 'any', disable_parallel_tool_use: true }, max_tokens: 120, temperature: 0 });
assert.equal(call.stop_reason, 'tool_use');
const use = call.content.find((b) => b.type === 'tool_use');
assert.equal(use.name, 'get_weather');
assert.equal(typeof use.input.city, 'string');
const streamedCall = await client.messages.stream({ model, messages, tools, tool_choice: { type: 'any', disable_parallel_tool_use: true }, max_tokens: 120,
  temperature: 0 }).finalMessage();
assert.deepEqual(streamedCall.content.find((b) => b.type === 'tool_use').input, use.input);
const after = await client.messages.create({ model, tools, max_tokens: 8, temperature: 0, messages: [
  ...messages,
  { role: 'assistant', content: call.content },
  { role: 'user', content: [{ type: 'tool_result', tool_use_id: use.id, content: '18 C' }] },
] });
assert.equal(after.type, 'message');

// an error: the SDK's typed error with Anthropic's shape
await assert.rejects(
  client.messages.create({ model, messages, max_tokens: 4, top_k: -3 }),
  (e) => e instanceof Anthropic.BadRequestError && e.error?.type === 'error' && /top_k/.test(e.error.error.message));
console.log('anthropic sdk: ok');
