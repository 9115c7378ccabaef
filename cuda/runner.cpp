// The CUDA runner: weights uploaded once; per batch the past K/V the device lacks goes to its
// device pages (page_mirror decides which), model::forward runs on the stream, the new K/V
// and the logits come back to host memory. Page placement and the hand-off are all it adds.
#include "cuda/runner.hpp"

#include "cuda/check.hpp"
#include "cuda/device.hpp"
#include "cuda/weights.hpp"
#include "runtime/page_mirror.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
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
        : mdl_(mdl), opts_(opts), ctx_(device), w_(ctx_, checked(mdl).weights()),
          scratch_([this](size_t bytes) {
              auto b = std::make_shared<cuda::buffer>(ctx_, bytes);
              return std::shared_ptr<void>(b, b->get());
          }) {
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
        bool lowbit = w.logits_weight().is_lowbit();
        for (const auto& l : w.layers)
            for (const weight* x : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) lowbit |= x->is_lowbit();
        TANDEM_CHECK(!lowbit, "the CUDA runner has no kernels for low-bit weights (Q4_0 .. IQ4_XS kept at their width): "
                              "load the model with weight_format::int8 (`--weights int8`)");
        TANDEM_CHECK(!w.layers.empty() && w.layers[0].wq.is_i8() && w.logits_weight().is_i8(),
                     "the CUDA runner needs INT8 weights (load the model with weight_format::int8)");
        return m;
    }

    void place_pages(const batch& b, const kv_cache& kv);
    // The forward once place_pages has planned the batch's pages.
    void forward_placed(const batch& b, kv_cache& kv, float* logits, std::chrono::steady_clock::time_point t_start);
    int64_t copy_pages(std::span<const page_copy> copies, kv_cache& kv, bool to_device);

    const model& mdl_;
    cuda_runner_options opts_;
    cuda::context ctx_;
    cuda::device_model_weights w_;
    std::string name_;
    cudaEvent_t ev_[2] = {nullptr, nullptr};
    cuda::forward_stats stats_;
    scratch_arena scratch_; // the forward's activations (device memory)
    grow_buffer logits_;    // the logits on the device, until they are downloaded

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
    // The pages are checked by page_mirror::prepare, the tokens and the layout by model::forward.
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
    const cuda::context& c = ctx_;
    stats_.upload_bytes = copy_pages(plan_.uploads, kv, true);
    {
        const int64_t slot_bytes = int64_t(lay.n_layer) * 2 * lay.n_head_kv *
                                   (int64_t(lay.head_dim) * lay.elem_bytes() + (lay.dtype == kv_dtype::i8 ? 4 : 0));
        stats_.kept_bytes = plan_.n_kept_slots * slot_bytes;
        stats_.mirror_pages = pages_.capacity();
        stats_.total_upload_bytes += stats_.upload_bytes;
        stats_.total_kept_bytes += stats_.kept_bytes;
    }

    // The one forward, over the device pages the plan maps the batch's pages to.
    const int64_t n_logits = int64_t(b.n_logits()) * mdl_.config().n_vocab;
    float* d_logits = logits_.get<float>(c, size_t(n_logits));
    exec_ctx ex{backend::cuda, nullptr, &ctx_};
    ex.scratch = &scratch_;
    const forward_pages pages{lay, mirror_.as<uint8_t>(), pages_.capacity(), plan_.tables, plan_.table_begin};
    mdl_.forward(ex, w_.view(), b, pages, d_logits);

    const auto st = static_cast<cudaStream_t>(c.stream());
    CUDA_CHECK(cudaEventRecord(ev_[0], st));
    stats_.handoff_bytes = copy_pages(plan_.writes, kv, false);
    CUDA_CHECK(cudaEventRecord(ev_[1], st));
    if (n_logits > 0) c.download(logits, d_logits, size_t(n_logits) * sizeof(float));
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
