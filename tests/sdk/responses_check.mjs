// The OpenAI SDK's Responses interface against tandemd (stories260K): responses.create (text
// identical to chat.completions' greedy text), streamed, a function call round trip through
// previous_response_id, retrieve and delete. Run by scripts/sdk-check.sh.
import OpenAI from 'openai';
import assert from 'node:assert/strict';

const client = new OpenAI({ baseURL: process.env.TANDEM_URL, apiKey: 'none' });
const model = 'stories260K';

const chat = await client.chat.completions.create({ model, max_tokens: 16, temperature: 0,
  messages: [{ role: 'user', content: 'Once upon a time' }] });
const want = chat.choices[0].message.content;

const r = await client.responses.create({ model, input: 'Once upon a time', max_output_tokens: 16, temperature: 0 });
assert.equal(r.output_text, want, 'responses.create and chat.completions differ');
assert.equal(r.status, 'incomplete');

let text = '';
let done;
const stream = await client.responses.create({ model, input: 'Once upon a time', max_output_tokens: 16, temperature: 0,
  stream: true, store: false });
for await (const ev of stream) {
  if (ev.type === 'response.output_text.delta') text += ev.delta;
  if (ev.type === 'response.incomplete' || ev.type === 'response.completed') done = ev.response;
}
assert.equal(text, want);
assert.ok(done);

const tools = [{ type: 'function', name: 'get_weather', description: 'Weather now', strict: false,
  parameters: { type: 'object', properties: { city: { type: 'string', maxLength: 12 } }, required: ['city'] } }];
const call = await client.responses.create({ model, input: 'Weather in Paris?', tools, tool_choice: 'required', parallel_tool_calls: false,
  max_output_tokens: 120, temperature: 0 });
const fc = call.output.find((o) => o.type === 'function_call');
assert.equal(fc.name, 'get_weather');
assert.equal(typeof JSON.parse(fc.arguments).city, 'string');
const next = await client.responses.create({ model, previous_response_id: call.id, tools, max_output_tokens: 8,
  temperature: 0, input: [{ type: 'function_call_output', call_id: fc.call_id, output: '18 C' }] });
assert.equal(next.object, 'response');
const got = await client.responses.retrieve(call.id);
assert.deepEqual(got.output, call.output);
await client.responses.delete(call.id);
await assert.rejects(client.responses.retrieve(call.id), (e) => e.status === 404);
await assert.rejects(client.responses.create({ model, input: 'hi', tools: [{ type: 'web_search' }] }),
  (e) => e.status === 400 && /tools\[0\]\.type/.test(e.message));
console.log('responses through the openai sdk: ok');
