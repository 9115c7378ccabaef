// The OpenAI Node SDK's batch flow against tandemd over its Unix socket: files.create,
// batches.create, batches.retrieve until it ends, files.content of the output, and
// batches.cancel of a second job. The SDK speaks HTTP through `fetch`; this one sends each
// request over the socket (node:http with socketPath). Run by scripts/sdk-check.sh.
import OpenAI, { toFile } from 'openai';
import assert from 'node:assert/strict';
import http from 'node:http';
import { readFileSync } from 'node:fs';

const socketPath = process.env.TANDEM_SOCKET;

// fetch over the Unix socket: the Request serializes the body (a multipart form included).
async function unixFetch(url, init) {
  const req = new Request(url, init);
  const body = req.body ? Buffer.from(await req.arrayBuffer()) : undefined;
  const u = new URL(req.url);
  const headers = Object.fromEntries(req.headers);
  if (body) headers['content-length'] = String(body.length);
  return new Promise((resolve, reject) => {
    const r = http.request({ socketPath, path: u.pathname + u.search, method: req.method, headers }, (res) => {
      const chunks = [];
      res.on('data', (c) => chunks.push(c));
      res.on('end', () => {
        const h = new Headers();
        for (const [k, v] of Object.entries(res.headers)) h.set(k, Array.isArray(v) ? v.join(', ') : v);
        const status = res.statusCode;
        resolve(new Response(status === 204 ? null : Buffer.concat(chunks), { status, headers: h }));
      });
    });
    r.on('error', reject);
    if (body) r.write(body);
    r.end();
  });
}

const client = new OpenAI({ baseURL: 'http://tandem/v1', apiKey: 'none', fetch: unixFetch });

const n = 6;
const lines = [];
for (let i = 0; i < n; ++i)
  lines.push(JSON.stringify({ custom_id: `req-${i}`, method: 'POST', url: '/v1/chat/completions',
    body: { model: 'stories260K', messages: [{ role: 'user', content: `Tell me story ${i}` }], max_tokens: 16 } }));
const input = await client.files.create({ file: await toFile(Buffer.from(lines.join('\n') + '\n'), 'in.jsonl'),
  purpose: 'batch' });
assert.equal(input.purpose, 'batch');
assert.equal(input.filename, 'in.jsonl');

const job = await client.batches.create({ input_file_id: input.id, endpoint: '/v1/chat/completions',
  completion_window: '24h', metadata: { run: 'sdk-check' } });
// A second job, cancelled: it waits behind the first, so the cancel ends it.
const second = await client.batches.create({ input_file_id: input.id, endpoint: '/v1/chat/completions',
  completion_window: '24h' });
const cancelled = await client.batches.cancel(second.id);
assert.ok(['cancelling', 'cancelled'].includes(cancelled.status), cancelled.status);

let b = job;
const statuses = new Set([b.status]);
for (let tries = 0; tries < 600 && !['completed', 'failed', 'cancelled', 'expired'].includes(b.status); ++tries) {
  await new Promise((r) => setTimeout(r, 100));
  b = await client.batches.retrieve(job.id);
  statuses.add(b.status);
}
assert.equal(b.status, 'completed');
assert.deepEqual(b.request_counts, { total: n, completed: n, failed: 0 });
assert.deepEqual(b.metadata, { run: 'sdk-check' });
const output = await (await client.files.content(b.output_file_id)).text();
const results = output.trim().split('\n').map((l) => JSON.parse(l));
assert.deepEqual(results.map((r) => r.custom_id).sort(), lines.map((l) => JSON.parse(l).custom_id).sort());
for (const r of results) {
  assert.equal(r.response.status_code, 200);
  assert.ok(r.response.body.choices[0].message.content.length > 0);
}
let s = await client.batches.retrieve(second.id);
for (let tries = 0; tries < 100 && s.status !== 'cancelled'; ++tries) {
  await new Promise((r) => setTimeout(r, 100));
  s = await client.batches.retrieve(second.id);
}
assert.equal(s.status, 'cancelled');

const listed = [];
for await (const x of client.batches.list({ limit: 1 })) listed.push(x.id);
assert.ok(listed.includes(job.id) && listed.includes(second.id), 'batches.list pages through both');
const files = [];
for await (const f of client.files.list()) files.push(f.id);
assert.ok(files.includes(input.id) && files.includes(b.output_file_id));
await assert.rejects(client.files.create({ file: await toFile(Buffer.from('x'), 'x.jsonl'), purpose: 'fine-tune' }),
  (e) => e.status === 400 && /purpose/.test(e.message));
const deleted = await client.files.del ? await client.files.del(b.output_file_id) : await client.files.delete(b.output_file_id);
assert.equal(deleted.deleted, true);

const { version } = JSON.parse(readFileSync(new URL('./node_modules/openai/package.json', import.meta.url)));
console.log(`openai ${version} over the Unix socket: a file uploaded, a batch of ${n} run (${[...statuses].join(' -> ')}),` +
  ` its output read, a second batch cancelled, both listed, a file deleted, a bad purpose refused`);
