// The low-bit family's packing from GGUF blocks, its row dequantizer and reference dot product
// (quant/lowbit.hpp; the layout is runtime/weight.hpp's lowbit_matrix).
#include "quant/lowbit.hpp"

#include "quant/iq4_blocks.hpp"
#include "quant/k_blocks.hpp"
#include "runtime/error.hpp"
#include "runtime/fp16.hpp"

#include <algorithm>
#include <cstring>

namespace tandem {
namespace {

// One super-block of one row as the file holds it: f16 bits of d and dm, per group sc and mg,
// per input its nibble (the table index for IQ4) and its bits above the nibble.
struct super_fields {
    uint16_t d = 0, dm = 0;
    int8_t sc[16] = {}, mg[16] = {};
    uint8_t nib[256] = {}, hi[256] = {};
};

uint16_t u16_at(const uint8_t* p) {
    uint16_t v;
    std::memcpy(&v, p, 2);
    return v;
}

// 32 values from 16 bytes whose low nibbles are values 0..15, high nibbles 16..31.
void nibbles32(const uint8_t* qs, uint8_t* nib) {
    for (int j = 0; j < 16; ++j) {
        nib[j] = qs[j] & 0x0F;
        nib[j + 16] = qs[j] >> 4;
    }
}

void fifth_bits32(const uint8_t* qh4, uint8_t* hi) {
    uint32_t qh;
    std::memcpy(&qh, qh4, 4);
    for (int j = 0; j < 32; ++j) hi[j] = uint8_t(qh >> j & 1);
}

int q3_scale(const uint8_t* s, int sb) {
    const int low = sb < 8 ? s[sb] & 0x0F : s[sb - 8] >> 4;
    const int high = s[8 + sb % 4] >> (2 * (sb / 4)) & 3;
    return (low | high << 4) - 32;
}

// Super-block s of a row of type t starting at `row`.
void decode_super(dtype t, const uint8_t* row, int64_t s, super_fields& f) {
    const uint8_t* b = row + s * int64_t(traits_of(uint32_t(t))->block_bytes);
    switch (t) {
    case dtype::q4_0: f.d = u16_at(b); nibbles32(b + 2, f.nib); return;
    case dtype::q4_1: f.d = u16_at(b); f.dm = u16_at(b + 2); nibbles32(b + 4, f.nib); return;
    case dtype::q5_0: f.d = u16_at(b); fifth_bits32(b + 2, f.hi); nibbles32(b + 6, f.nib); return;
    case dtype::q5_1:
        f.d = u16_at(b);
        f.dm = u16_at(b + 2);
        fifth_bits32(b + 4, f.hi);
        nibbles32(b + 8, f.nib);
        return;
    case dtype::iq4_nl: f.d = u16_at(b); nibbles32(b + 2, f.nib); return;
    case dtype::q4_k:
    case dtype::q5_k: {
        const bool five = t == dtype::q5_k;
        f.d = u16_at(b);
        f.dm = u16_at(b + 2);
        const uint8_t* qh = b + 16;
        const uint8_t* qs = b + 16 + (five ? 32 : 0);
        for (int j = 0; j < 8; ++j) {
            int sc, m;
            k_scale_min(b + 4, j, sc, m);
            f.sc[j] = int8_t(sc);
            f.mg[j] = int8_t(-m);
            for (int l = 0; l < 32; ++l) {
                const uint8_t byte = qs[32 * (j / 2) + l];
                f.nib[32 * j + l] = j % 2 == 0 ? byte & 0x0F : byte >> 4;
                if (five) f.hi[32 * j + l] = uint8_t(qh[l] >> j & 1);
            }
        }
        return;
    }
    case dtype::q6_k:
        f.d = u16_at(b + 208);
        for (int g = 0; g < 16; ++g) f.sc[g] = int8_t(b[192 + g]);
        for (int h = 0; h < 2; ++h) {
            const uint8_t* ql = b + 64 * h;
            const uint8_t* qh = b + 128 + 32 * h;
            for (int l = 0; l < 32; ++l) {
                const uint8_t lo[4] = {uint8_t(ql[l] & 0x0F), uint8_t(ql[l + 32] & 0x0F), uint8_t(ql[l] >> 4),
                                       uint8_t(ql[l + 32] >> 4)};
                for (int k = 0; k < 4; ++k) {
                    f.nib[128 * h + 32 * k + l] = lo[k];
                    f.hi[128 * h + 32 * k + l] = uint8_t(qh[l] >> (2 * k) & 3);
                }
            }
        }
        return;
    case dtype::q2_k:
        f.d = u16_at(b + 80);
        f.dm = u16_at(b + 82);
        for (int g = 0; g < 16; ++g) {
            f.sc[g] = int8_t(b[g] & 0x0F);
            f.mg[g] = int8_t(-(b[g] >> 4));
        }
        for (int v = 0; v < 256; ++v) {
            const int h = v / 128, k = v % 128 / 32, l = v % 32;
            f.nib[v] = uint8_t(b[16 + 32 * h + l] >> (2 * k) & 3);
        }
        return;
    case dtype::q3_k:
        f.d = u16_at(b + 108);
        for (int g = 0; g < 16; ++g) f.sc[g] = int8_t(q3_scale(b + 96, g));
        for (int v = 0; v < 256; ++v) {
            const int h = v / 128, k = v % 128 / 32, l = v % 32;
            const int low = b[32 + 32 * h + l] >> (2 * k) & 3, bit = b[l] >> (4 * h + k) & 1;
            f.nib[v] = uint8_t(low + 4 * bit); // q + 4: q is low - 4 where the bit is clear
        }
        return;
    case dtype::iq4_xs: {
        f.d = u16_at(b);
        const uint16_t sh = u16_at(b + 2);
        for (int j = 0; j < 8; ++j) {
            const int ls = (b[4 + j / 2] >> (4 * (j % 2)) & 0x0F) | (sh >> (2 * j) & 3) << 4;
            f.sc[j] = int8_t(ls - 32);
            nibbles32(b + 8 + 16 * j, f.nib + 32 * j);
        }
        return;
    }
    default: break;
    }
    fail("{} is not a low-bit format", name_of(t));
}

int64_t round64(int64_t n) { return (n + 63) / 64 * 64; }

// Code of input i (within its super-block) of lane `lane` in the super-block's bytes p.
int code_at(const lowbit_matrix& m, const uint8_t* p, int lane, int64_t i) {
    const uint8_t* nib = p + m.header_bytes;
    const int n = nib[64 * (i / 8) + 4 * lane + i % 4] >> (4 * (i / 4 % 2)) & 0x0F;
    if (m.has_table) return m.table[n];
    if (!m.has_hi) return n;
    const uint8_t* hi = nib + m.super * 8;
    return n | (hi[64 * (i / 16) + 4 * lane + i % 4] >> (2 * (i / 4 % 4)) & 3) << 4;
}

struct header_view {
    float d, dm;
    const int8_t* sc; // nullptr: unit
    const int8_t* mg;
};

header_view header_of(const lowbit_matrix& m, const uint8_t* p, int lane) {
    uint16_t d, dm = 0;
    std::memcpy(&d, p + 2 * lane, 2);
    if (m.has_min) std::memcpy(&dm, p + 32 + 2 * lane, 2);
    const uint8_t* sc = p + (m.has_min ? 64 : 32);
    return {fp16_to_f32(d), fp16_to_f32(dm), m.unit_sc ? nullptr : reinterpret_cast<const int8_t*>(sc),
            m.unit_sc || !m.has_min ? nullptr : reinterpret_cast<const int8_t*>(sc + 16 * m.n_grp())};
}

} // namespace

bool is_lowbit_format(dtype t) {
    switch (t) {
    case dtype::q4_0: case dtype::q4_1: case dtype::q5_0: case dtype::q5_1: case dtype::q2_k: case dtype::q3_k:
    case dtype::q4_k: case dtype::q5_k: case dtype::q6_k: case dtype::iq4_nl: case dtype::iq4_xs: return true;
    default: return false;
    }
}

lowbit_matrix lowbit_layout_of(dtype t, int64_t n_out, int64_t n_in) {
    TANDEM_CHECK(is_lowbit_format(t), "{} is not a low-bit format", name_of(t));
    lowbit_matrix m;
    m.type = uint32_t(t);
    m.n_out = n_out;
    m.n_in = n_in;
    const bool legacy = t == dtype::q4_0 || t == dtype::q4_1 || t == dtype::q5_0 || t == dtype::q5_1 || t == dtype::iq4_nl;
    m.super = legacy ? 32 : 256;
    m.group = t == dtype::q2_k || t == dtype::q3_k || t == dtype::q6_k ? 16 : 32;
    m.unit_sc = legacy;
    m.has_min = t == dtype::q4_1 || t == dtype::q5_1 || t == dtype::q4_k || t == dtype::q5_k || t == dtype::q2_k;
    m.has_hi = t == dtype::q5_0 || t == dtype::q5_1 || t == dtype::q5_k || t == dtype::q6_k;
    m.has_table = t == dtype::iq4_nl || t == dtype::iq4_xs;
    m.off = t == dtype::q4_0 ? 8 : t == dtype::q5_0 ? 16 : t == dtype::q6_k ? 32 : t == dtype::q3_k ? 4 : m.has_table ? 128 : 0;
    for (int i = 0; i < 16; ++i) m.table[i] = m.has_table ? uint8_t(iq4_values[i] + 128) : uint8_t(i);
    TANDEM_CHECK(n_in % m.super == 0, "a {} row of {} inputs is not whole blocks of {}", name_of(t), n_in, m.super);
    const int64_t hdr = 32 * (1 + m.has_min) + (m.unit_sc ? 0 : 16 * m.n_grp() * (1 + m.has_min));
    m.header_bytes = round64(hdr);
    m.super_bytes = m.header_bytes + m.super * 8 + (m.has_hi ? m.super * 4 : 0);
    return m;
}

void pack_lowbit_tiles(lowbit_matrix& m, const uint8_t* rows, int64_t r0, int64_t t0, int64_t t1) {
    const dtype t = dtype(m.type);
    const size_t row_bytes = size_t(m.n_in / traits_of(m.type)->block) * traits_of(m.type)->block_bytes;
    super_fields f;
    for (int64_t ti = t0; ti < t1; ++ti) {
        for (int64_t s = 0; s < m.n_super(); ++s) {
            uint8_t* p = m.data.data() + (ti * m.n_super() + s) * m.super_bytes;
            std::memset(p, 0, size_t(m.super_bytes));
            for (int lane = 0; lane < 16; ++lane) {
                const int64_t o = ti * 16 + lane;
                if (o >= m.n_out) break; // zero rows: d = 0
                f = {};
                decode_super(t, rows + (r0 + o) * row_bytes, s, f);
                std::memcpy(p + 2 * lane, &f.d, 2);
                if (m.has_min) std::memcpy(p + 32 + 2 * lane, &f.dm, 2);
                if (!m.unit_sc) {
                    uint8_t* sc = p + (m.has_min ? 64 : 32);
                    for (int g = 0; g < m.n_grp(); ++g) {
                        sc[16 * g + lane] = uint8_t(f.sc[g]);
                        if (m.has_min) sc[16 * m.n_grp() + 16 * g + lane] = uint8_t(f.mg[g]);
                    }
                }
                uint8_t* nib = p + m.header_bytes;
                uint8_t* hi = nib + m.super * 8;
                for (int64_t i = 0; i < m.super; ++i) {
                    nib[64 * (i / 8) + 4 * lane + i % 4] |= uint8_t(f.nib[i] << (4 * (i / 4 % 2)));
                    if (m.has_hi) hi[64 * (i / 16) + 4 * lane + i % 4] |= uint8_t(f.hi[i] << (2 * (i / 4 % 4)));
                }
            }
        }
    }
}

void lowbit_row_f32(const lowbit_matrix& m, int64_t o, float* out) {
    const int lane = int(o % 16);
    for (int64_t s = 0; s < m.n_super(); ++s) {
        const uint8_t* p = m.at(o / 16, s);
        const header_view h = header_of(m, p, lane);
        for (int64_t i = 0; i < m.super; ++i) {
            const int g = int(i / m.group);
            const float sc = h.sc ? float(h.sc[16 * g + lane]) : 1.0f;
            const float v = float(code_at(m, p, lane, i) - m.off);
            float x = h.d * sc * v;
            if (m.has_min) x = x + h.dm * (h.mg ? float(h.mg[16 * g + lane]) : 1.0f);
            out[s * m.super + i] = x;
        }
    }
}

void lowbit_super_ref(const lowbit_matrix& m, int64_t o, int64_t s, const int8_t* x, const int32_t* xs, int32_t& a,
                      int32_t& b) {
    const int lane = int(o % 16);
    const uint8_t* p = m.at(o / 16, s);
    const header_view h = header_of(m, p, lane);
    a = b = 0;
    for (int g = 0; g < m.n_grp(); ++g) {
        int32_t dot = 0;
        for (int64_t i = g * m.group; i < (g + 1) * m.group; ++i) dot += (code_at(m, p, lane, i) - m.off) * int32_t(x[i]);
        a += (h.sc ? h.sc[16 * g + lane] : 1) * dot;
        if (m.has_min) b += (h.mg ? h.mg[16 * g + lane] : 1) * xs[g];
    }
}

void lowbit_group_sums_ref(const int8_t* x, int64_t n_in, int32_t group, int32_t* xs) {
    for (int64_t g = 0; g < n_in / group; ++g) {
        int32_t sum = 0;
        for (int64_t i = 0; i < group; ++i) sum += x[g * group + i];
        xs[g] = sum;
    }
}

void matmul_lowbit_ref(float* out, const int8_t* qx, const float* sx, int64_t n_tok, const lowbit_matrix& m,
                       const float* bias) {
    matmul_lowbit_ref_rows(out, qx, sx, n_tok, m, bias, 0, m.n_out);
}

void matmul_lowbit_ref_rows(float* out, const int8_t* qx, const float* sx, int64_t n_tok, const lowbit_matrix& m,
                            const float* bias, int64_t o0, int64_t o1) {
    std::vector<int32_t> xs(size_t(m.n_in / m.group));
    for (int64_t t = 0; t < n_tok; ++t) {
        const int8_t* x = qx + t * m.n_in;
        lowbit_group_sums_ref(x, m.n_in, m.group, xs.data());
        for (int64_t o = o0; o < o1; ++o) {
            float r = 0;
            for (int64_t s = 0; s < m.n_super(); ++s) {
                int32_t a, b;
                lowbit_super_ref(m, o, s, x + s * m.super, xs.data() + s * m.n_grp(), a, b);
                const uint8_t* p = m.at(o / 16, s);
                const header_view h = header_of(m, p, int(o % 16));
                const float t1 = h.d * float(a);
                const float t2 = h.dm * float(b);
                r = r + (t1 + t2);
            }
            out[t * m.n_out + o] = bias ? r * sx[t] + bias[o] : r * sx[t];
        }
    }
}

} // namespace tandem
