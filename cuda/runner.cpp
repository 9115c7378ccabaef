// The CUDA runner: weights uploaded once; per batch the past K/V the device lacks goes to its
// device pages (page_mirror decides which), the forward runs on the stream, the new K/V and
// the logits come back to host memory.
#include "cuda/runner.hpp"

#include "cuda/check.hpp"
#include "cuda/device.hpp"
#include "cuda/ops/ops.hpp"
#include "cuda/weights.hpp"
#include "runtime/page_mirror.hpp"

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
    cuda_runner(const model& mdl, int device, const cuda_runner_options& opts)
        : cfg_(mdl.config()), opts_(opts), ctx_(device), w_(ctx_, checked(mdl).weights()) {
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
        return fmt::format("cuda:{} {} ({} MiB of weights{})", ctx_.device(), name_, w_.bytes() >> 20,
                           opts_.keep_pages ? ", KV pages kept on the device" : "");
    }

    void forward(const batch& b, kv_cache& kv, float* logits) override;

    const cuda::forward_stats& stats() const { return stats_; }

private:
    static const model& checked(const model& m) {
        const auto& w = m.weights();
        TANDEM_CHECK(!w.layers.empty() && w.layers[0].wq.is_i8() && w.logits_weight().is_i8(),
                     "the CUDA runner needs INT8 weights (load the model with weight_format::int8)");
        return m;
    }

    void place_pages(const batch& b, const kv_cache& kv);
    // The forward once place_pages has planned the batch's pages.
    void forward_placed(const batch& b, kv_cache& kv, float* logits, std::chrono::steady_clock::time_point t_start);
    int64_t copy_pages(std::span<const page_copy> copies, kv_cache& kv, bool to_device);

    model_config cfg_;
    cuda_runner_options opts_;
    cuda::context ctx_;
    cuda::device_model_weights w_;
    std::string name_;
    cudaEvent_t ev_[2] = {nullptr, nullptr};
    cuda::forward_stats stats_;

    // host staging for one batch
    std::vector<int32_t> h_rows_;        // the tokens whose logits are wanted
    std::vector<cuda::attn_seg> h_segs_; // each sequence's rows, positions and table, for attention
    // device scratch
    grow_buffer tokens_, pos_, tables_, rows_;
    grow_buffer x_, q_, k_, v_, attn_, proj_, gate_, up_, last_, xn_, xq_, xs_, logits_;

    // Device pages for host pages: which host page each holds and how much of it is valid
    // (pages_), the memory (mirror_, pages_.capacity() pages of the pool's layout), the pool
    // it mirrors, and the current batch's copies and device block tables (plan_).
    page_mirror pages_;
    cuda::buffer mirror_;
    mirror_plan plan_;
    const uint8_t* pool_base_ = nullptr;
    kv_layout pool_layout_;
    int32_t pool_pages_ = 0;
};

bool same_layout(const kv_layout& a, const kv_layout& b) {
    return a.n_layer == b.n_layer && a.n_head_kv == b.n_head_kv && a.head_dim == b.head_dim &&
           a.page_size == b.page_size && a.dtype == b.dtype;
}

// Maps the batch's pages to device pages, (re)allocating them when the batch touches more
// than they hold; fills plan_. With keep_pages the device pages persist across forwards
// (sized once from the pool and free memory), else they are scratch forgotten every forward
// (sized to the largest batch so far, as before the mirror existed).
void cuda_runner::place_pages(const batch& b, const kv_cache& kv) {
    const kv_layout& lay = kv.layout();
    const int64_t pb = lay.page_bytes();
    if (kv.base() != pool_base_ || kv.n_pages() != pool_pages_ || !same_layout(lay, pool_layout_)) {
        // Another pool: nothing held is about it (page numbers and generations are per pool).
        pool_base_ = kv.base();
        pool_pages_ = kv.n_pages();
        pool_layout_ = lay;
        mirror_ = cuda::buffer();
        pages_.reset(0, kv.n_pages(), lay.page_size);
    }
    if (!opts_.keep_pages) pages_.forget();
    if (pages_.prepare(b, plan_)) return;

    // More pages than there are device pages: new ones, dropping what the old ones held
    // (the mirror has no pages until the allocation succeeds).
    int64_t cap = std::max<int64_t>(plan_.n_pages, int64_t(pages_.capacity()) * 3 / 2);
    mirror_ = cuda::buffer();
    pages_.reset(0, kv.n_pages(), lay.page_size);
    if (opts_.keep_pages) {
        int64_t budget = opts_.mirror_bytes;
        if (budget <= 0) {
            ctx_.synchronize(); // the old pages' memory is free once the stream has run
            size_t free_b = 0, total_b = 0;
            CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
            const int64_t reserve = std::max<int64_t>(int64_t(1) << 30, int64_t(total_b) / 8);
            budget = int64_t(free_b) - reserve;
        }
        cap = std::max(cap, budget / pb);
    }
    cap = std::min<int64_t>(cap, kv.n_pages());
    mirror_ = cuda::buffer(ctx_, size_t(cap * pb));
    // Zeroed, so padding and positions never written carry no stale bytes to the host pages.
    CUDA_CHECK(cudaMemsetAsync(mirror_.get(), 0, mirror_.bytes(), static_cast<cudaStream_t>(ctx_.stream())));
    pages_.reset(int32_t(cap), kv.n_pages(), lay.page_size);
    const bool placed = pages_.prepare(b, plan_);
    TANDEM_ASSERT(placed, "{} device pages for a batch of {} pages", cap, plan_.n_pages);
}

