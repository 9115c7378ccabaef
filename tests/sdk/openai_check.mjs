// The OpenAI Node SDK against tandemd: guided generation through response_format, plain and
// streamed. Run by scripts/sdk-check.sh (it needs the npm registry once, so it is not in CI).
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
const messages = [{ role: 'user', content: 'Describe a movie as JSON.' }];
let n = 0;
for (let seed = 1; seed <= 5; ++seed) {
  const r = await client.chat.completions.create({ model: 'stories260K', messages, response_format, seed, max_tokens: 300 });
  assert.equal(r.choices[0].finish_reason, 'stop');
  check(JSON.parse(r.choices[0].message.content));
  ++n;

  const stream = await client.chat.completions.create({ model: 'stories260K', messages, response_format, seed, max_tokens: 300, stream: true });
  let text = '';
  for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? '';
  assert.equal(text, r.choices[0].message.content, 'streamed and plain differ for one seed');
  ++n;
}

// What cannot be honoured is a 400 naming it, which the SDK raises.
await assert.rejects(
  client.chat.completions.create({ model: 'stories260K', messages, max_tokens: 5,
    response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'array', uniqueItems: true } } } }),
  (e) => e.status === 400 && /uniqueItems/.test(e.message));
const { version } = JSON.parse(readFileSync(new URL('./node_modules/openai/package.json', import.meta.url)));
console.log(`openai ${version}: ${n} schema-valid replies (plain and streamed), and the 400`);
