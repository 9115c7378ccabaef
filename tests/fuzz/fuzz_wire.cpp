// libFuzzer target for the worker channel's messages, as a corrupt or hostile peer would write
// them: the first byte picks the decoder (hello, run, done), the rest is its payload. A
// decoder must refuse or accept without reading past its input; what it accepts must encode
// back to the same bytes (the encoding is canonical), and an accepted batch must survive
// batch::check at any pool shape.
#include "ipc/wire.hpp"
#include "runtime/error.hpp"

#include <cstdint>
#include <cstdlib>
#include <span>
#include <vector>

namespace {

template <class Msg>
void round_trip(const std::optional<Msg>& m, std::span<const uint8_t> in) {
    if (!m) return;
    std::vector<uint8_t> out;
    tandem::ipc::encode(*m, out);
    if (out.size() != in.size() || !std::equal(out.begin(), out.end(), in.begin())) std::abort();
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size == 0) return 0;
    const std::span<const uint8_t> in(data + 1, size - 1);
    switch (data[0] % 3) {
    case 0: round_trip(tandem::ipc::decode_hello(in), in); break;
    case 1: {
        const auto m = tandem::ipc::decode_run(in);
        round_trip(m, in);
        if (m) {
            std::vector<uint8_t> direct;
            tandem::ipc::encode_run(m->batch_id, m->b, direct);
            if (direct.size() != in.size()) std::abort();
            (void)m->b.check(16, 64, 512); // a refusal is a message, never a crash
            (void)m->b.check(1, 1 << 20, 32000);
        }
        break;
    }
    default: round_trip(tandem::ipc::decode_done(in), in); break;
    }
    return 0;
}