// Issues the copies of a plan on the stream: whole pages (runs of them) in one copy, else
// the positions [slot_begin, slot_end) of each (layer, K|V, kv head) row with one 2-D copy
// (and one for i8 scales). Returns the bytes copied.
int64_t cuda_runner::copy_pages(std::span<const page_copy> copies, kv_cache& kv, bool to_device) {
    const kv_layout& lay = kv.layout();
    const int64_t pb = lay.page_bytes(), ps = lay.page_size;
    const int64_t row_bytes = int64_t(lay.head_dim) * lay.elem_bytes(); // one position of one head
    const size_t n_rows = size_t(lay.n_layer) * 2 * size_t(lay.n_head_kv);
    const auto st = static_cast<cudaStream_t>(ctx_.stream());
    const auto kind = to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost;
    int64_t bytes = 0;
    for (const page_copy& c : copies) {
        uint8_t* host = kv.base() + int64_t(c.host_page) * pb;
        uint8_t* dev = mirror_.as<uint8_t>() + int64_t(c.dev_page) * pb;
        uint8_t* dst = to_device ? dev : host;
        const uint8_t* src = to_device ? host : dev;
        if (c.whole) {
            CUDA_CHECK(cudaMemcpyAsync(dst, src, size_t(c.n_pages * pb), kind, st));
            bytes += c.n_pages * pb;
            continue;
        }
        const int64_t s0 = c.slot_begin, s1 = c.slot_end;
        const int64_t pitch = ps * row_bytes, width = (s1 - s0) * row_bytes;
        CUDA_CHECK(cudaMemcpy2DAsync(dst + s0 * row_bytes, size_t(pitch), src + s0 * row_bytes, size_t(pitch),
                                     size_t(width), n_rows, kind, st));
        bytes += width * int64_t(n_rows);
        if (lay.dtype == kv_dtype::i8) {
            const int64_t sb = lay.scales_begin();
            CUDA_CHECK(cudaMemcpy2DAsync(dst + sb + s0 * 4, size_t(ps * 4), src + sb + s0 * 4, size_t(ps * 4),
                                         size_t((s1 - s0) * 4), n_rows, kind, st));
            bytes += (s1 - s0) * 4 * int64_t(n_rows);
        }
    }
    return bytes;
}

void cuda_runner::forward(const batch& b, kv_cache& kv, float* logits) {
    const auto t_start = std::chrono::steady_clock::now();
    const kv_layout& lay = kv.layout();
    TANDEM_CHECK(lay.n_layer == cfg_.n_layer && lay.n_head_kv == cfg_.n_head_kv && lay.head_dim == cfg_.head_dim,
                 "KV pages of {} layers x {} heads x {} dims do not fit the model", lay.n_layer, lay.n_head_kv,
                 lay.head_dim);
    // Host side: the tokens are checked here, the pages by page_mirror::prepare.
    h_rows_.clear();
    for (int32_t t = 0; t < b.n_tokens(); ++t) {
        TANDEM_CHECK(b.tokens[size_t(t)] >= 0 && b.tokens[size_t(t)] < cfg_.n_vocab,
                     "token id {} is outside the vocabulary [0, {})", b.tokens[size_t(t)], cfg_.n_vocab);
        if (b.wants_logits[size_t(t)]) h_rows_.push_back(t);
    }
    if (b.empty()) return;
    ctx_.make_current();
    place_pages(b, kv);
    try {
        forward_placed(b, kv, logits, t_start);
    } catch (...) {
        pages_.forget(); // what the device pages hold after a failure is unknown
        throw;
    }
}

