// The CUDA runner: weights uploaded once; per batch the past K/V pages go to a device mirror,
// the forward runs on the stream, the new K/V and the logits come back to host memory.
#include "cuda/runner.hpp"

#include "cuda/check.hpp"
#include "cuda/device.hpp"
#include "cuda/ops/ops.hpp"
#include "cuda/weights.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <vector>

namespace tandem {
namespace {

// Device scratch that only grows.
struct grow_buffer {
    cuda::buffer b;
    template <class T> T* get(const cuda::context& c, size_t n) {
        const size_t bytes = std::max<size_t>(n * sizeof(T), 1);
        if (b.bytes() < bytes) {
            b = cuda::buffer();
            b = cuda::buffer(c, bytes + bytes / 2);
        }
        return b.as<T>();
    }
};

class cuda_runner final : public runner {
public:
    cuda_runner(const model& mdl, int device)
        : cfg_(mdl.config()), ctx_(device), w_(ctx_, checked(mdl).weights()) {
        ctx_.synchronize(); // the uploads are done before the host weights could change
        const auto devs = cuda::list_devices();
        name_ = device < int(devs.size()) ? devs[size_t(device)].name : "?";
        ctx_.make_current(); // the events belong to this device
        CUDA_CHECK(cudaEventCreate(&ev_[0]));
        CUDA_CHECK(cudaEventCreate(&ev_[1]));
    }
    ~cuda_runner() override {
        cudaSetDevice(ctx_.device());
        cudaStreamSynchronize(static_cast<cudaStream_t>(ctx_.stream()));
        for (auto e : ev_)
            if (e) cudaEventDestroy(e);
    }

    std::string device() const override {
        return fmt::format("cuda:{} {} ({} MiB of weights)", ctx_.device(), name_, w_.bytes() >> 20);
    }

    void forward(std::span<const batch_seq> batch, kv_cache& kv, float* logits) override;

    const cuda::forward_stats& stats() const { return stats_; }

private:
    static const model& checked(const model& m) {
        const auto& w = m.weights();
        TANDEM_CHECK(!w.layers.empty() && w.layers[0].wq.is_i8() && w.logits_weight().is_i8(),
                     "the CUDA runner needs INT8 weights (load the model with weight_format::int8)");
        return m;
    }

    void upload_past_pages(std::span<const batch_seq> batch, const kv_cache& kv, uint8_t* mirror);
    void write_back(std::span<const batch_seq> batch, kv_cache& kv, const uint8_t* mirror);

    model_config cfg_;
    cuda::context ctx_;
    cuda::device_model_weights w_;
    std::string name_;
    cudaEvent_t ev_[2] = {nullptr, nullptr};
    cuda::forward_stats stats_;

