// The OpenAI SDK and a reasoning model (a synthetic Qwen3-like model with <think> tokens, its
// reply forced through the markers: a logit bias opens the thinking, max_reasoning_tokens
// closes it): reasoning_content plain and streamed, never in content. Run by scripts/sdk-check.sh.
import OpenAI from 'openai';
import assert from 'node:assert/strict';

const client = new OpenAI({ baseURL: process.env.TANDEM_URL, apiKey: 'none' });
const think = process.env.THINK_TOKEN;
const body = { model: 'qwen3-like', messages: [{ role: 'user', content: 'What is 2+2?' }], max_tokens: 16,
  temperature: 0, logit_bias: { [think]: 100 }, max_reasoning_tokens: 4 };
const r = await client.chat.completions.create(body);
const msg = r.choices[0].message;
assert.ok(msg.reasoning_content.length > 0, 'no reasoning_content');
assert.ok(!msg.content.includes('think>'), 'thinking in content');
assert.equal(r.usage.completion_tokens_details.reasoning_tokens, 6);
let reasoning = '', content = '';
for await (const c of await client.chat.completions.create({ ...body, stream: true })) {
  reasoning += c.choices[0]?.delta?.reasoning_content ?? '';
  content += c.choices[0]?.delta?.content ?? '';
}
assert.equal(reasoning, msg.reasoning_content);
assert.equal(content, msg.content);
console.log('reasoning through the openai sdk: ok');
