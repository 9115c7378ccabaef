// ollama-js against tandemd (stories260K) under /api/: chat (text identical to Chat
// Completions' greedy text), streamed generate, embed, list, show. Run by scripts/sdk-check.sh.
import { Ollama } from 'ollama';
import OpenAI from 'openai';
import assert from 'node:assert/strict';

const host = process.env.TANDEM_URL.replace(/\/v1$/, '');
const ollama = new Ollama({ host });
const openai = new OpenAI({ baseURL: process.env.TANDEM_URL, apiKey: 'none' });
const model = 'stories260K';
const messages = [{ role: 'user', content: 'Once upon a time' }];

const chat = await openai.chat.completions.create({ model, messages, max_tokens: 16, temperature: 0 });
const want = chat.choices[0].message.content;

const r = await ollama.chat({ model, messages, options: { temperature: 0, num_predict: 16 } });
assert.equal(r.message.content, want, 'ollama chat and chat.completions differ');
assert.equal(r.done, true);

let text = '';
let last;
for await (const part of await ollama.generate({ model, prompt: 'Once upon a time', stream: true,
  options: { temperature: 0, num_predict: 16 } })) {
  text += part.response;
  last = part;
}
assert.equal(text, want);
assert.equal(last.done, true);
assert.equal(last.eval_count, 16);

const e = await ollama.embed({ model, input: ['Once upon a time', 'Lily'] });
const oe = await openai.embeddings.create({ model, input: ['Once upon a time', 'Lily'] });
assert.deepEqual(e.embeddings[1], oe.data[1].embedding);

const list = await ollama.list();
assert.equal(list.models[0].name, 'stories260K:latest');
const show = await ollama.show({ model });
assert.equal(show.details.format, 'gguf');
const ver = await ollama.version();
assert.equal(typeof ver.version, 'string');
console.log('ollama sdk: ok');
