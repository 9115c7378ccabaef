// Loads GGUF tensors into F32 or INT8 weights, checking names and shapes.
#include "runtime/weights.hpp"

#include "cpu/thread_pool.hpp"
#include "cpu/weight_convert.hpp"
#include "quant/int8.hpp"
#include "quant/blocks.hpp"
#include "quant/lowbit.hpp"
#include "runtime/error.hpp"
#include "runtime/gguf.hpp"
#include "runtime/quantize_file.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sys/mman.h>
#include <unistd.h>
#include <fstream>
#include <functional>
#include <optional>
#include <thread>

namespace tandem {
namespace {

std::string shape_str(const std::vector<int64_t>& ne) {
    std::string s = "[";
    for (size_t i = 0; i < ne.size(); ++i) s += (i ? ", " : "") + std::to_string(ne[i]);
    return s + "]";
}

// Row r (of n_in elements) of a 2-D tensor, or the whole of a 1-D one (r = 0), as F32.
void row_to_f32(const gguf::tensor_info& t, int64_t r, int64_t n_in, float* out) {
    if (is_block_format(t.type)) { // the reference's floats, by AVX2 where there is a kernel
        cpu::blocks_to_f32(t.type, t.data + r * int64_t(block_bytes_of(t.type, n_in)), out, n_in);
        return;
    }
    switch (t.type) {
    case dtype::f32: std::memcpy(out, t.data + r * n_in * 4, size_t(n_in) * sizeof(float)); return;
    case dtype::f16:
    case dtype::bf16: cpu::halves_to_f32(t.type, t.data + r * n_in * 2, out, n_in); return;
    default: break; // I8 (mapped in place, not converted)
    }
    fail("tensor {} has type {}, which the loader does not convert", t.name, name_of(t.type));
}

// Gives back the mapped pages wholly inside a tensor once it is converted, so loading a
// large model peaks at about one copy of it rather than two. Re-reading would fault them in.
void release_pages(const gguf::tensor_info& t) {
    const uintptr_t page = uintptr_t(::sysconf(_SC_PAGESIZE));
    const uintptr_t b = (reinterpret_cast<uintptr_t>(t.data) + page - 1) / page * page;
    const uintptr_t e = (reinterpret_cast<uintptr_t>(t.data) + t.n_bytes) / page * page;
    if (e > b) ::madvise(reinterpret_cast<void*>(b), e - b, MADV_DONTNEED);
}

// Runs fn(begin, end) over rows, on the pool when there is one.
void for_rows(cpu::thread_pool* pool, int64_t n_rows, int64_t n_in, const std::function<void(int64_t, int64_t)>& fn) {
    if (pool) pool->parallel_for(n_rows, cpu::thread_pool::grain_for(n_in * 4, 16), fn);
    else fn(0, n_rows);
}

// The scale tensor that goes with an I8 weight tensor of a `tandem quantize` file.
const float* scale_tensor(const gguf::file& f, const gguf::tensor_info& t, int64_t n_out) {
    const gguf::tensor_info* s = f.find_tensor(t.name + ".scale");
    TANDEM_CHECK(s, "{}: I8 tensor {} has no {}.scale tensor", f.path(), t.name, t.name);
    TANDEM_CHECK(s->type == dtype::f32 && s->ne == std::vector<int64_t>{n_out}, "{}: {}.scale must be F32 [{}]",
                 f.path(), t.name, n_out);
    TANDEM_CHECK(reinterpret_cast<uintptr_t>(s->data) % alignof(float) == 0, "{}: {}.scale is misaligned",
                 f.path(), t.name);
    return reinterpret_cast<const float*>(s->data);
}

// The I8 tensor t of a `tandem quantize` file (checked to be a matrix) as a weight pointing
// into the mapping: in rows, or in the blocked layout where the file lists it so (whole blocks
// only: anything else would read past the tensor).
weight i8_view(const gguf::file& f, const gguf::tensor_info& t) {
    weight w;
    w.n_in = t.ne[0];
    w.n_out = t.ne[1];
    w.q_ext = reinterpret_cast<const int8_t*>(t.data);
    w.scale_ext = scale_tensor(f, t, w.n_out);
    const gguf::array_value* listed = f.get_array(quant_blocked_key);
    if (listed && std::any_of(listed->items.begin(), listed->items.end(), [&](const gguf::value& v) {
            return v.as_string() && *v.as_string() == t.name;
        })) {
        TANDEM_CHECK(w.n_in % q_block_k == 0 && w.n_out % q_block_rows == 0,
                     "{}: I8 tensor {} {} is listed in {} but is not whole blocks of {} outputs x {} inputs", f.path(),
                     t.name, shape_str(t.ne), quant_blocked_key, q_block_rows, q_block_k);
        w.layout = q_layout::blocked;
    }
    return w;
}

// Rows [row0, row0 + n_rows) of a matrix tensor (all of them by default): a fused tensor is
// loaded as its parts.
struct row_range {
    int64_t row0 = 0, n_rows = -1;
};

// Converts t (checked to have the shape `ne`), or `part` of its rows: matrices to the requested
// format, vectors to F32. A 3-D tensor [n_in, n_out, n_expert] (experts) is a matrix of
// n_out * n_expert rows here, each expert `part` of them.
weight convert_tensor(const gguf::file& f, const gguf::tensor_info* t, const std::vector<int64_t>& ne,
                      const weight_load_options& opt, row_range part) {
    const std::string& name = t->name;
    const bool matrix = ne.size() >= 2;
    const int64_t n_in = ne[0], n_rows = ne.size() == 3 ? ne[1] * ne[2] : matrix ? ne[1] : 1;
    const int64_t r0 = part.row0, n_out = !matrix ? 1 : part.n_rows < 0 ? n_rows : part.n_rows;
    TANDEM_ASSERT(r0 >= 0 && (!matrix || r0 + n_out <= n_rows));
    const bool last_part = !matrix || r0 + n_out == n_rows; // the mapping's pages may go after it
    TANDEM_CHECK(t->type != dtype::i8 || ne.size() == 2, "{}: tensor {} is I8 but not a matrix", f.path(), name);
    weight w;
    if (matrix && opt.format == weight_format::native && is_lowbit_format(t->type)) {
        // The low-bit family: the file's integers and scales repacked, never re-quantized.
        w.n_out = n_out;
        w.n_in = n_in;
        w.lb = std::make_shared<const lowbit_matrix>(
            pack_lowbit(t->type, t->data, r0, n_out, n_in, [&](int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
                if (opt.pool) opt.pool->parallel_for(n, 1, fn);
                else fn(0, n);
            }));
        if (last_part) release_pages(*t);
        return w;
    }
    if (matrix && is_quantized(opt.format)) {
        w.n_out = n_out;
        w.n_in = n_in;
        if (t->type == dtype::i8) {
            // Pre-quantized: copied, never re-quantized, into memory of 2 MiB pages. Straight
            // from the file's mapping (4 KiB pages, unless the page cache happens to hold the
            // file in large folios) decode ran 30-45% slower on the Zen 4 VM (docs/cpu.md).
            // Where the file's layout is the one asked for, a plain copy (64 rows of n_in
            // bytes hold one block of them); else a row at a time.
            const weight src = i8_view(f, *t);
            const bool whole_blocks = r0 % q_block_rows == 0 && n_out % q_block_rows == 0;
            const bool same = src.layout == opt.layout && (src.layout == q_layout::rows || whole_blocks);
            w.q_store.resize(size_t(n_out * n_in));
            w.layout = same ? src.layout : q_layout::rows;
            for_rows(opt.pool, n_out, n_in, [&](int64_t b, int64_t e) {
                if (same)
                    std::memcpy(&w.q_store[size_t(b * n_in)], src.q() + (r0 + b) * n_in, size_t((e - b) * n_in));
                else
                    for (int64_t r = b; r < e; ++r) src.q_row(r0 + r, &w.q_store[size_t(r * n_in)]);
            });
            // The scales too: read by every matmul from the mapping, each would fault its
            // neighbours back in (a whole large folio of the page cache, 160 MB over the 1.1B
            // shape's matrices on the Zen 4 VM).
            w.scale_store.assign(src.scale_ext + r0, src.scale_ext + r0 + n_out);
            compute_row_sums(w, opt.pool);
        } else {
            // Each row straight to INT8 with its sum (Q8_0 fused; the others through an F32 row
            // in L1), the reference's bytes at every ISA level (cpu/weight_convert.hpp).
            w.q_store.resize(size_t(n_out * n_in));
            w.scale_store.resize(size_t(n_out));
            w.q_sum.resize(size_t(n_out));
            const bool blocks = is_block_format(t->type);
            const size_t row_bytes = blocks ? block_bytes_of(t->type, n_in) : 0;
            for_rows(opt.pool, n_out, n_in, [&](int64_t b, int64_t e) {
                std::vector<float> row(static_cast<size_t>(n_in));
                for (int64_t r = b; r < e; ++r) {
                    int8_t* q = &w.q_store[size_t(r * n_in)];
                    float& scale = w.scale_store[size_t(r)];
                    int32_t& sum = w.q_sum[size_t(r)];
                    if (blocks) {
                        scale = cpu::blocks_to_i8(t->type, t->data + (r0 + r) * int64_t(row_bytes), q, &sum,
                                                  row.data(), n_in);
                    } else {
                        row_to_f32(*t, r0 + r, n_in, row.data());
                        scale = cpu::row_to_i8(row.data(), q, &sum, n_in);
                    }
                }
            });
        }
        if (opt.layout == q_layout::blocked) pack_blocked(w, opt.pool);
        if (last_part) release_pages(*t);
        return w;
    }
    w.n_in = matrix ? n_in : 1;
    w.n_out = matrix ? n_out : ne[0];
    w.data.resize(size_t(matrix ? n_out * n_in : t->n_elements()));
    if (t->type == dtype::i8) {
        const weight src = i8_view(f, *t);
        for_rows(opt.pool, n_out, n_in, [&](int64_t b, int64_t e) {
            for (int64_t r = b; r < e; ++r) src.row_f32(r0 + r, &w.data[size_t(r * n_in)]);
        });
    } else if (matrix) {
        for_rows(opt.pool, n_out, n_in, [&](int64_t b, int64_t e) {
            for (int64_t r = b; r < e; ++r) row_to_f32(*t, r0 + r, n_in, &w.data[size_t(r * n_in)]);
        });
    } else {
        row_to_f32(*t, 0, ne[0], w.data.data());
    }
    return w;
}

// Finds `name`, checks its shape is exactly `ne` (GGUF order, ne[0] contiguous), converts it
// (or `part` of its rows).
weight load_tensor(const gguf::file& f, const std::string& name, std::vector<int64_t> ne,
                   const weight_load_options& opt, bool optional = false, row_range part = {}) {
    const gguf::tensor_info* t = f.find_tensor(name);
    if (!t) {
        TANDEM_CHECK(optional, "{}: missing tensor {}", f.path(), name);
        return {};
    }
    TANDEM_CHECK(t->ne == ne, "{}: tensor {} has shape {}, expected {}", f.path(), name, shape_str(t->ne),
                 shape_str(ne));
    return convert_tensor(f, t, ne, opt, part);
}

// The experts of a 3-D tensor [n_in, n_out, n_expert], one weight each (expert x is rows
// x * n_out .. (x + 1) * n_out - 1 of the tensor seen as a matrix).
std::vector<weight> load_experts(const gguf::file& f, const std::string& name, int64_t n_in, int64_t n_out,
                                 int64_t n_expert, const weight_load_options& opt) {
    const gguf::tensor_info* t = f.find_tensor(name);
    TANDEM_CHECK(t, "{}: missing tensor {}", f.path(), name);
    const std::vector<int64_t> ne{n_in, n_out, n_expert};
    TANDEM_CHECK(t->ne == ne, "{}: tensor {} has shape {}, expected {}", f.path(), name, shape_str(t->ne),
                 shape_str(ne));
    TANDEM_CHECK(t->type != dtype::i8, "{}: tensor {} is I8 but has experts", f.path(), name);
    std::vector<weight> out;
    out.reserve(size_t(n_expert));
    for (int64_t x = 0; x < n_expert; ++x) out.push_back(convert_tensor(f, t, ne, opt, {x * n_out, n_out}));
    return out;
}

// A mixture-of-experts layer's FFN: the router (F32 whatever the format: its scores pick the
// experts, and a near-tie must not flip by rounding), the experts of the 3-D tensors, the
// shared expert and its gate (qwen2moe).
void load_moe(const gguf::file& f, const model_config& c, const std::string& p, const weight_load_options& opt,
              layer_weights& l) {
    const int64_t e = c.n_embd, ffe = c.n_ff_exp, ne = c.n_expert;
    TANDEM_CHECK(!f.find_tensor(p + "ffn_gate.0.weight"), "{}: {}ffn_gate.0.weight: experts as one tensor each (an "
                 "old Mixtral conversion) are not supported; convert the model again", f.path(), p);
    TANDEM_CHECK(!f.find_tensor(p + "ffn_gate_up_exps.weight"), "{}: {}ffn_gate_up_exps.weight (fused experts) is not "
                 "supported", f.path(), p);
    TANDEM_CHECK(!f.find_tensor(p + "exp_probs_b.bias") && !f.find_tensor(p + "ffn_exp_probs_b.bias"),
                 "{}: expert score biases are not supported", f.path());
    weight_load_options f32 = opt;
    f32.format = weight_format::f32;
    l.router = load_tensor(f, p + "ffn_gate_inp.weight", {e, ne}, f32);
    l.gate_exps = load_experts(f, p + "ffn_gate_exps.weight", e, ffe, ne, opt);
    l.up_exps = load_experts(f, p + "ffn_up_exps.weight", e, ffe, ne, opt);
    l.down_exps = load_experts(f, p + "ffn_down_exps.weight", ffe, e, ne, opt);
    if (c.n_ff_shexp > 0) {
        const int64_t ffs = c.n_ff_shexp;
        l.shexp_gate = load_tensor(f, p + "ffn_gate_inp_shexp.weight", {e}, opt);
        l.w_gate_shexp = load_tensor(f, p + "ffn_gate_shexp.weight", {e, ffs}, opt);
        l.w_up_shexp = load_tensor(f, p + "ffn_up_shexp.weight", {e, ffs}, opt);
        l.w_down_shexp = load_tensor(f, p + "ffn_down_shexp.weight", {ffs, e}, opt);
    } else {
        TANDEM_CHECK(!f.find_tensor(p + "ffn_gate_shexp.weight"), "{}: {}ffn_gate_shexp.weight: a shared expert in {}, "
                     "which has none", f.path(), p, c.arch);
    }
}

} // namespace

weight_estimate estimate_weight_bytes(const gguf::file& f, weight_format format) {
    weight_estimate w;
    for (const gguf::tensor_info& t : f.tensors()) {
        if (t.name.ends_with(".scale") && f.find_tensor(t.name.substr(0, t.name.size() - 6))) continue;
        const bool experts = t.ne.size() == 3;
        const bool matrix = (t.ne.size() == 2 || experts) && t.ne[0] > 1 && !t.name.ends_with("ffn_gate_inp.weight");
        const int64_t n_mat = experts ? t.ne[2] : 1;
        int64_t b = t.n_elements() * 4;
        if (matrix && format == weight_format::native && is_lowbit_format(t.type)) {
            const lowbit_matrix m = lowbit_layout_of(t.type, t.ne[1], t.ne[0]);
            b = n_mat * m.n_tiles() * m.n_super() * m.super_bytes;
        } else if (matrix && is_quantized(format)) {
            b = n_mat * t.ne[1] * (t.ne[0] + 4 + 4);
        }
        w.bytes += b;
        if (experts) w.expert_bytes += b;
    }
    return w;
}

void check_weights_fit(const std::string& path, const weight_estimate& need, weight_format format, int64_t available) {
    if (available < 0) {
        std::ifstream in("/proc/meminfo");
        std::string key, unit;
        int64_t kib = 0;
        while (in >> key >> kib >> unit)
            if (key == "MemAvailable:") {
                available = kib * 1024;
                break;
            }
        if (available < 0) return; // no /proc: nothing to compare with
    }
    const auto gib = [](int64_t b) { return double(b) / double(int64_t(1) << 30); };
    TANDEM_CHECK(need.bytes <= available,
                 "{} needs {:.1f} GiB of memory for its weights ({}{}), and this machine has {:.1f} GiB available "
                 "(MemAvailable){}",
                 path, gib(need.bytes), format == weight_format::native ? "--weights auto" : name_of(format),
                 need.expert_bytes > 0 ? fmt::format("; {:.1f} GiB of them the experts", gib(need.expert_bytes)) : "",
                 gib(available),
                 format == weight_format::f32 ? "; --weights int8 or auto holds a quarter to an eighth of that" : "");
}

bool read_by_matmul(const gguf::file& f, const std::string& name) {
    return name != "token_embd.weight" || !f.find_tensor("output.weight");
}

void tensor_row_to_f32(const gguf::file& f, const gguf::tensor_info& t, int64_t r, float* out) {
    TANDEM_ASSERT(t.ne.size() == 2 && r >= 0 && r < t.ne[1]);
    const int64_t n_in = t.ne[0];
    if (t.type == dtype::i8) {
        i8_view(f, t).row_f32(r, out);
        return;
    }
    row_to_f32(t, r, n_in, out);
}

weight quantize_weight(const float* data, int64_t n_out, int64_t n_in, cpu::thread_pool* pool) {
    weight w;
    w.n_out = n_out;
    w.n_in = n_in;
    w.q_store.resize(size_t(n_out * n_in));
    w.scale_store.resize(size_t(n_out));
    w.q_sum.resize(size_t(n_out));
    for_rows(pool, n_out, n_in, [&](int64_t b, int64_t e) {
        for (int64_t r = b; r < e; ++r)
            w.scale_store[size_t(r)] =
                cpu::row_to_i8(data + r * n_in, &w.q_store[size_t(r * n_in)], &w.q_sum[size_t(r)], n_in);
    });
    return w;
}

void compute_row_sums(weight& w, cpu::thread_pool* pool) {
    w.q_sum.resize(size_t(w.n_out));
    const int8_t* q = w.q();
    if (w.layout == q_layout::rows) {
        for_rows(pool, w.n_out, w.n_in, [&](int64_t b, int64_t e) {
            for (int64_t r = b; r < e; ++r) w.q_sum[size_t(r)] = sum_i8_ref(q + r * w.n_in, w.n_in);
        });
        return;
    }
    // A block at a time: each 64-byte line adds four inputs to each of 16 outputs' sums (the
    // padding's zeros add nothing).
    const auto sum_blocks = [&](int64_t b0, int64_t b1) {
        for (int64_t b = b0; b < b1; ++b) {
            int32_t s[q_block_rows] = {};
            const int8_t* p = w.q_block(b);
            for (int64_t g = 0; g < w.k_pad() / 4; ++g, p += 4 * q_block_rows)
                for (int64_t r = 0; r < q_block_rows; ++r) s[r] += p[4 * r] + p[4 * r + 1] + p[4 * r + 2] + p[4 * r + 3];
            const int64_t nr = std::min(q_block_rows, w.n_out - b * q_block_rows);
            std::copy(s, s + nr, &w.q_sum[size_t(b * q_block_rows)]);
        }
    };
    if (pool) pool->parallel_for(w.n_blocks(), 1, sum_blocks);
    else sum_blocks(0, w.n_blocks());
}

void pack_blocked(weight& w, cpu::thread_pool* pool) {
    if (!w.is_i8() || w.layout == q_layout::blocked) return;
    const int64_t n_in = w.n_in, kp = w.k_pad(), n_blk = w.n_blocks(), blk_bytes = q_block_rows * kp;
    const int8_t* src = w.q();
    // Block b from the rows at `rows` (those of b's outputs that exist) into dst: line g holds
    // inputs 4g..4g+3 of each of the 64 outputs in turn, zeros past n_out and n_in.
    const auto pack_block = [&](const int8_t* rows, int64_t b, int8_t* dst) {
        const int64_t nr = std::min(q_block_rows, w.n_out - b * q_block_rows);
        std::memset(dst, 0, size_t(blk_bytes));
        for (int64_t r = 0; r < nr; ++r)
            for (int64_t k = 0; k < n_in; k += 4)
                std::memcpy(dst + k * q_block_rows + r * 4, rows + r * n_in + k, size_t(std::min<int64_t>(4, n_in - k)));
    };
    const auto each_block = [&](const auto& f) {
        const auto range = [&](int64_t x, int64_t y) {
            for (int64_t b = x; b < y; ++b) f(b);
        };
        if (pool) pool->parallel_for(n_blk, 1, range);
        else range(0, n_blk);
    };
    if (w.q_ext == nullptr && kp == n_in && n_blk * q_block_rows == w.n_out) {
        // A block's rows and its packed bytes are the same bytes: re-lay each one in place.
        each_block([&](int64_t b) {
            thread_local std::vector<int8_t> rows;
            rows.assign(w.q_store.begin() + b * blk_bytes, w.q_store.begin() + (b + 1) * blk_bytes);
            pack_block(rows.data(), b, &w.q_store[size_t(b * blk_bytes)]);
        });
    } else {
        std::vector<int8_t, cacheline_allocator<int8_t>> out(size_t(n_blk * blk_bytes));
        each_block([&](int64_t b) { pack_block(src + b * q_block_rows * n_in, b, &out[size_t(b * blk_bytes)]); });
        w.q_store = std::move(out);
        w.q_ext = nullptr;
    }
    w.layout = q_layout::blocked;
}

int64_t model_weights::bytes() const {
    int64_t n = tok_embd.bytes() + output_norm.bytes() + output.bytes() + rope_freqs.bytes() + expert_bytes();
    for (const auto& l : layers)
        for (const auto field : layer_weight_fields) n += (l.*field).bytes();
    return n;
}

int64_t model_weights::expert_bytes() const {
    int64_t n = 0;
    for (const auto& l : layers)
        for (const auto* exps : {&l.gate_exps, &l.up_exps, &l.down_exps})
            for (const weight& x : *exps) n += x.bytes();
    return n;
}

int64_t model_weights::decode_bytes(const model_config& c) const {
    const int64_t experts = expert_bytes();
    const int64_t table = output.empty() ? 0 : tok_embd.bytes() - tok_embd.bytes() / std::max<int64_t>(1, tok_embd.n_out);
    const int64_t active = c.is_moe() ? experts / c.n_expert * c.n_expert_used : experts;
    return bytes() - table - experts + active;
}

std::string model_weights::family() const {
    int n_lowbit = 0, n_i8 = 0, n_f32 = 0;
    const auto count = [&](const weight& m) {
        if (m.empty()) return;
        n_lowbit += m.is_lowbit();
        n_i8 += m.is_i8();
        n_f32 += m.is_f32();
    };
    for (const auto& l : layers) {
        for (const weight* m : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down, &l.w_gate_shexp,
                                &l.w_up_shexp, &l.w_down_shexp})
            count(*m);
        for (const auto* exps : {&l.gate_exps, &l.up_exps, &l.down_exps})
            for (const weight& x : *exps) count(x);
    }
    count(logits_weight());
    if (n_lowbit == 0) return n_i8 ? "int8" : "f32";
    return n_i8 ? "low-bit + int8" : "low-bit";
}