    // host staging for one batch
    std::vector<int32_t> h_tokens_, h_pos_, h_tables_, h_rows_;
    std::vector<int32_t> slot0_; // first mirror page of each sequence
    // device scratch
    grow_buffer tokens_, pos_, tables_, rows_, mirror_;
    grow_buffer x_, q_, k_, v_, attn_, proj_, gate_, up_, last_, xn_, xq_, xs_, logits_;
    int64_t mirror_pages_ = 0;
};

// Pages of a sequence covering positions [0, n).
int64_t pages_for(int64_t n, int32_t ps) { return (n + ps - 1) / ps; }

void cuda_runner::upload_past_pages(std::span<const batch_seq> batch, const kv_cache& kv, uint8_t* mirror) {
    const kv_layout& lay = kv.layout();
    const int64_t pb = lay.page_bytes();
    stats_.upload_bytes = 0;
    for (size_t i = 0; i < batch.size(); ++i) {
        const auto& s = batch[i];
        const int64_t n_past_pages = pages_for(s.n_past, lay.page_size);
        // Runs of consecutive host pages go over in one copy (mirror slots are consecutive).
        for (int64_t j = 0; j < n_past_pages;) {
            int64_t run = 1;
            while (j + run < n_past_pages && s.block_table[size_t(j + run)] == s.block_table[size_t(j)] + run) ++run;
            ctx_.upload(mirror + (slot0_[i] + j) * pb, kv.base() + int64_t(s.block_table[size_t(j)]) * pb,
                        size_t(run * pb));
            stats_.upload_bytes += run * pb;
            j += run;
        }
    }
}

// Copies positions [n_past, n_past + n) of every sequence from the mirror into the host pages:
// whole pages (runs of consecutive ones in one copy) where every position is new, else the
// new slots of each (layer, K|V, kv head) row with one 2-D copy (and one for i8 scales).
void cuda_runner::write_back(std::span<const batch_seq> batch, kv_cache& kv, const uint8_t* mirror) {
    const kv_layout& lay = kv.layout();
    const int64_t pb = lay.page_bytes(), ps = lay.page_size;
    const int64_t row_bytes = int64_t(lay.head_dim) * lay.elem_bytes(); // one position of one head
    const size_t n_rows = size_t(lay.n_layer) * 2 * size_t(lay.n_head_kv);
    const auto st = static_cast<cudaStream_t>(ctx_.stream());
    stats_.handoff_bytes = 0;
    for (size_t i = 0; i < batch.size(); ++i) {
        const auto& s = batch[i];
        const int64_t p_begin = s.n_past, p_end = s.n_past + int64_t(s.tokens.size());
        for (int64_t j = p_begin / ps; j * ps < p_end;) {
            const int64_t s0 = std::max(p_begin, j * ps) - j * ps, s1 = std::min(p_end, (j + 1) * ps) - j * ps;
            const uint8_t* src = mirror + (slot0_[i] + j) * pb;
            uint8_t* dst = kv.base() + int64_t(s.block_table[size_t(j)]) * pb;
            if (s0 == 0 && s1 == ps) {
                int64_t run = 1;
                while ((j + run + 1) * ps <= p_end &&
                       s.block_table[size_t(j + run)] == s.block_table[size_t(j)] + run)
                    ++run;
                CUDA_CHECK(cudaMemcpyAsync(dst, src, size_t(run * pb), cudaMemcpyDeviceToHost, st));
                stats_.handoff_bytes += run * pb;
                j += run;
                continue;
            }
            const int64_t pitch = ps * row_bytes, width = (s1 - s0) * row_bytes;
            CUDA_CHECK(cudaMemcpy2DAsync(dst + s0 * row_bytes, size_t(pitch), src + s0 * row_bytes, size_t(pitch),
                                         size_t(width), n_rows, cudaMemcpyDeviceToHost, st));
            stats_.handoff_bytes += width * int64_t(n_rows);
            if (lay.dtype == kv_dtype::i8) {
                const int64_t sb = lay.scales_begin();
                CUDA_CHECK(cudaMemcpy2DAsync(dst + sb + s0 * 4, size_t(ps * 4), src + sb + s0 * 4, size_t(ps * 4),
                                             size_t((s1 - s0) * 4), n_rows, cudaMemcpyDeviceToHost, st));
                stats_.handoff_bytes += (s1 - s0) * 4 * int64_t(n_rows);
            }
            ++j;
        }
    }
}

void cuda_runner::forward(std::span<const batch_seq> batch, kv_cache& kv, float* logits) {
    const auto t_start = std::chrono::steady_clock::now();
    const kv_layout& lay = kv.layout();
    TANDEM_CHECK(lay.n_layer == cfg_.n_layer && lay.n_head_kv == cfg_.n_head_kv && lay.head_dim == cfg_.head_dim,
                 "KV pages of {} layers x {} heads x {} dims do not fit the model", lay.n_layer, lay.n_head_kv,
                 lay.head_dim);
    // Host side: flat tokens and positions, each sequence's pages mapped to consecutive mirror slots.
    h_tokens_.clear(); h_pos_.clear(); h_tables_.clear(); h_rows_.clear(); slot0_.clear();
    for (const auto& s : batch) {
        TANDEM_ASSERT(!s.tokens.empty(), "a sequence in a batch needs at least one new token");
        const int64_t n_end = s.n_past + int64_t(s.tokens.size());
        const int64_t n_pages = pages_for(n_end, lay.page_size);
        TANDEM_ASSERT(int64_t(s.block_table.size()) >= n_pages, "{} pages cannot hold {} positions",
                      s.block_table.size(), n_end);
        slot0_.push_back(int32_t(h_tables_.size()));
        for (int64_t j = 0; j < n_pages; ++j) {
            const int32_t pg = s.block_table[size_t(j)];
            TANDEM_ASSERT(pg >= 0 && pg < kv.n_pages(), "page {} outside the pool of {}", pg, kv.n_pages());
            h_tables_.push_back(int32_t(h_tables_.size()));
        }
        for (size_t i = 0; i < s.tokens.size(); ++i) {
            TANDEM_CHECK(s.tokens[i] >= 0 && s.tokens[i] < cfg_.n_vocab,
                         "token id {} is outside the vocabulary [0, {})", s.tokens[i], cfg_.n_vocab);
            h_tokens_.push_back(s.tokens[i]);
            h_pos_.push_back(s.n_past + int32_t(i));
        }
        h_rows_.push_back(int32_t(h_tokens_.size()) - 1);
    }
    const int64_t n_tok = int64_t(h_tokens_.size()), n_seq = int64_t(batch.size());
    if (n_tok == 0) return;
    const int64_t e = cfg_.n_embd, n_kv = cfg_.n_embd_kv(), ff = cfg_.n_ff, pb = lay.page_bytes();
    const cuda::context& c = ctx_;
    c.make_current();

    // The device mirror: zeroed when (re)allocated so padding never carries stale bytes home.
    const int64_t n_slots = int64_t(h_tables_.size());
    if (n_slots > mirror_pages_) {
        mirror_pages_ = std::max(n_slots, mirror_pages_ * 3 / 2);
        mirror_.b = cuda::buffer();
        mirror_.b = cuda::buffer(c, size_t(mirror_pages_ * pb));
        CUDA_CHECK(cudaMemsetAsync(mirror_.b.get(), 0, mirror_.b.bytes(), static_cast<cudaStream_t>(c.stream())));
    }
    uint8_t* mirror = mirror_.b.as<uint8_t>();
    upload_past_pages(batch, kv, mirror);

    int32_t* d_tokens = tokens_.get<int32_t>(c, size_t(n_tok));
    int32_t* d_pos = pos_.get<int32_t>(c, size_t(n_tok));
    int32_t* d_tables = tables_.get<int32_t>(c, size_t(n_slots));
    int32_t* d_rows = rows_.get<int32_t>(c, size_t(n_seq));
    c.upload(d_tokens, h_tokens_.data(), size_t(n_tok) * 4);
    c.upload(d_pos, h_pos_.data(), size_t(n_tok) * 4);
    c.upload(d_tables, h_tables_.data(), size_t(n_slots) * 4);
    c.upload(d_rows, h_rows_.data(), size_t(n_seq) * 4);

    float* x = x_.get<float>(c, size_t(n_tok * e));
    float* q = q_.get<float>(c, size_t(n_tok * e));
    float* k = k_.get<float>(c, size_t(n_tok * n_kv));
    float* v = v_.get<float>(c, size_t(n_tok * n_kv));
    float* attn = attn_.get<float>(c, size_t(n_tok * e));
    float* proj = proj_.get<float>(c, size_t(2 * n_tok * e));
    float* gate = gate_.get<float>(c, size_t(n_tok * ff));
    float* up = up_.get<float>(c, size_t(n_tok * ff));
    // 16-byte aligned rows for cuBLASLt: the lo term starts at n_tok * max(e, ff), rounded up.
    const int64_t xq_half = (n_tok * std::max(e, ff) + 15) / 16 * 16;
    int8_t* xq = xq_.get<int8_t>(c, size_t(2 * xq_half));
    float* xs = xs_.get<float>(c, size_t(2 * n_tok));

    cuda::embed(c, x, d_tokens, n_tok, w_.tok_embd.q(), w_.tok_embd.scale(), w_.tok_embd.f32(), e);
    const float scale = 1.0f / std::sqrt(float(cfg_.head_dim));
    const bool neox = cfg_.rope == rope_style::neox;
    auto mm = [&](float* out, const int8_t* aq, const float* as, int64_t rows, const cuda::device_weight& w,
                  const cuda::device_weight* bias) {
        cuda::matmul_i8(c, out, aq, as, rows, w.q(), w.scale(), w.n_out(), w.n_in(), bias ? bias->f32() : nullptr);
    };
    for (int il = 0; il < cfg_.n_layer; ++il) {
        const cuda::device_layer& l = w_.layers[size_t(il)];
        cuda::rms_norm_quant(c, xq, xs, x, l.attn_norm.f32(), n_tok, e, cfg_.rms_eps);
        mm(q, xq, xs, n_tok, l.wq, &l.bq);
        mm(k, xq, xs, n_tok, l.wk, &l.bk);
        mm(v, xq, xs, n_tok, l.wv, &l.bv);
        cuda::rope(c, q, d_pos, n_tok, cfg_.n_head, cfg_.head_dim, cfg_.n_rot, cfg_.rope_freq_base,
                   cfg_.rope_freq_scale, neox);
        cuda::rope(c, k, d_pos, n_tok, cfg_.n_head_kv, cfg_.head_dim, cfg_.n_rot, cfg_.rope_freq_base,
                   cfg_.rope_freq_scale, neox);
        int64_t t = 0;
        for (size_t i = 0; i < batch.size(); ++i) {
            const auto& s = batch[i];
            const int64_t n = int64_t(s.tokens.size());
            cuda::kv_store(c, mirror, lay, il, d_tables + slot0_[i], s.n_past, k + t * n_kv, v + t * n_kv, n);
            cuda::attention(c, attn + t * e, q + t * e, n, s.n_past, cfg_.n_head, mirror, lay, il,
                            d_tables + slot0_[i], scale);
            t += n;
        }
        cuda::quantize_rows(c, xq, xs, attn, n_tok, e);
        mm(proj, xq, xs, n_tok, l.wo, nullptr);
        cuda::add(c, x, proj, n_tok * e);

        cuda::rms_norm_quant(c, xq, xs, x, l.ffn_norm.f32(), n_tok, e, cfg_.rms_eps);
        mm(gate, xq, xs, n_tok, l.w_gate, nullptr);
        mm(up, xq, xs, n_tok, l.w_up, nullptr);
        // The down projection's input as two int8 terms, run as 2 * n_tok rows (model.cpp).
        cuda::swiglu(c, gate, gate, up, n_tok * ff);
        cuda::quantize_rows_split(c, xq, xs, xq + xq_half, xs + n_tok, gate, n_tok, ff);
        if (xq_half == n_tok * ff) {
            mm(proj, xq, xs, 2 * n_tok, l.w_down, nullptr);
        } else { // the two terms are not adjacent rows: two matmuls
            mm(proj, xq, xs, n_tok, l.w_down, nullptr);
            mm(proj + n_tok * e, xq + xq_half, xs + n_tok, n_tok, l.w_down, nullptr);
        }
        cuda::add(c, proj, proj + n_tok * e, n_tok * e);
        cuda::add(c, x, proj, n_tok * e);
    }

    // Logits of each sequence's last token, as model.cpp computes them: the normed rows as two
    // int8 terms (hi, then its rounding error), run as 2 * n_seq adjacent rows and summed.
    const int64_t n_voc = cfg_.n_vocab;
    float* last = last_.get<float>(c, size_t(n_seq * e));
    float* xn = xn_.get<float>(c, size_t(n_seq * e));
    float* d_logits = logits_.get<float>(c, size_t(2 * n_seq * n_voc));
    cuda::gather_rows(c, last, x, d_rows, n_seq, e);
    cuda::rms_norm(c, xn, last, w_.output_norm.f32(), n_seq, e, cfg_.rms_eps);
    cuda::quantize_rows_split(c, xq, xs, xq + n_seq * e, xs + n_seq, xn, n_seq, e);
    mm(d_logits, xq, xs, 2 * n_seq, w_.logits_weight(), nullptr);
    cuda::add(c, d_logits, d_logits + n_seq * n_voc, n_seq * n_voc);

    const auto st = static_cast<cudaStream_t>(c.stream());
    CUDA_CHECK(cudaEventRecord(ev_[0], st));
    write_back(batch, kv, mirror);
    CUDA_CHECK(cudaEventRecord(ev_[1], st));
    c.download(logits, d_logits, size_t(n_seq * n_voc) * sizeof(float));
    c.synchronize();
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, ev_[0], ev_[1]));
    stats_.handoff_s = ms / 1e3;
    stats_.forward_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
}

} // namespace

std::unique_ptr<runner> make_cuda_runner(model& mdl, int device) {
    std::string why;
    const auto devs = cuda::list_devices(&why);
    TANDEM_CHECK(device >= 0 && device < int(devs.size()), "no CUDA device {} ({} found{}{})", device, devs.size(),
                 why.empty() ? "" : ": ", why);
    return std::make_unique<cuda_runner>(mdl, device);
}

namespace cuda {

const forward_stats* stats_of(const runner& r) {
    const auto* cr = dynamic_cast<const cuda_runner*>(&r);
    return cr ? &cr->stats() : nullptr;
}

} // namespace cuda
} // namespace tandem
