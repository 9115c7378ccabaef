// Writes a vocabulary-only GGUF of Llama 3's tokenizer (128,256 tokens: byte-level BPE, pre
// "llama-bpe"), for `tandem guide bench` and the guided-generation tests, from the npm package
// llama3-tokenizer-js, which ships Llama 3's vocabulary and merges. The result is never committed.
//
//   npm pack llama3-tokenizer-js@1.2.0 && tar xzf llama3-tokenizer-js-1.2.0.tgz
//   node scripts/llama3-vocab.mjs package/bundle/llama3-tokenizer-with-baked-data.js build/ggml-vocab-llama3.gguf
import { writeFileSync } from 'node:fs';
import { pathToFileURL } from 'node:url';
import { resolve } from 'node:path';

const [bundle, out] = process.argv.slice(2);
if (!bundle || !out) {
    console.error('usage: node llama3-vocab.mjs BUNDLE.js OUT.gguf');
    process.exit(2);
}
const tok = (await import(pathToFileURL(resolve(bundle)).href)).default;
const tokens = tok.vocabById;
const n_special = 256; // the last 256 ids are the special tokens (<|begin_of_text|>, ...)
const merges = [...tok.merges.entries()].sort((a, b) => a[1] - b[1]).map(([pair]) => pair);

const chunks = [];
const u32 = (v) => { const b = Buffer.alloc(4); b.writeUInt32LE(v); chunks.push(b); };
const i32 = (v) => { const b = Buffer.alloc(4); b.writeInt32LE(v); chunks.push(b); };
const u64 = (v) => { const b = Buffer.alloc(8); b.writeBigUInt64LE(BigInt(v)); chunks.push(b); };
const str = (s) => { const b = Buffer.from(s, 'utf8'); u64(b.length); chunks.push(b); };
const T = { u32: 4, i32: 5, bool: 7, str: 8, arr: 9 };
const kvs = [
    ['general.architecture', T.str, 'llama'],
    ['general.name', T.str, 'llama-3 vocabulary (llama3-tokenizer-js)'],
    ['tokenizer.ggml.model', T.str, 'gpt2'],
    ['tokenizer.ggml.pre', T.str, 'llama-bpe'],
    ['tokenizer.ggml.tokens', T.arr, [T.str, tokens]],
    ['tokenizer.ggml.token_type', T.arr, [T.i32, tokens.map((_, i) => (i >= tokens.length - n_special ? 3 : 1))]],
    ['tokenizer.ggml.merges', T.arr, [T.str, merges]],
    ['tokenizer.ggml.bos_token_id', T.u32, 128000],
    ['tokenizer.ggml.eos_token_id', T.u32, 128009],
    ['tokenizer.ggml.add_bos_token', T.bool, true],
];
chunks.push(Buffer.from('GGUF'));
u32(3);
u64(0);
u64(kvs.length);
for (const [key, type, value] of kvs) {
    str(key);
    u32(type);
    if (type === T.str) str(value);
    else if (type === T.u32) u32(value);
    else if (type === T.bool) chunks.push(Buffer.from([value ? 1 : 0]));
    else {
        const [et, items] = value;
        u32(et);
        u64(items.length);
        for (const x of items) (et === T.str ? str : i32)(x);
    }
}
let data = Buffer.concat(chunks);
const pad = (32 - (data.length % 32)) % 32;
data = Buffer.concat([data, Buffer.alloc(pad)]);
writeFileSync(out, data);
console.log(`${out}: ${tokens.length} tokens, ${merges.length} merges`);
