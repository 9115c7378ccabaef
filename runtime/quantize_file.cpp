// Streams a GGUF into its INT8 form (scheme tandem.int8.rowwise, version 2).
#include "runtime/quantize_file.hpp"

#include "cpu/thread_pool.hpp"
#include "cpu/weight_convert.hpp"
#include "quant/int8.hpp"
#include "runtime/error.hpp"
#include "runtime/gguf.hpp"
#include "runtime/weights.hpp"

#include <cstring>
#include <string>
#include <vector>

namespace tandem {

quantize_stats quantize_gguf(const std::string& in, const std::string& out, cpu::thread_pool& pool) {
    const gguf::file f = gguf::file::open(in);
    gguf::writer w;
    for (const auto& kv : f.metadata()) {
        if (kv.key == "general.alignment" || kv.key == quant_scheme_key || kv.key == quant_version_key ||
            kv.key == quant_blocked_key)
            continue;
        w.set(kv.key, kv.val);
    }
    w.set_string(quant_scheme_key, int8_scheme);
    w.set_u32(quant_version_key, int8_scheme_version);
    w.set_alignment(64); // the loader reads the scales as floats from the mapping, copies the rows by lines

    quantize_stats st;
    std::vector<std::string> blocked;
    for (const auto& t : f.tensors()) {
        // A mixture of experts' router (ffn_gate_inp) stays as it is: the loader keeps it F32
        // (its scores pick the experts); its 3-D experts are copied too, made INT8 at load.
        const bool matrix = t.ne.size() == 2 && t.ne[0] > 1 && !t.name.ends_with("ffn_gate_inp.weight");
        if (t.name.ends_with(".scale") && t.type == dtype::f32) continue; // rewritten with its matrix
        if (!matrix) {
            const gguf::tensor_info* src = &t;
            w.add_tensor(t.name, t.type, t.ne, [src](std::span<uint8_t> o) { std::memcpy(o.data(), src->data, o.size()); });
            ++st.n_copied;
            continue;
        }
        const int64_t n_in = t.ne[0], n_out = t.ne[1];
        const bool block = n_in % q_block_k == 0 && n_out % q_block_rows == 0 && read_by_matmul(f, t.name);
        if (block) blocked.push_back(t.name);
        // Quantized when the writer asks for the rows, so one matrix is in memory at a time.
        auto q = std::make_shared<weight>();
        auto ensure = [&f, &t, &pool, q, n_in, n_out, block] {
            if (q->is_i8()) return;
            q->n_out = n_out;
            q->n_in = n_in;
            q->q_store.resize(size_t(n_out * n_in));
            q->scale_store.resize(size_t(n_out));
            pool.parallel_for(n_out, cpu::thread_pool::grain_for(n_in * 4, 16), [&](int64_t b, int64_t e) {
                std::vector<float> r(static_cast<size_t>(n_in));
                int32_t sum = 0; // (the loader sums a file's rows itself)
                for (int64_t i = b; i < e; ++i) {
                    tensor_row_to_f32(f, t, i, r.data());
                    q->scale_store[size_t(i)] = cpu::row_to_i8(r.data(), &q->q_store[size_t(i * n_in)], &sum, n_in);
                }
            });
            if (block) pack_blocked(*q, &pool); // (in place: whole blocks)
        };
        w.add_tensor(t.name, dtype::i8, t.ne, [ensure, q](std::span<uint8_t> o) {
            ensure();
            std::memcpy(o.data(), q->q_store.data(), o.size());
        });
        w.add_tensor(t.name + ".scale", dtype::f32, {n_out}, [ensure, q](std::span<uint8_t> o) {
            ensure();
            std::memcpy(o.data(), q->scale_store.data(), o.size());
            *q = weight{}; // the scales come after the rows: this matrix is done, free it
        });
        ++st.n_quantized;
    }
    w.set_string_array(quant_blocked_key, blocked);
    w.write(out);
    st.out_bytes = int64_t(gguf::file::open(out).bytes().size());
    return st;
}

} // namespace tandem