void cuda_runner::forward_placed(const batch& b, kv_cache& kv, float* logits,
                                 std::chrono::steady_clock::time_point t_start) {
    const kv_layout& lay = kv.layout();
    const int64_t n_tok = b.n_tokens(), n_seq = b.n_seqs(), n_rows = b.n_logits();
    const int64_t e = cfg_.n_embd, n_kv = cfg_.n_embd_kv(), ff = cfg_.n_ff;
    const cuda::context& c = ctx_;
    uint8_t* mirror = mirror_.as<uint8_t>();
    const std::vector<int32_t>& slot0 = plan_.table_begin;
    stats_.upload_bytes = copy_pages(plan_.uploads, kv, true);
    {
        const int64_t slot_bytes = int64_t(lay.n_layer) * 2 * lay.n_head_kv *
                                   (int64_t(lay.head_dim) * lay.elem_bytes() + (lay.dtype == kv_dtype::i8 ? 4 : 0));
        stats_.kept_bytes = plan_.n_kept_slots * slot_bytes;
        stats_.mirror_pages = pages_.capacity();
        stats_.total_upload_bytes += stats_.upload_bytes;
        stats_.total_kept_bytes += stats_.kept_bytes;
    }

    int32_t* d_tokens = tokens_.get<int32_t>(c, size_t(n_tok));
    int32_t* d_pos = pos_.get<int32_t>(c, size_t(n_tok));
    const int64_t n_slots = int64_t(plan_.tables.size());
    int32_t* d_tables = tables_.get<int32_t>(c, size_t(n_slots));
    int32_t* d_rows = rows_.get<int32_t>(c, size_t(n_rows));
    c.upload(d_tokens, b.tokens.data(), size_t(n_tok) * 4);
    c.upload(d_pos, b.pos.data(), size_t(n_tok) * 4);
    c.upload(d_tables, plan_.tables.data(), size_t(n_slots) * 4);
    if (n_rows > 0) c.upload(d_rows, h_rows_.data(), size_t(n_rows) * 4);
    h_segs_.clear();
    for (int32_t i = 0; i < n_seq; ++i)
        h_segs_.push_back({b.tok_begin[size_t(i)], b.n_new(i), b.n_past(i), slot0[size_t(i)]});

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
        // Every sequence of the batch, prefill chunks and decode tokens alike, in one launch each.
        cuda::kv_store(c, mirror, lay, il, h_segs_.data(), n_seq, d_tables, k, v);
        cuda::attention(c, attn, q, h_segs_.data(), n_seq, cfg_.n_head, mirror, lay, il, d_tables, scale);
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

    // Logits of the tokens that want them, as model.cpp computes them: the normed rows as two
    // int8 terms (hi, then its rounding error), run as 2 * n_rows adjacent rows and summed.
    const int64_t n_voc = cfg_.n_vocab;
    float* d_logits = logits_.get<float>(c, size_t(std::max<int64_t>(1, 2 * n_rows * n_voc)));
    if (n_rows > 0) {
        float* last = last_.get<float>(c, size_t(n_rows * e));
        float* xn = xn_.get<float>(c, size_t(n_rows * e));
        cuda::gather_rows(c, last, x, d_rows, n_rows, e);
        cuda::rms_norm(c, xn, last, w_.output_norm.f32(), n_rows, e, cfg_.rms_eps);
        cuda::quantize_rows_split(c, xq, xs, xq + n_rows * e, xs + n_rows, xn, n_rows, e);
        mm(d_logits, xq, xs, 2 * n_rows, w_.logits_weight(), nullptr);
        cuda::add(c, d_logits, d_logits + n_rows * n_voc, n_rows * n_voc);
    }

    const auto st = static_cast<cudaStream_t>(c.stream());
    CUDA_CHECK(cudaEventRecord(ev_[0], st));
    stats_.handoff_bytes = copy_pages(plan_.writes, kv, false);
    CUDA_CHECK(cudaEventRecord(ev_[1], st));
    if (n_rows > 0) c.download(logits, d_logits, size_t(n_rows * n_voc) * sizeof(float));
    c.synchronize();
    pages_.commit(); // the new positions are in the device pages too
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, ev_[0], ev_[1]));
    stats_.handoff_s = ms / 1e3;
    stats_.forward_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
}

} // namespace

std::unique_ptr<runner> make_cuda_runner(model& mdl, int device, const cuda_runner_options& opts) {
    std::string why;
    const auto devs = cuda::list_devices(&why);
    TANDEM_CHECK(device >= 0 && device < int(devs.size()), "no CUDA device {} ({} found{}{})", device, devs.size(),
                 why.empty() ? "" : ": ", why);
    return std::make_unique<cuda_runner>(mdl, device, opts);
}

namespace cuda {

const forward_stats* stats_of(const runner& r) {
    const auto* cr = dynamic_cast<const cuda_runner*>(&r);
    return cr ? &cr->stats() : nullptr;
}

} // namespace cuda
} // namespace tandem
