// Greedy token ids of a GGUF, Tandem's against llama.cpp's (not part of the test suite): runs
// `tandem run --json` (F32 weights and KV: the engine at the reference's precision, greedy),
// then llama.cpp through the npm package node-llama-cpp (its prebuilt CPU binaries) on the
// same prompt ids, and prints both and where they first differ. Nothing from npm is committed.
//
//   cd /tmp && npm install node-llama-cpp@3.22.1
//   NODE_PATH=/tmp/node_modules node scripts/llama-greedy-check.mjs build/daemon/tandem MODEL.gguf [N] [PROMPT]
//
// Exit status 0 when the ids agree, 1 when they differ (a near tie is for the reader to judge:
// the JSON line has both sequences).
import { execFileSync } from 'node:child_process';
import { createRequire } from 'node:module';

const [tandem, modelPath, nArg, promptArg] = process.argv.slice(2);
if (!tandem || !modelPath) {
    console.error('usage: node llama-greedy-check.mjs TANDEM MODEL.gguf [N] [PROMPT]');
    process.exit(2);
}
const n = Number(nArg ?? 24);
const prompt = promptArg ?? 'Once upon a time there was a little girl';

const ours = JSON.parse(execFileSync(tandem, ['run', '-m', modelPath, '-p', prompt, '-n', String(n), '--temp', '0',
    '--ignore-eos', '--json', '--weights', 'f32', '--kv', 'f32', '--log', 'error'], { encoding: 'utf8' }));

const require = createRequire(process.env.NODE_PATH ? process.env.NODE_PATH + '/' : import.meta.url);
const { getLlama } = await import(require.resolve('node-llama-cpp'));
const llama = await getLlama({ gpu: false, build: 'never', logLevel: 'error' });
const model = await llama.loadModel({ modelPath });
const context = await model.createContext({ contextSize: 512, batchSize: 512, threads: 2 });
const sequence = context.getSequence();
const theirs = [];
for await (const token of sequence.evaluate(ours.prompt_tokens, { temperature: 0 })) {
    theirs.push(Number(token));
    if (theirs.length >= n) break;
}
let first = -1;
for (let i = 0; i < n; ++i) if (ours.tokens[i] !== theirs[i]) { first = i; break; }
console.log(JSON.stringify({ model: modelPath, prompt_tokens: ours.prompt_tokens, tandem: ours.tokens, llama_cpp: theirs,
    agree: first < 0, first_difference: first }));
await context.dispose();
await model.dispose();
process.exit(first < 0 ? 0 : 1);
