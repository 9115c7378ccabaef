// llama.cpp's prefill and batch-1 decode speed on a GGUF, through the npm package
// node-llama-cpp (its prebuilt CPU binaries), for side-by-side figures with `tandem bench`
// (not part of the test suite; nothing from npm is committed).
//
//   cd /tmp && npm install node-llama-cpp@3.22.1
//   NODE_PATH=/tmp/node_modules node scripts/llama-bench.mjs MODEL.gguf [N_PROMPT] [N_GEN] [THREADS]
import { createRequire } from 'node:module';

const [modelPath, pArg, nArg, tArg] = process.argv.slice(2);
if (!modelPath) {
    console.error('usage: node llama-bench.mjs MODEL.gguf [N_PROMPT] [N_GEN] [THREADS]');
    process.exit(2);
}
const nPrompt = Number(pArg ?? 512), nGen = Number(nArg ?? 32), threads = Number(tArg ?? 2);
const require = createRequire(process.env.NODE_PATH ? process.env.NODE_PATH + '/' : import.meta.url);
const { getLlama } = await import(require.resolve('node-llama-cpp'));
const llama = await getLlama({ gpu: false, build: 'never', logLevel: 'error' });
const model = await llama.loadModel({ modelPath });
const nVocab = model.tokens.vocabularySize ?? 32000;
// Seeded ids past the specials, as tandem bench's random prompt.
let s = 1;
const rand = () => ((s = (s * 1103515245 + 12345) % 2147483648) / 2147483648);
const prompt = Array.from({ length: nPrompt }, () => 3 + Math.floor(rand() * (nVocab - 3)));
const result = {};
for (let rep = 0; rep < 2; ++rep) { // the first run warms up
    const context = await model.createContext({ contextSize: nPrompt + nGen + 8, batchSize: nPrompt, threads });
    const sequence = context.getSequence();
    const t0 = performance.now();
    let t1 = 0, n = 0;
    for await (const token of sequence.evaluate(prompt, { temperature: 0 })) {
        void token;
        if (n === 0) t1 = performance.now(); // the prompt's step and its first token
        if (++n > nGen) break; // (a greedy EOS ends the generator early: n_decoded says)
    }
    const t2 = performance.now();
    result.prefill_tok_s = nPrompt / ((t1 - t0) / 1000);
    result.n_decoded = n - 1;
    result.decode_tok_s = (n - 1) / ((t2 - t1) / 1000);
    await context.dispose();
}
console.log(JSON.stringify({ model: modelPath, n_prompt: nPrompt, n_gen: nGen, threads, ...result }));
await model.dispose();