model_weights model_weights::load(const gguf::file& f, model_config& c, const weight_load_options& opt_in) {
    // Quantizing a 1B model row by row takes seconds on one thread: use every core.
    std::optional<cpu::thread_pool> own_pool;
    weight_load_options opt = opt_in;
    if (!opt.pool) opt.pool = &own_pool.emplace(int(std::max(1u, std::thread::hardware_concurrency())));

    // I8 tensors are only trusted in a file that names the scheme this loader implements.
    if (std::any_of(f.tensors().begin(), f.tensors().end(), [](const auto& t) { return t.type == dtype::i8; })) {
        const auto scheme = f.get_string(quant_scheme_key);
        const int64_t version = f.get_int(quant_version_key).value_or(0);
        TANDEM_CHECK(scheme == std::string(int8_scheme) && version >= int8_scheme_min_version &&
                         version <= int8_scheme_version,
                     "{}: I8 tensors with quantization scheme {} version {}; this build reads {} versions {} to {}",
                     f.path(), scheme.value_or("(none)"), version, int8_scheme, int8_scheme_min_version,
                     int8_scheme_version);
        TANDEM_CHECK(version >= 2 || !f.get_array(quant_blocked_key), "{}: {} in a version {} file", f.path(),
                     quant_blocked_key, version);
    }

    const gguf::tensor_info* emb = f.find_tensor("token_embd.weight");
    TANDEM_CHECK(emb, "{}: missing tensor token_embd.weight", f.path());
    TANDEM_CHECK(emb->ne.size() == 2 && emb->ne[0] == c.n_embd, "{}: token_embd.weight has shape {}, expected [{}, n_vocab]",
                 f.path(), shape_str(emb->ne), c.n_embd);
    TANDEM_CHECK(c.n_vocab == 0 || c.n_vocab == emb->ne[1], "{}: vocab_size {} differs from token_embd rows {}",
                 f.path(), c.n_vocab, emb->ne[1]);
    c.n_vocab = int32_t(emb->ne[1]);

    const int64_t e = c.n_embd, nq = c.n_embd_q(), kv = c.n_embd_kv(), ff = c.n_ff, v = c.n_vocab, hd = c.head_dim;
    for (const char* name : {"rope_factors_long.weight", "rope_factors_short.weight"})
        TANDEM_CHECK(!f.find_tensor(name), "{}: {} is Phi-3's LongRoPE, which Tandem does not support", f.path(), name);
    model_weights w;
    weight_load_options rows = opt;
    rows.layout = q_layout::rows;
    // A low-bit embedding table keeps its bits too: the embed op dequantizes the tokens' rows.
    const weight_load_options emb_opt = read_by_matmul(f, "token_embd.weight") ? opt : rows;
    w.tok_embd = load_tensor(f, "token_embd.weight", {e, v}, emb_opt);
    w.output_norm = load_tensor(f, "output_norm.weight", {e}, opt);
    w.output = load_tensor(f, "output.weight", {e, v}, opt, /*optional=*/true);
    c.tied_output = w.output.empty();
    w.rope_freqs = load_tensor(f, "rope_freqs.weight", {c.n_rot / 2}, opt, /*optional=*/true);
    if (!w.rope_freqs.empty())
        for (const float x : w.rope_freqs.data)
            TANDEM_CHECK(std::isfinite(x) && x > 0, "{}: rope_freqs.weight holds {}, not a positive factor", f.path(), x);

    w.layers.resize(size_t(c.n_layer));
    for (int il = 0; il < c.n_layer; ++il) {
        const std::string p = "blk." + std::to_string(il) + ".";
        layer_weights& l = w.layers[size_t(il)];
        l.attn_norm = load_tensor(f, p + "attn_norm.weight", {e}, opt);
        if (const std::string qkv = p + "attn_qkv.weight"; f.find_tensor(qkv)) { // Phi-3: q, k, v rows in one
            l.wq = load_tensor(f, qkv, {e, nq + 2 * kv}, opt, false, {0, nq});
            l.wk = load_tensor(f, qkv, {e, nq + 2 * kv}, opt, false, {nq, kv});
            l.wv = load_tensor(f, qkv, {e, nq + 2 * kv}, opt, false, {nq + kv, kv});
        } else {
            l.wq = load_tensor(f, p + "attn_q.weight", {e, nq}, opt);
            l.wk = load_tensor(f, p + "attn_k.weight", {e, kv}, opt);
            l.wv = load_tensor(f, p + "attn_v.weight", {e, kv}, opt);
        }
        l.wo = load_tensor(f, p + "attn_output.weight", {nq, e}, opt);
        if (c.qk_norm) {
            l.q_norm = load_tensor(f, p + "attn_q_norm.weight", {hd}, opt);
            l.k_norm = load_tensor(f, p + "attn_k_norm.weight", {hd}, opt);
        }
        if (c.post_norms) {
            l.attn_post_norm = load_tensor(f, p + "post_attention_norm.weight", {e}, opt);
            l.ffn_post_norm = load_tensor(f, p + "post_ffw_norm.weight", {e}, opt);
        }
        l.bq = load_tensor(f, p + "attn_q.bias", {nq}, opt, true);
        l.bk = load_tensor(f, p + "attn_k.bias", {kv}, opt, true);
        l.bv = load_tensor(f, p + "attn_v.bias", {kv}, opt, true);
        const bool has_bias = !l.bq.empty() || !l.bk.empty() || !l.bv.empty();
        TANDEM_CHECK(!has_bias || (!l.bq.empty() && !l.bk.empty() && !l.bv.empty()),
                     "{}: layer {} has only some of the q/k/v biases", f.path(), il);
        TANDEM_CHECK(il == 0 || has_bias == c.qkv_bias, "{}: layer {} differs from layer 0 in q/k/v biases", f.path(), il);
        c.qkv_bias = has_bias;
        l.ffn_norm = load_tensor(f, p + "ffn_norm.weight", {e}, opt);
        if (c.is_moe()) {
            load_moe(f, c, p, opt, l);
            continue;
        }
        TANDEM_CHECK(!f.find_tensor(p + "ffn_gate_inp.weight"), "{}: {}ffn_gate_inp.weight (experts) without {}.expert_count",
                     f.path(), p, c.arch);
        if (!f.find_tensor(p + "ffn_gate.weight") && f.find_tensor(p + "ffn_up.weight")) { // Phi-3: gate rows, then up
            l.w_gate = load_tensor(f, p + "ffn_up.weight", {e, 2 * ff}, opt, false, {0, ff});
            l.w_up = load_tensor(f, p + "ffn_up.weight", {e, 2 * ff}, opt, false, {ff, ff});
        } else {
            l.w_gate = load_tensor(f, p + "ffn_gate.weight", {e, ff}, opt);
            l.w_up = load_tensor(f, p + "ffn_up.weight", {e, ff}, opt);
        }
        l.w_down = load_tensor(f, p + "ffn_down.weight", {ff, e}, opt);
    }
    return w;
}

} // namespace tandem
